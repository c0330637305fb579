"""A small randomised soak (bench/soak_bench.py) on one lab node: gpu_reclaim on random owner
shapes (hand-started holders, orphans, units and containers with restart policies, respawn
loops at depth 1 and 2 with load delays and re-titles, protected holders, holders of GPUs not
selected, a monitor and a shell as bystanders), each judged against what its shape allows.

The seed is drawn at each run and printed on failure with the failing trial's shape and its
replay command (`bench/run soak --seed S --only K`); SOAK_SEED and SOAK_N set them. Kinds the
node cannot build are left out and named (containers need LAB_CONTAINERS=1; loops need
`fakegpu hold --load-s`; guest trials, gpu_reclaim on the controller around the node, need a
controller with no other lab's node up: see soak_bench.foreign_nodes).
"""

import json
import os
import sys
import time

from .conftest import REPO

sys.path.insert(0, os.path.join(REPO, "bench"))
import soak_bench as sb  # noqa: E402  (bench/ is not a package)

N = int(os.environ.get("SOAK_N", "15"))
# A backstop, not an expectation: 15 trials take about 90 s on the 2-core host.
BUDGET_S = 600


def test_random_owner_shapes_no_wrong_kill_no_early_free_no_unfreed_gpu(lab, node):
    seed = int(os.environ.get("SOAK_SEED", str(int(time.time()) % 100000)))
    offered = sb.install(node)
    kinds, left_out = sb.available(list(sb.KINDS), offered)
    if "supervised" in kinds:
        # On a runtimes node every supervised trial is a wrong kill until issue 19 item 3 lands
        # (gpu_reclaim stops the supervisor's whole unit; test_supervisors.py's xfail tests):
        # left out here, named; bench/run soak counts it.
        kinds.remove("supervised")
        left_out["supervised"] = "issue 19 item 3 (supervisors as owners)"
    print("soak seed %d, %d trials, kinds %s, left out: %s"
          % (seed, N, ",".join(kinds), "; ".join("%s (needs %s)" % kv for kv in left_out.items()) or "none"))

    trials, stopped = sb.soak(node, seed, range(N), kinds, BUDGET_S, batch=N, log=print, offered=offered)

    assert not stopped and len(trials) == N, "the %d s budget ended the soak after %d of %d trials" % (
        BUDGET_S, len(trials), N)
    bad = [t for t in trials if t["failures"]]
    assert not bad, "\n\n".join(
        "trial %d of seed %d: %s\nshape: %s\nreplay: %s" % (
            t["spec"]["trial"], seed, json.dumps(t["failures"], indent=1), json.dumps(t["spec"]["parts"]),
            sb.replay(t["spec"])) for t in bad)
    # The soak judged what it claims: every trial ran the module and watched after it.
    assert all("result" in t["facts"] and t["facts"]["watched_s"] >= t["spec"]["watch_s"] for t in trials)
