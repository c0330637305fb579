"""gpu_holders / gpu_reclaim on hosts as they really are (issue 10, items 4-7), over SSH on a lab node:
run without root, hostile patterns, NCCL peer memory, two runs at once.
"""

import re
import shlex
import threading

import pytest

from . import scenarios as sc

RECLAIM = "gpuops.reclaim.gpu_reclaim"
HOLDERS = "gpuops.reclaim.gpu_holders"
FAST = {"term_timeout": 1.5, "release_timeout": 3, "nvml_timeout": 5}
LAB_USER = "gpulab"
LOCK = "/run/gpuops/gpu-reclaim.lock"
# Whether some process holds a flock on LOCK, read from /proc/locks: a probe must only look.
# `flock -n LOCK true` takes the lock for an instant, and a run starting in that instant
# waits for it and reports "another process" as the holder.
LOCK_HELD = "ino=$(stat -c %%i %s 2>/dev/null) && grep -q \":$ino \" /proc/locks" % LOCK
ADVICE = re.compile(r"reset|reboot", re.IGNORECASE)


def signalled(result):
    return [(a["step"], a["pid"]) for a in result.get("actions") or []
            if a["step"] in ("sigterm", "sigkill") and a.get("changed")]


@pytest.fixture
def lab_user(lab, node):
    """An unprivileged user on the node that logs in with the lab key, as root does."""
    # A fixed UID: the first free one (1000) is alice's in test_trust_boundary, which waits for
    # user@1000 (final CI at e64bbb4: gpulab took 1000 on node2 first, and 5 alice setups failed).
    lab.exec(node, "id -u {u} >/dev/null 2>&1 || useradd -m -u 1500 -s /bin/bash {u}; "
                   "install -d -m 700 -o {u} -g {u} /home/{u}/.ssh && "
                   "install -m 600 -o {u} -g {u} /root/.ssh/authorized_keys /home/{u}/.ssh/authorized_keys"
             .format(u=LAB_USER))
    return {"ansible_user": LAB_USER}


# --- item 4: privileges ------------------------------------------------------------------------------

def test_unprivileged_run_says_run_as_root_first_and_never_advises_reset(lab, node, lab_user):
    rec = sc.hold(lab, node, "rootholder", "--gpu", "2:900")      # root's process

    seen = lab.module(node, HOLDERS, {"gpus": ["2"]}, task_vars=lab_user)
    assert not seen.get("failed"), seen
    assert seen["diagnosis"][0].startswith("Run as root (become: true): this module runs as %s" % LAB_USER)
    assert not [d for d in seen["diagnosis"] if ADVICE.search(d)], seen["diagnosis"]
    assert seen["free"] is False

    refused = lab.module(node, RECLAIM, dict(FAST, gpus=["2"], allow_reset=True), task_vars=lab_user)
    assert refused["failed"] is True
    assert refused["msg"].startswith("allow_reset refused: Run as root (become: true): "), refused["msg"]
    assert "Nothing was signalled" in refused["msg"]

    result = lab.module(node, RECLAIM, dict(FAST, gpus=["2"]), task_vars=lab_user)
    assert result["failed"] is True and result["free"] is False
    assert result["msg"].startswith("Run as root (become: true): "), result["msg"]
    assert not ADVICE.search(result["msg"]), result["msg"]
    assert not signalled(result), result["actions"]
    assert sc.alive(lab, node, rec["pid"], rec["start_time"])

    # The same run as root frees it: the lever named was the right one.
    assert lab.module(node, RECLAIM, dict(FAST, gpus=["2"]))["free"] is True


# --- item 5: bounded patterns ----------------------------------------------------------------------

@pytest.mark.parametrize("option", ["protect", "match"])
def test_catastrophic_pattern_is_cut_off_at_its_bound_naming_it_and_signals_nothing(lab, node, option):
    # (a+)+$ on a run of 'a's that ends in something else backtracks 2^n times.
    rec = sc.hold(lab, node, "aaaa", "--gpu", "3:700", "--title", "a" * 64 + " --serve")

    # Without the bound the search never returns (2^64 steps); lab.module's own timeout
    # fails the test rather than hang it.
    result = lab.module(node, RECLAIM, dict(FAST, gpus=["3"], **{option: ["sglang", "(a+)+$"]}))

    assert result["failed"] is True
    # The evaluation was cut off at its bound (2 s), before any step: nothing was done.
    assert "%s: pattern '(a+)+$' did not finish within 2.0 s" % option in result["msg"], result["msg"]
    assert "Nothing was signalled" in result["msg"]
    assert result["actions"] == []
    assert sc.alive(lab, node, rec["pid"], rec["start_time"])
    assert sc.gpu_used_mib(lab, node, 3) == 700


# --- item 6: peer memory ---------------------------------------------------------------------------

def test_peer_memory_is_explained_and_peers_true_frees_it(lab, node):
    # NCCL rank 1 after rank 0 died: context on GPU 1, 291 MiB on GPU 0 charged to nobody.
    rec = sc.hold(lab, node, "rank1", "--gpu", "1:1000", "--peer", "0:291", "--title", "sglang::scheduler_TP1")
    pid = rec["pid"]
    expected = ("GPU 0: 291 MiB used that NVML charges to no process: PID %d (sglang::scheduler_TP1) maps "
                "GPU 0, its context is on GPU 1: NCCL/IPC peer memory; reclaim GPU 1 too or set peers: true."
                % pid)

    seen = lab.module(node, HOLDERS, {"gpus": ["0"]})
    assert expected in seen["diagnosis"], seen["diagnosis"]
    assert not [d for d in seen["diagnosis"] if ADVICE.search(d)], seen["diagnosis"]
    (holder,) = [h for h in seen["holders"] if h["pid"] == pid]
    assert holder["context_gpus"] == [1] and holder["peer_gpus"] == [0]
    assert seen["gpus"][0]["peers"] == [pid]

    alone = lab.module(node, RECLAIM, dict(FAST, gpus=["0"], allow_reset=True))
    assert alone["failed"] is True
    assert "PID %d" % pid in alone["msg"] and "set peers: true" in alone["msg"], alone["msg"]
    assert not ADVICE.search(alone["msg"]), alone["msg"]
    assert not signalled(alone), alone["actions"]
    assert not [a for a in alone["actions"] if a["step"] == "reset" and a.get("changed")], alone["actions"]
    assert sc.alive(lab, node, pid, rec["start_time"])

    freed = lab.module(node, RECLAIM, dict(FAST, gpus=["0"], peers=True))
    assert not freed.get("failed"), freed.get("msg")
    assert freed["free"] is True
    assert ("sigterm", pid) in signalled(freed)
    assert not sc.alive(lab, node, pid, rec["start_time"])
    assert sc.gpu_used_mib(lab, node, 0) == 0 and sc.gpu_used_mib(lab, node, 1) == 0


# --- item 7: two runs at once ----------------------------------------------------------------------

# A holder that catches SIGTERM and does nothing: the first run spends its whole grace on it.
SLOW_TO_DIE = sc._CONTEXT + r"""
import signal
signal.signal(signal.SIGTERM, lambda *_: None)
with open('{ready}', 'w') as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(1000)
"""


def test_overlapping_runs_serialize_and_the_second_reports_what_it_found(lab, node):
    (pid,) = sc._python_scenario(lab, node, "slowdie", SLOW_TO_DIE, 4, 800, "true", "SIGTERM-catching holder")
    first = {}
    runner = threading.Thread(target=lambda: first.update(
        lab.module(node, RECLAIM, dict(FAST, gpus=["4"], term_timeout=40))))
    runner.start()
    try:
        sc.wait_until(lab, node, "%s && grep -q '^PID ' %s" % (LOCK_HELD, LOCK),
                      "the first run holds the host lock and has written its name", timeout=60)
        second = lab.module(node, RECLAIM, dict(FAST, gpus=["4"], lock_timeout=120))
    finally:
        runner.join(timeout=300)

    assert not first.get("failed"), first.get("msg")
    assert first["free"] is True and first["changed"] is True
    assert ("sigkill", pid) in signalled(first)
    # The second waited for the first, then found the GPU free: nothing to do, nothing signalled.
    assert not second.get("failed"), second.get("msg")
    assert second["free"] is True and second["changed"] is False and second["actions"] == []
    # It waited, for the first run (which wrote its name into the lock before the second began).
    assert second["host_lock"]["waited_s"] > 0, second["host_lock"]
    assert re.match(r"PID \d+ since ", second["host_lock"]["waited_for"]), second["host_lock"]
    assert first["host_lock"]["waited_for"] is None


def test_lock_wait_is_bounded_and_names_the_holder(lab, node):
    rec = sc.hold(lab, node, "locked", "--gpu", "5:600")
    sc.start_in_scope(lab, node, "lockholder", "flock %s sleep 60" % shlex.quote(LOCK))
    sc.wait_until(lab, node, LOCK_HELD, "flock(1) holds the host lock")

    result = lab.module(node, RECLAIM, dict(FAST, gpus=["5"], lock_timeout=1))

    assert result["failed"] is True
    # flock(1) writes nothing into the file: the holder is named from /proc/locks.
    # (systemd-run starts it as /usr/bin/flock: its command line has the path.)
    flock_pid = int(lab.exec(node, "pgrep -xf %s" % shlex.quote("(.*/)?flock %s sleep 60" % LOCK)).stdout)
    assert result["msg"].startswith("another run, PID %d (flock), has held the host lock %s for more than "
                                    "lock_timeout=1.0s; nothing was signalled" % (flock_pid, LOCK)), result["msg"]
    # It gave up at lock_timeout while flock(1) still held the lock (it sleeps 60 s): the wait is
    # bounded by lock_timeout, not by the holder.
    assert lab.exec(node, "kill -0 %d" % flock_pid, check=False).returncode == 0, "flock(1) had ended"
    assert result["actions"] == []
    assert sc.alive(lab, node, rec["pid"], rec["start_time"])
