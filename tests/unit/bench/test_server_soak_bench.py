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
