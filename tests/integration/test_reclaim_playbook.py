"""playbooks/reclaim.yml on two lab nodes: failures are recorded where they happen, the
rollout stops after a failed batch (check mode does not stop: it reports every host), and
every run leaves one summary file saying, per host, what was there, what was done and
what failed and why.

Both nodes ask for a server on GPU 0 with a port no server can have (70000), so the
inference_service role refuses it in its input checks, before touching anything; node2
also has an orphaned TP rank on GPU 3, which no server is assigned to.

The last test converges a real (stand-in) server through the playbook and reads the
summary as a drift check does: the stray reclaim and the server's own reclaim apart,
why the server was restarted, and `changed` false once nothing drifts.
"""

import json
import os
import shutil
import subprocess
import tempfile
import threading

import pytest

from . import scenarios as sc
from .conftest import REPO, VENV_BIN, ansible_env

PLAYBOOK = os.path.join(REPO, "playbooks", "reclaim.yml")
BAD_SERVER = {"inference_service_name": "sglang", "inference_service_gpus": ["0"],
              "inference_service_port": 70000, "inference_service_flags": {"tp_size": 1},
              "gpus_free_term_timeout": 2}


def playbook_dir(lab, vars_by_node):
    """A directory with the lab's inventory and host_vars/NODE.yml for each node given."""
    tmp = tempfile.mkdtemp(prefix="reclaim-play-")
    shutil.copy(lab.inventory, os.path.join(tmp, "inventory.ini"))
    os.mkdir(os.path.join(tmp, "host_vars"))
    for node, host_vars in vars_by_node.items():
        write_host_vars(tmp, node, host_vars)
    return tmp


def write_host_vars(tmp, node, host_vars):
    with open(os.path.join(tmp, "host_vars", node + ".yml"), "w") as f:
        json.dump(host_vars, f)


@pytest.fixture
def two_nodes(lab, clean_gpus):
    if len(lab.nodes) < 2:
        pytest.skip("needs LAB_NODES >= 2 (one batch fails, the next must be left out)")
    first, second = lab.nodes[0], lab.nodes[1]
    for name in (first, second):
        sc.cleanup(lab, name)
    tmp = playbook_dir(lab, {first: BAD_SERVER, second: BAD_SERVER})
    yield lab, first, second, tmp
    for name in (first, second):
        sc.cleanup(lab, name)
    shutil.rmtree(tmp, ignore_errors=True)


def run_playbook(tmp, nodes, *extra, at=()):
    """Run playbooks/reclaim.yml on `nodes`; returns (the run, the summary file's JSON).

    `at`: (text, act) pairs in the order the play meets them. Each `act()` runs once the play has
    printed a line holding its text (a task's banner), while the play goes on: what a test does
    to a node at a known step of the play, instead of after a guessed sleep. Every text must be
    met. The play is ended after 600 s, as `subprocess.run`'s timeout would."""
    summary = os.path.join(tmp, "summary.json")
    if os.path.exists(summary):
        os.unlink(summary)
    argv = [os.path.join(VENV_BIN, "ansible-playbook"), PLAYBOOK, "-i", os.path.join(tmp, "inventory.ini"),
            "-l", ",".join(nodes), "-e", "reclaim_serial=1", "-e", "reclaim_max_fail_percentage=0",
            "-e", "reclaim_summary_file=" + summary] + list(extra)
    if at:
        run = run_acting(argv, list(at))
    else:
        run = subprocess.run(argv, env=ansible_env(), capture_output=True, text=True, timeout=600, check=False)
    assert os.path.exists(summary), "no summary file (rc %d)\n%s%s" % (run.returncode, run.stdout, run.stderr)
    with open(summary) as f:
        return run, json.load(f)


def run_acting(argv, at):
    play = subprocess.Popen(argv, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(600, play.kill)
    watchdog.start()
    lines = []
    try:
        for line in play.stdout:
            lines.append(line)
            if at and at[0][0] in line:
                at.pop(0)[1]()
        play.wait()
    finally:
        watchdog.cancel()
        if play.poll() is None:
            play.kill()
            play.wait()
    out = "".join(lines)
    assert not at, "the play never printed %r\n%s" % (at[0][0], out)
    return subprocess.CompletedProcess(argv, play.returncode, out, "")


def orphan_on_gpu3(lab, node):
    record = sc.hold(lab, node, "orphan-parent", "--child", "3:20000:sglang::scheduler_TP3",
                     "--title", "python3 -m sglang.launch_server")
    sc.kill9_and_wait_reaped(lab, node, record["pid"])
    return record["processes"][0]


def test_check_mode_reports_every_host_and_changes_nothing(two_nodes):
    lab, first, second, tmp = two_nodes
    orphan = orphan_on_gpu3(lab, second)
    run, summary = run_playbook(tmp, [first, second], "--check", "--diff")
    out = run.stdout + run.stderr
    assert run.returncode == 2, out
    assert summary["check_mode"] is True
    # The first batch failed, yet the second host was still checked: both refusals are reported.
    for name in (first, second):
        host = summary["hosts"][name]
        assert host["status"] == "failed", host
        assert host["failure"]["stage"] == "restart" and "70000" in host["failure"]["msg"], host
    held = {g["index"]: g for g in summary["hosts"][second]["gpus_before"]}
    assert held[3]["free"] is False and orphan["pid"] in held[3]["holders"], held
    assert [a["step"] for a in summary["hosts"][second]["actions"]] and all(
        a["code"].startswith("would_") for a in summary["hosts"][second]["actions"] if a["changed"]), \
        summary["hosts"][second]
    assert sc.alive(lab, second, orphan["pid"], orphan["start_time"]), "check mode signalled the orphan"


def test_a_failed_batch_stops_the_rollout_and_the_summary_says_why(two_nodes):
    lab, first, second, tmp = two_nodes
    orphan = orphan_on_gpu3(lab, second)
    run, summary = run_playbook(tmp, [first, second])
    out = run.stdout + run.stderr
    assert run.returncode == 2, out
    assert summary["check_mode"] is False
    assert summary["hosts"][first]["status"] == "failed", summary["hosts"][first]
    assert "70000" in summary["hosts"][first]["failure"]["msg"]
    # The second host's server was never tried (left out after the failed batch), but the
    # orphan on GPU 3, which no server is assigned to, was freed in the first play.
    assert summary["hosts"][second]["status"] == "ok", summary["hosts"][second]
    assert summary["server_batches_with_failures"] == [[first]], summary
    after = {g["index"]: g for g in summary["hosts"][second]["gpus_after"]}
    assert after[3]["free"] is True, after
    assert 0 not in after, "GPU 0 is the server's: the stray play must leave it out (%s)" % after
    assert not sc.alive(lab, second, orphan["pid"], orphan["start_time"])
    assert summary["hosts"][second]["changed"] is True
    # Every host's table is printed once, by the summary task, each line naming its host.
    assert "%s: == GPUs reclaimed in " % second in out, out
    assert "%s: GPU 3: 20000/" % second in out and "%s: " % second + "GPU 0:" not in out, out
    assert "s sigterm %d " % orphan["pid"] in out, out
    assert "fatal: [%s]" % second not in out, out
    assert "fatal: [%s]" % first in out, out


# A one-GPU stand-in SGLang server (tests/fakeserve, installed on every lab node).
GOOD_SERVER = {"inference_service_name": "sglang", "inference_service_command": ["/usr/local/bin/fakeserve"],
               "inference_service_gpus": ["0"], "inference_service_host": "{{ ansible_host }}",
               "inference_service_port": 30000, "inference_service_env": {"FAKESERVE_LOAD_SECONDS": "1"},
               "inference_service_stop_timeout": 15, "inference_service_health_timeout": 60,
               "inference_service_health_delay": 1,
               "inference_service_flags": {"model_path": "/models/m", "tp_size": 1, "mem_fraction_static": 0.8},
               "gpus_free_term_timeout": 2}
SERVER_RESET = ("systemctl stop sglang 2>/dev/null; rm -f /etc/systemd/system/sglang.service /etc/gpuops/*; "
                "systemctl daemon-reload; true")


@pytest.fixture
def server_node(lab, clean_gpus):
    node = lab.nodes[0]
    sc.cleanup(lab, node)
    lab.exec(node, SERVER_RESET)
    tmp = playbook_dir(lab, {node: GOOD_SERVER})
    yield lab, node, tmp
    lab.exec(node, SERVER_RESET)
    sc.cleanup(lab, node)
    shutil.rmtree(tmp, ignore_errors=True)


def test_a_converged_server_host_records_both_reclaims_and_a_drift_check_reads_changed(server_node):
    lab, node, tmp = server_node
    orphan = orphan_on_gpu3(lab, node)
    run, summary = run_playbook(tmp, [node])
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    host = summary["hosts"][node]
    assert host["status"] == "ok" and host["changed"] is True, host
    # The top level is the stray reclaim of play 1: GPU 3 freed, the server's GPU 0 left out.
    assert [g["index"] for g in host["gpus_after"]] == [1, 2, 3, 4, 5, 6, 7], host["gpus_after"]
    assert ("sigterm", orphan["pid"]) in [(a["step"], a.get("pid")) for a in host["actions"]], host["actions"]
    # The server's own part: why it was started, and the role's reclaim of its GPU.
    server = host["server"]
    assert server["restart_reasons"] and "flags or unit changed" in server["restart_reasons"], server
    assert server["gpus_reclaim"] is not None and [g["index"] for g in server["gpus_reclaim"]["gpus_after"]] == [0]
    assert server["max_total_num_tokens"], server
    assert "%s: == GPUs reclaimed in " % node in out, out

    # Nothing drifted since: the check reports the host unchanged, the server converged.
    run, summary = run_playbook(tmp, [node], "--check", "--diff")
    host = summary["hosts"][node]
    assert run.returncode == 0, run.stdout + run.stderr
    assert host["changed"] is False and host["server"]["restart_reasons"] == [], host

    # The flags drift (wanted now differs from what runs): the check says so, changing nothing.
    write_host_vars(tmp, node, dict(GOOD_SERVER, inference_service_flags=dict(GOOD_SERVER["inference_service_flags"],
                                                                              mem_fraction_static=0.7)))
    run, summary = run_playbook(tmp, [node], "--check", "--diff")
    host = summary["hosts"][node]
    assert host["changed"] is True and host["server"]["restart_reasons"] == ["flags or unit changed"], host
    assert "--mem-fraction-static 0.8" in lab.exec(node, "cat /etc/systemd/system/sglang.service").stdout
