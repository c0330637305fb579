"""The run summary's per-host record (action reclaim_summary): pure function over host variables."""
import json

from ansible_collections.gpuops.reclaim.plugins.action.reclaim_summary import host_record, host_report
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text

# The same gpu_reclaim result the report's tests read.
from ..filter.test_gpu_report import RESULT


def test_summary_record_of_a_freed_host_without_server():
    record = host_record({"gpus_free_result": RESULT})
    assert record["status"] == "ok" and record["changed"] is True and record["server"] is None
    assert record["gpus_before"] == [{"index": 2, "memory_used_mib": 76000, "memory_total_mib": 81920,
                                      "free": False, "holders": [194909]}]
    assert record["gpus_after"][0]["free"] is True
    assert record["actions"][0]["at_s"] == 0.012


def test_summary_record_of_a_failed_server_and_of_an_unreachable_host():
    failure = {"stage": "restart", "task": "Check the role's inputs", "msg": "bad input: port=70000"}
    record = host_record({"gpus_free_result": dict(RESULT, changed=False), "reclaim__failure": failure,
                          "inference_service_name": "sglang", "inference_service_flags": {"tp_size": 8},
                          "inference_service_info": {"max_total_num_tokens": 116000}})
    assert record["status"] == "failed" and record["failure"] == failure
    assert record["server"] == {"name": "sglang", "flags": {"tp_size": 8}, "max_total_num_tokens": 116000,
                                "state": None, "restart_reasons": [], "adoption": None, "container_adoption": None, "gpus_reclaim": None,
                                "strays_reclaim": None}
    assert record["changed"] is False
    assert host_record({})["status"] == "no result (unreachable)"


def test_summary_record_carries_the_server_state_the_role_published():
    state = {"state": "serving", "code": "restarted", "age_s": 12.6, "last_progress": None,
             "time_to_serve_s": 12.5, "ttft_s": 0.03}
    record = host_record({"gpus_free_result": RESULT, "inference_service_name": "sglang",
                          "inference_service_server": state})
    assert record["server"]["state"] == state


def test_summary_report_names_each_line_with_its_host():
    lines = host_report("gpu-a01", {"gpus_free_result": RESULT}, host_record({"gpus_free_result": RESULT}), False)
    assert lines[0] == "gpu-a01: == GPUs reclaimed in 0.21 s =="
    assert lines[1].startswith("gpu-a01: GPU 2: 76000/81920 MiB -> 0 MiB free")
    # The line the demo's log parser reads: host, time, step, target, name, result.
    assert lines[2] == "gpu-a01:     0.01s sigterm 194909 sglang::schedul: exited after SIGTERM in 0.12 s"


def test_summary_report_of_a_failed_reclaim_of_a_plan_and_of_an_unreachable_host():
    failed = dict(RESULT, failed=True, after=[])
    assert host_report("a", {"gpus_free_result": failed}, host_record({}), False)[0] == "a: == GPUs NOT freed in 0.21 s =="
    plan = host_report("b", {"gpus_free_result": RESULT}, host_record({}), True)
    assert plan[0] == "b: == Reclaim plan (check mode, nothing signalled) =="
    assert host_report("c", {}, host_record({}), False) == ["c: == no result (unreachable) =="]


def test_summary_report_of_a_host_with_nothing_to_do_is_one_line():
    row = {"index": 0, "memory_used_mib": 0, "memory_total_mib": 81920, "free": True, "holders": []}
    free = {"changed": False, "before": [row, dict(row, index=1, memory_used_mib=3)], "after": [], "actions": []}
    assert host_report("d", {"gpus_free_result": free}, host_record({}), True) == [
        "d: == GPUs already free, nothing to do: GPU 0 0/81920 MiB, GPU 1 3/81920 MiB =="]


def test_summary_report_of_a_server_host_shows_its_stray_reclaim_not_the_roles():
    strays = dict(RESULT, actions=[dict(RESULT["actions"][0], pid=4242)])
    lines = host_report("e", {"gpus_free_result": RESULT, "reclaim__strays_result": strays}, host_record({}), False)
    assert any("sigterm 4242 " in line for line in lines) and not any("sigterm 194909 " in line for line in lines)
    excluded = dict(RESULT, before=[], after=[], actions=[], changed=False)
    assert host_report("f", {"gpus_free_result": excluded}, host_record({}), False) == [
        "f: == no GPU to free: every GPU is excluded (an inference server's) or none was selected =="]


def test_summary_record_of_a_converged_server_host_keeps_both_reclaims_and_says_why_it_restarted():
    strays = dict(RESULT, actions=[dict(RESULT["actions"][0], pid=4242)])
    server_gpus = dict(RESULT, changed=False, actions=[])
    record = host_record({"reclaim__strays_result": strays, "gpus_free_result": server_gpus,
                          "inference_service_name": "sglang", "inference_service_flags": {"tp_size": 8},
                          "inference_service__reasons": ["flags or unit changed"]})
    assert [a["pid"] for a in record["actions"]] == [4242], "the top level is the stray reclaim (play 1)"
    assert record["server"]["gpus_reclaim"]["changed"] is False and record["server"]["gpus_reclaim"]["actions"] == []
    assert record["server"]["restart_reasons"] == ["flags or unit changed"]
    assert record["changed"] is True
    converged = host_record({"reclaim__strays_result": dict(strays, changed=False), "gpus_free_result": server_gpus,
                             "inference_service_name": "sglang", "inference_service__reasons": []})
    assert converged["changed"] is False


# What adopt.py printed (registered by the role as inference_service__adopted) after it moved
# a hand-started TP-2 server's orphaned ranks into a scope and stopped it.
ADOPTED = {"changed": True, "stdout": json.dumps({
    "scope": "sglang-adopted", "stopped": True, "seconds": 0.41, "skipped": [], "left": [], "error": None,
    "procs": [{"pid": 301, "name": "sglang::schedul", "cmdline": "sglang::scheduler_TP0", "root": True},
              {"pid": 302, "name": "sglang::schedul", "cmdline": "sglang::scheduler_TP1", "root": True}]})}
SERVER = {"inference_service_name": "sglang", "inference_service_flags": {"tp_size": 2},
          "inference_service_gpus": ["0", "1"]}
# Play 1 excluded both GPUs (the server's): it selected none and did nothing.
NO_STRAYS = {"changed": False, "before": [], "after": [], "actions": [], "elapsed_s": 0.003}


def test_an_adopting_run_records_each_process_adoption_ended_and_its_table_says_so():
    # The role's own reclaim found the GPUs free: adoption had ended the ranks already.
    server_gpus = dict(RESULT, changed=False, actions=[])
    host = dict(SERVER, reclaim__strays_result=NO_STRAYS, gpus_free_result=server_gpus,
                inference_service__adopted=ADOPTED, inference_service__reasons=["flags or unit changed"])
    record = host_record(host)
    adoption = record["server"]["adoption"]
    assert [(a["step"], a["pid"], a["unit"]) for a in adoption["actions"]] == [
        ("adopt_stop", 301, "sglang-adopted"), ("adopt_stop", 302, "sglang-adopted")]
    assert adoption["actions"][0]["result"] == "ended by the stop of sglang-adopted in 0.41 s"
    assert record["changed"] is True
    lines = host_report("g", host, record, False)
    assert not any("no GPU to free" in line for line in lines), lines
    assert lines[0] == "g: == no GPU outside sglang's (GPU 0,1) to free =="
    assert lines[1] == "g: == sglang: adopted a hand-started server, 2 process(es) ended by stopping sglang-adopted in 0.41 s =="
    assert lines[2] == "g:   adopt_stop PID 301 sglang::schedul: ended by the stop of sglang-adopted in 0.41 s"


def test_a_process_adoption_left_alive_is_not_called_ended():
    out = json.loads(ADOPTED["stdout"])
    out.update(left=[302], stopped=False)
    record = host_record(dict(SERVER, reclaim__strays_result=NO_STRAYS, gpus_free_result=None,
                              inference_service__adopted={"stdout": json.dumps(out)}))
    results = [a["result"] for a in record["server"]["adoption"]["actions"]]
    assert results[1] == "still alive after the stop of sglang-adopted (left to the GPU reclaim)"
    assert "1 process(es) ended" in host_report("h", dict(SERVER, reclaim__strays_result=NO_STRAYS), record, False)[1]


def test_a_run_refused_before_it_touched_anything_records_changed_false():
    # reclaim.yml empties gpus_free_result after keeping the stray reclaim; the role refused a
    # misspelled flag in its preflight, so it never reclaimed, adopted or restarted.
    failure = {"stage": "restart", "task": "Refuse flags the engine does not know", "msg": "... Nothing was changed."}
    host = dict(SERVER, reclaim__strays_result=NO_STRAYS, gpus_free_result=None, reclaim__failure=failure,
                inference_service__reasons=["flags or unit changed"],
                inference_service__adopted={"changed": False, "skipped": True})
    record = host_record(host)
    assert record["changed"] is False and record["status"] == "failed"
    assert record["server"]["gpus_reclaim"] is None and record["server"]["adoption"] is None
    # The same host in check mode is drift: its server needs a restart.
    assert host_record(host, check_mode=True)["changed"] is True


def test_strays_freed_beside_a_healthy_server_are_recorded_and_shown():
    beside = dict(RESULT, actions=[dict(RESULT["actions"][0], pid=5151)])
    host = dict(SERVER, reclaim__strays_result=NO_STRAYS, gpus_free_result=None, inference_service__reasons=[],
                inference_service__strays_freed=beside)
    record = host_record(host)
    assert [a["pid"] for a in record["server"]["strays_reclaim"]["actions"]] == [5151]
    assert record["changed"] is True and record["server"]["gpus_reclaim"] is None
    lines = host_report("i", host, record, False)
    assert "i: == Strays beside sglang in 0.21 s ==" in lines and any("sigterm 5151 " in line for line in lines)
    skipped = dict(host, inference_service__strays_freed={"changed": False, "skipped": True})
    assert host_record(skipped)["changed"] is False and host_record(skipped)["server"]["strays_reclaim"] is None


def test_a_hand_started_container_the_role_stopped_is_recorded_and_shown():
    cid = "e6cca3930084" + "0" * 52
    stopped = {"changed": True, "results": [
        {"item": {"runtime": "podman", "id": cid, "name": "sglang", "pids": [591, 602], "why": "..."},
         "rc": 0, "delta": "0:00:01.250000", "changed": True}]}
    host = dict(SERVER, reclaim__strays_result=NO_STRAYS, gpus_free_result=dict(RESULT, changed=False, actions=[]),
                inference_service__containers_stopped=stopped, inference_service__reasons=["flags or unit changed"])
    record = host_record(host)
    acts = record["server"]["container_adoption"]["actions"]
    assert [(a["step"], a["runtime"], a["container"], a["pids"], a["took_s"]) for a in acts] == [
        ("stop_container", "podman", cid, [591, 602], 1.25)]
    assert record["changed"] is True
    lines = host_report("n4", host, record, False)
    assert "n4: == sglang: adopted 1 hand-started container(s), stopped through their runtime ==" in lines
    assert ("n4:   stop_container podman sglang (e6cca3930084) PIDs 591,602: "
            "stopped through podman in 1.25 s, kept (never removed)") in lines


def test_no_container_stopped_records_none():
    skipped = {"results": [], "skipped": True}
    record = host_record(dict(SERVER, reclaim__strays_result=NO_STRAYS, gpus_free_result=None,
                              inference_service__containers_stopped=skipped))
    assert record["server"]["container_adoption"] is None


def test_summary_report_lines_hold_no_control_character_of_a_holders_title():
    holder = dict(RESULT["holders"][0], name="x\nGPU 3: 0 free", cmdline="x\nGPU 3: 0 free \x1b[2K")
    action = dict(RESULT["actions"][0], name="x\nGPU 3: 0 free")
    host = {"gpus_free_result": dict(RESULT, holders=[holder], actions=[action])}
    lines = host_report("node1", host, host_record(host), False)
    assert len(lines) == 3 and all(line.startswith("node1: ") for line in lines), lines
    assert not any(ch in "".join(lines) for ch in "\n\r\x1b"), lines
    shown = escape_text("x\nGPU 3: 0 free")
    assert shown in lines[1] and shown in lines[2], lines


def test_adopted_processes_that_ignored_sigterm_are_recorded_as_killed_at_once():
    out = json.loads(ADOPTED["stdout"])
    out.update(killed_at_once=[{"pid": 302, "at_s": 0.052}])
    host = dict(SERVER, reclaim__strays_result=NO_STRAYS, gpus_free_result=None,
                inference_service__adopted={"stdout": json.dumps(out)})
    actions = host_record(host)["server"]["adoption"]["actions"]
    assert [(a["step"], a["pid"]) for a in actions] == [("adopt_stop", 301), ("adopt_sigkill", 302)]
    assert actions[1]["result"] == "SIGKILL at once at 0.052 s (its SigIgn holds SIGTERM), in sglang-adopted"


def test_the_service_adopt_modules_result_is_recorded_as_adopt_py_s_was():
    # The role registers the service_adopt module's result itself (no stdout to parse).
    out = dict(json.loads(ADOPTED["stdout"]), changed=True, killed_at_once=[{"pid": 302, "at_s": 0.052}],
               actions=[{"step": "adopt_sigkill", "target": 302, "result": "sent", "changed": True, "at_s": 0.052}])
    host = dict(SERVER, reclaim__strays_result=NO_STRAYS, gpus_free_result=None, inference_service__adopted=out)
    adoption = host_record(host)["server"]["adoption"]
    assert [(a["step"], a["pid"], a["unit"]) for a in adoption["actions"]] == [
        ("adopt_stop", 301, "sglang-adopted"), ("adopt_sigkill", 302, "sglang-adopted")]
    assert adoption["actions"][1]["result"] == "SIGKILL at once at 0.052 s (its SigIgn holds SIGTERM), in sglang-adopted"
    assert adoption["scope"] == "sglang-adopted" and adoption["seconds"] == 0.41
