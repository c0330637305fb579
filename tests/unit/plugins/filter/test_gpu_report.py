"""The gpus_free report lines (filter gpu_report): pure function over a gpu_reclaim result."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.reclaim.plugins.filter.gpu_report import gpu_report
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text

ROW = {"index": 2, "memory_used_mib": 76000, "memory_total_mib": 81920, "free": False, "holders": [194909],
       "uuid": "GPU-x", "handles": []}
RESULT = {
    "changed": True, "elapsed_s": 0.21,
    "before": [ROW], "after": [dict(ROW, memory_used_mib=0, free=True, holders=[])],
    "holders": [{"pid": 194909, "name": "sglang::schedul", "cmdline": "sglang::scheduler_TP2", "unit": None,
                 "protected": False}],
    "actions": [{"at_s": 0.012, "step": "sigterm", "pid": 194909, "name": "sglang::schedul",
                 "result": "exited after SIGTERM in 0.12 s"}],
    "remaining": [],
}


def test_report_says_before_after_holder_by_name_and_what_each_action_did():
    lines = gpu_report(RESULT)
    assert lines[0] == "== GPUs reclaimed in 0.21 s =="
    assert lines[1] == "GPU 2: 76000/81920 MiB -> 0 MiB free  holders: 194909(sglang::scheduler_TP2)"
    # The line the demo's log parser reads: time, step, target, name, result.
    assert lines[2] == "    0.01s sigterm 194909 sglang::schedul: exited after SIGTERM in 0.12 s"


def test_report_of_free_gpus_and_of_a_plan():
    free = dict(RESULT, before=[dict(ROW, free=True, holders=[], memory_used_mib=0)], actions=[])
    assert gpu_report(free, check_mode=True)[0] == "== GPUs already free, nothing to do =="
    plan = gpu_report(dict(RESULT, actions=[dict(RESULT["actions"][0], result="planned")]), check_mode=True)
    assert plan[0] == "== Reclaim plan (check mode, nothing signalled) =="
    assert plan[1].endswith("held  holders: 194909(sglang::scheduler_TP2)"), "check mode shows no after column"


def test_report_refuses_what_is_not_a_result():
    with pytest.raises(AnsibleFilterError, match="expected a gpu_reclaim result"):
        gpu_report(["GPU 2"])


def test_brief_report_of_a_result_that_did_nothing_is_one_line():
    free = dict(RESULT, before=[dict(ROW, free=True, holders=[], memory_used_mib=0)], actions=[], after=[])
    assert gpu_report(free, brief=True) == ["== GPUs already free, nothing to do: GPU 2 0/81920 MiB =="]
    assert gpu_report(dict(free, before=[]), brief=True)[0].startswith("== no GPU to free: every GPU is excluded")
    # A result that acted, or failed, keeps its whole table.
    assert len(gpu_report(RESULT, brief=True)) == 3
    assert len(gpu_report(dict(free, failed=True), brief=True)) == 2


# --- issue 22 item 6: a holder's title cannot forge a line of the table ----------------------------

FORGED = "GPU 3: 0/81920 MiB -> 0 MiB free"


def test_a_title_with_a_newline_and_an_esc_sequence_stays_on_its_line():
    # argv[0] chosen by a node's user: a newline, a forged GPU line, and ESC [2K (erase line) + CR.
    title = "worker\n" + FORGED + "\x1b[2K\rsshd"
    holder = dict(RESULT["holders"][0], name="worker\n\x1b[31m", cmdline=title, unit="a\x0ab.service")
    action = dict(RESULT["actions"][0], name="worker\n" + FORGED, result="exited\x1b]0;pwned\x07")
    lines = gpu_report(dict(RESULT, holders=[holder], actions=[action]))
    text = "\n".join(lines)
    assert len(lines) == 3, lines                       # title, one GPU, one action: nothing more
    assert not any(line.startswith(FORGED) for line in text.splitlines()), lines
    assert not any(ch in text for ch in "\x1b\r\x07"), lines
    assert lines[1] == "GPU 2: 76000/81920 MiB -> 0 MiB free  holders: 194909(%s)" % escape_text("worker\n\x1b[31m/a\nb.service")
    assert lines[2].endswith(escape_text("worker\n" + FORGED + ": exited\x1b]0;pwned\x07")), lines[2]
