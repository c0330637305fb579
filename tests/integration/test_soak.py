"""Two small randomised soaks on one lab node.

The owner soak (bench/soak_bench.py): gpu_reclaim on random owner
shapes (hand-started holders, orphans, units and containers with restart policies, respawn
loops at depth 1 and 2 with load delays and re-titles, protected holders, holders of GPUs not
selected, a monitor and a shell as bystanders), each judged against what its shape allows.

The seed is drawn at each run and printed on failure with the failing trial's shape and its
replay command (`bench/run soak --seed S --only K`); SOAK_SEED and SOAK_N set them. Kinds the
node cannot build are left out and named (containers need LAB_CONTAINERS=1; loops need
`fakegpu hold --load-s`; guest trials, gpu_reclaim on the controller around the node, need a
controller with no other lab's node up: see soak_bench.foreign_nodes).

The server soak (bench/server_soak_bench.py, issue 30 item 8): the inference_service role once
over six stand-in servers (real systemd units, one batch), each in one of the server shapes dealt
in turn (loading within its budget, paused 4-9 s, stalled past its budget, a dead rank, a hung
generation), judged by what it must end as: no needless restart, no stall left running, no wrong
kill (a kept server's processes, a monitor, another user's holder), the right reason, serving after.
SERVER_SOAK_N trials (10: each shape twice, two batches, about 4 min), SERVER_SOAK_SEED the seed;
bench/README has the long run.
"""

import json
import os
import sys
import time

from .conftest import REPO

sys.path.insert(0, os.path.join(REPO, "bench"))
import server_soak_bench as ssb  # noqa: E402  (bench/ is not a package)
import soak_bench as sb  # noqa: E402

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


SERVER_N = int(os.environ.get("SERVER_SOAK_N", "10"))
# A backstop, not an expectation: 10 trials (two plays) take about 4 min on the 2-core host.
SERVER_BUDGET_S = 1200


def test_server_shapes_no_needless_restart_no_stall_left_no_wrong_kill(lab, node):
    seed = int(os.environ.get("SERVER_SOAK_SEED", str(int(time.time()) % 100000)))
    print("server soak seed %d, %d trials (bench/run server-soak --seed %d --n %d --dealt replays it)"
          % (seed, SERVER_N, seed, SERVER_N))
    trials, kills, stopped = ssb.soak(node, seed, SERVER_N, SERVER_BUDGET_S, log=print, dealt=True)

    assert not stopped and len(trials) == SERVER_N, "the %d s budget ended the soak after %d of %d trials" % (
        SERVER_BUDGET_S, len(trials), SERVER_N)
    assert not kills, "seed %d: bystanders killed %s" % (seed, kills)
    bad = [t for t in trials if t["failures"]]
    assert not bad, "\n\n".join("trial %d of seed %d (%s): %s\nrole: %s %s\n%s" % (
        t["spec"]["trial"], seed, json.dumps(t["spec"]), t["failures"], t.get("now"), t.get("role_failure"),
        t.get("output_tail", "")) for t in bad)
    # Every shape ran, and the role met the loading ones loading (not already up).
    assert {t["spec"]["shape"] for t in trials} == set(ssb.SHAPES)
    assert all(t["seen"] == "loading" for t in trials if t["spec"]["shape"] == "loading"), [
        (t["spec"]["trial"], t["seen"]) for t in trials]
