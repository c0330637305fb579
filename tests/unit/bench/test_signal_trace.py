"""bench/signal_trace.py: the trace_pipe line is read into sender and target, events are matched
to a trial's processes by (PID in the node's namespace, start time), by a host PID read before
the target died, or by its unit's cgroup, and on a host with tracefs the recorder names the real
sender of a real SIGTERM."""

import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
import signal_trace as st  # noqa: E402

# Lines as this host's kernel writes them (6.x, record-tgid on), one with a comm holding a dash
# and a space.
LINE = ("         python3-19993   (  19993) [001] d..2.  1234.567890: signal_generate: sig=15 errno=0 code=0 "
        "comm=sleep pid=20080 grp=1 res=0")
ODD = ("  (sd-pam) x-y-1292   (   1291) [000] dN.1. 99.000001: signal_generate: sig=9 errno=0 code=128 "
       "comm=fakegpu hold pid=1300 grp=0 res=2")


def test_a_line_names_sender_target_signal_and_code():
    e = st.parse(LINE)
    assert (e["sig"], e["code"], e["result"], e["ts"]) == (15, 0, 0, 1234.56789)
    assert e["sender"] == {"pid": 19993, "tgid": 19993, "comm": "python3"}
    assert e["target"] == {"pid": 20080, "comm": "sleep"}


def test_a_comm_with_dashes_and_spaces_keeps_the_last_number_as_the_pid():
    e = st.parse(ODD)
    assert e["sender"] == {"pid": 1292, "tgid": 1291, "comm": "(sd-pam) x-y"}
    assert (e["target"]["comm"], e["target"]["pid"], e["sig"], e["code"], e["result"]) == ("fakegpu hold", 1300, 9, 128, 2)


def test_a_line_without_tgid_and_other_lines_of_the_pipe():
    e = st.parse(LINE.replace("(  19993) ", ""))
    assert e["sender"] == {"pid": 19993, "tgid": None, "comm": "python3"}
    assert st.parse("# tracer: nop") is None
    assert st.parse("  bash-1 [000] .... 1.0: signal_deliver: sig=15 errno=0 code=0 sa_handler=0 sa_flags=0") is None


def event(ts, target_pid, now=None, sig=15):
    return {"ts": ts, "sig": sig, "code": 0, "errno": 0, "result": 0, "group": 1,
            "sender": {"pid": 7, "tgid": 7, "comm": "gpu_reclaim", "now": {
                "comm": "python3", "nspid": [7, 55], "cgroup": "/gpuops30-node1/payload/system.slice/x.service",
                "cmdline": ["python3", "x"], "start": 1, "tgid": 7, "ppid": 1}},
            "target": {"pid": target_pid, "comm": "fakegpu", "now": now}}


def test_matching_by_namespace_pid_and_start_time_by_host_record_and_by_unit_cgroup():
    alive = event(10.0, 100, {"nspid": [100, 5], "start": 42, "cgroup": "/gpuops30-node1/payload/system.slice/soak-s0.service"})
    reused = event(11.0, 101, {"nspid": [101, 5], "start": 43, "cgroup": "/gpuops30-node1/payload/user.slice"})
    gone = event(12.0, 102, None)
    elsewhere = event(13.0, 103, {"nspid": [103, 9], "start": 1, "cgroup": "/gpuops30-node1/payload/system.slice/soak-s1.service"})
    late = event(99.0, 100, alive["target"]["now"])
    events = [alive, reused, gone, elsewhere, late]
    # The node's PID 5 with start 42 is the trial's; PID 5 with another start time is not.
    assert st.matching(events, [[5, 42]], since=0, until=50) == [alive]
    # A target gone when read is found by the host PID the bench read before.
    host = {102: {"named": [6, 77], "cgroup": "/gpuops30-node1/payload/system.slice/soak-s0.service"}}
    assert st.matching(events, [[6, 77]], 0, 50, host) == [gone]
    # By the unit's cgroup: processes the trial did not name (ranks started during the play).
    assert st.matching(events, [], 0, 50, host, "/soak-s0.service") == [alive, gone]
    assert st.matching(events, [], 0, 50, host, "/soak-s1.service") == [elsewhere]
    assert st.matching(events, [[5, 42]]) == [alive, late]


def test_describe_names_the_sender_its_namespace_pid_cgroup_and_cmdline():
    said = st.describe(event(1.0, 100, None))
    # The sender's comm as the kernel recorded it; what /proc said when read, if it differs.
    assert said.startswith("SIGTERM SI_USER (kill) from gpu_reclaim (host pid 7, now python3, pid 55 in its namespace, "
                           "cgroup /gpuops30-node1/payload/system.slice/x.service, cmdline 'python3 x')")
    assert "to fakegpu (host pid 100, gone when read), delivered" in said


def tracefs_or_skip():
    if os.geteuid() != 0:
        pytest.skip("the signal trace needs root (tracefs)")
    root, why = st.tracefs()
    if root is None:
        pytest.skip("no tracefs on this host: %s" % why)


def test_the_recorder_names_a_real_sender_and_leaves_no_instance(tmp_path):
    tracefs_or_skip()
    path = tmp_path / "signals.jsonl"
    victims = []
    trace = st.SignalTrace("gpuops-test-%d" % os.getpid(), str(path), keep=lambda e: e["target"]["pid"] in victims)
    assert trace.start() is None
    try:
        victim = subprocess.Popen(["sleep", "60"])
        victims.append(victim.pid)
        # A sender of its own that outlives the event, so the recorder reads its /proc (a shell
        # would exec its last command: the PID would read as that command by then).
        sender = subprocess.Popen([sys.executable, "-c", "import os, time; os.kill(%d, 15); time.sleep(5)" % victim.pid,
                                   "soak-sender"])
        victim.wait(10)
        deadline = time.monotonic() + 10
        while not [e for e in trace.snapshot() if e["target"]["pid"] == victim.pid] and time.monotonic() < deadline:
            time.sleep(0.1)
        got = [e for e in trace.snapshot() if e["target"]["pid"] == victim.pid]
        sender.kill()
        sender.wait()
    finally:
        assert trace.stop()
    assert not os.path.exists(trace.instance)
    assert len(got) == 1, got
    e = got[0]
    assert (e["sig"], e["sender"]["tgid"], e["sender"]["now"]["cmdline"][-1]) == (15, sender.pid, "soak-sender")
    assert e["target"]["comm"] == "sleep"
    assert str(victim.pid) in path.read_text()
