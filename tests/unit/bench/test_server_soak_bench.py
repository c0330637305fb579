"""bench/server_soak_bench.py's pure parts: --only replays whole batches (a trial's slot shares
its play with the batch's other five), and a trial's shape is the same in a replay."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
import server_soak_bench as ssb  # noqa: E402


def test_only_runs_the_batches_that_hold_the_trials():
    assert ssb.batches(20) == [0, 6, 12, 18]
    assert ssb.batches(20, [72]) == [72]
    assert ssb.batches(0, [77, 3, 5, 72]) == [0, 72]


def test_a_replayed_trial_has_the_shape_of_the_full_run():
    assert ssb.shape(3010, 72) == ssb.shape(3010, 72)
    assert ssb.shape(3010, 72)["slot"] == 0


def ev(sender_cgroup, target_cgroup):
    return {"sender": {"pid": 1, "comm": "x", "now": {"cgroup": sender_cgroup} if sender_cgroup else None},
            "target": {"pid": 2, "comm": "y", "now": {"cgroup": target_cgroup} if target_cgroup else None}}


def test_signals_from_outside_the_node_are_those_sent_into_it_by_processes_elsewhere():
    node = "/gpuops30-node1/"
    inside = ev("/gpuops30-node1/payload/init.scope", "/gpuops30-node1/payload/system.slice/soak-s0.service")
    host_test = ev("/", "/gpuops30-node1/payload/system.slice/soak-s0.service")
    sender_gone = ev(None, "/gpuops30-node1/payload/system.slice/soak-s2.service")
    supervisor = ev("/gpuops30-node1/supervisor", "/gpuops30-node1/payload/init.scope")
    other_lab = ev("/", "/gpuops45-node1/payload/system.slice/soak-s0.service")
    outward = ev("/gpuops30-node1/payload/init.scope", "/")
    target_gone = ev("/", None)
    got = ssb.from_outside([inside, host_test, sender_gone, supervisor, other_lab, outward, target_gone], node)
    assert got == [host_test, sender_gone]
