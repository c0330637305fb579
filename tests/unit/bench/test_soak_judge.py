"""The soak's pure parts (bench/soak_bench.py): trial shapes are replayable and well formed, and
the judge counts each kind of failure from a trial's facts (what the node saw), and nothing
in a clean trial. The facts here are written by hand in the node's format; the lab test
(tests/integration/test_soak.py) produces real ones."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
import soak_bench as sb  # noqa: E402

ALL = [k for k in sb.KINDS if k != "guest"]


def test_a_trial_is_the_same_shape_for_the_same_seed_and_index():
    assert sb.shape(7, 3, ALL) == sb.shape(7, 3, ALL)
    parts = [sb.shape(7, k, ALL)["parts"] for k in range(20)] + [sb.shape(8, 3, ALL)["parts"]]
    assert len({repr(p) for p in parts}) > 15, "trials of a seed, and seeds, draw different shapes"


@pytest.mark.parametrize("trial", range(200))
def test_every_part_has_its_own_gpu_and_out_of_scope_gpus_are_never_selected(trial):
    spec = sb.shape(11, trial, ALL + ["guest"])
    gpus = [p["gpu"] for p in spec["parts"] if "gpu" in p]
    selected = {int(g) for g in spec["args"]["gpus"]}
    assert len(gpus) == len(set(gpus))
    assert selected and not selected & {p["gpu"] for p in spec["parts"] if p["kind"] == "outscope"}
    assert sum(1 for p in spec["parts"] if p["kind"] == "container") <= 1
    assert spec["watch_s"] >= max([1.0] + [sb.comeback_s(p) + 1.0 for p in spec["parts"]])
    if spec["host"]:
        assert {p["kind"] for p in spec["parts"]} <= set(sb.GUEST_PARTS)


def test_guest_share_sets_how_many_trials_run_from_the_controller_and_keeps_shapes_replayable():
    kinds = ALL + ["guest"]
    assert not any(sb.shape(5, k, kinds, guest_share=0)["host"] for k in range(50))
    only = [sb.shape(5, k, kinds, guest_share=1) for k in range(50)]
    assert all(s["host"] for s in only)
    assert all({p["kind"] for p in s["parts"]} <= set(sb.GUEST_PARTS) for s in only)
    assert sb.shape(5, 7, kinds, guest_share=1) == only[7]
    assert sb.replay(only[7], 1.0) == "bench/run soak --seed 5 --only 7 --guest-share 1"
    assert sb.replay(only[7]) == "bench/run soak --seed 5 --only 7"


def spec_of(*parts, gpus, host=False):
    return {"trial": 0, "seed": 1, "parts": list(parts), "args": {"gpus": [str(g) for g in gpus]},
            "host": host, "watch_s": 2.0}


def facts_of(procs, result, after=None, peak=None):
    zero = [0] * sb.GPUS
    return {"trial": 0, "seed": 1, "procs": procs, "result": result, "after_mib": after or zero,
            "watch_peak_mib": peak or after or zero, "watch_first_held_s": {}, "watched_s": 2.0,
            "containers": {}, "supervised": {}, "cleanup": {}}


def proc(pid, role, part, alive):
    return {"pid": pid, "start": 1, "role": role, "what": "p", "part": part, "alive": alive}


def sig(pid, step="sigterm"):
    return {"step": step, "pid": pid, "changed": True}


PLAIN = {"kind": "plain", "gpu": 2, "mib": 300}
MONITOR = {"kind": "monitor"}
PROTECTED = {"kind": "protected", "gpu": 4, "mib": 300}
LOOP = {"kind": "loop", "gpu": 2, "mib": 300, "depth": 1, "sleep_s": 0.3, "import_s": 0.5, "load_s": 1.0}


def test_a_clean_trial_counts_nothing():
    spec = spec_of(PLAIN, MONITOR, gpus=[2])
    facts = facts_of([proc(10, "end", 0, False), proc(11, "bystander", 1, True)],
                     {"free": True, "actions": [sig(10)], "remaining": []})
    assert sb.judge(spec, facts) == {}


def test_a_bystander_signalled_or_dead_is_a_wrong_kill():
    spec = spec_of(PLAIN, MONITOR, gpus=[2])
    signalled = facts_of([proc(10, "end", 0, False), proc(11, "bystander", 1, True)],
                         {"free": True, "actions": [sig(10), sig(11, "sigstop")], "remaining": []})
    dead = facts_of([proc(10, "end", 0, False), proc(11, "bystander", 1, False)],
                    {"free": True, "actions": [sig(10)], "remaining": []})
    assert list(sb.judge(spec, signalled)) == ["wrong_kill"]
    assert list(sb.judge(spec, dead)) == ["wrong_kill"]


def test_free_then_the_gpu_held_again_while_watched_is_an_early_free():
    spec = spec_of(LOOP, gpus=[2])
    peak = [0] * sb.GPUS
    peak[2] = 300
    facts = facts_of([proc(10, "end", 0, True)], {"free": True, "actions": [sig(20)], "remaining": []},
                     after=peak, peak=peak)
    failures = sb.judge(spec, facts)
    assert "early_free" in failures and "not_ended" in failures and "unfreed" not in failures


def test_a_failed_run_where_the_shape_allows_free_is_unfreed():
    spec = spec_of(PLAIN, gpus=[2])
    after = [0] * sb.GPUS
    after[2] = 300
    facts = facts_of([proc(10, "end", 0, True)], {"free": False, "failed": True, "msg": "GPU 2 still holds",
                                                  "actions": [], "remaining": []}, after=after)
    assert set(sb.judge(spec, facts)) == {"unfreed", "not_ended"}


def test_a_protected_holder_must_be_named_exactly_with_its_code():
    spec = spec_of(PROTECTED, MONITOR, gpus=[4])
    held = [0] * sb.GPUS
    held[4] = 300
    procs = [proc(30, "live", 0, True), proc(31, "bystander", 1, True)]
    right = {"free": False, "failed": True, "msg": "protected", "actions": [],
             "remaining": [{"pid": 30, "gpus": [4], "reason_code": "protected"},
                           {"pid": 31, "gpus": [4], "reason_code": "device_open"}]}
    wrong_code = dict(right, remaining=[{"pid": 30, "gpus": [4], "reason_code": "survived"}])
    other_pid = dict(right, remaining=[{"pid": 30, "gpus": [4], "reason_code": "protected"},
                                       {"pid": 99, "gpus": [4], "reason_code": "survived"}])
    assert sb.judge(spec, facts_of(procs, right, after=held)) == {}
    assert list(sb.judge(spec, facts_of(procs, wrong_code, after=held))) == ["wrong_reason"]
    assert list(sb.judge(spec, facts_of(procs, other_pid, after=held))) == ["wrong_reason"]
    assert "wrong_reason" in sb.judge(spec, facts_of(procs, dict(right, free=True), after=held))


def test_a_guest_unit_that_comes_back_must_be_named_and_a_signal_outside_the_node_is_a_wrong_kill():
    unit = {"kind": "unit", "gpu": 5, "mib": 300, "restart": "always", "ignore_term": False}
    spec = spec_of(unit, gpus=[5], host=True)
    held = [0] * sb.GPUS
    held[5] = 300
    named = {"free": False, "failed": True, "msg": "soak-0-0.service inside it respawns", "actions": [sig(10)],
             "remaining": []}
    assert sb.judge(spec, facts_of([proc(10, "end", 0, False)], named, after=held)) == {}
    unnamed = dict(named, msg="GPU 5 still held")
    assert list(sb.judge(spec, facts_of([proc(10, "end", 0, False)], unnamed, after=held))) == ["wrong_reason"]
    outside = dict(named, soak_signalled_outside_node=[4242])
    assert list(sb.judge(spec, facts_of([proc(10, "end", 0, False)], outside, after=held))) == ["wrong_kill"]


def test_a_shape_the_lab_could_not_build_is_infra_only():
    assert sb.judge(spec_of(PLAIN, gpus=[2]), {"shape_error": "holder not ready"}) == {"infra": ["holder not ready"]}


def test_an_lxc_guest_unit_that_comes_back_must_be_named_with_the_guest_of_the_node_it_ran_on():
    unit = {"kind": "lxc", "gpu": 2, "mib": 300, "restart": "always", "ignore_term": False}
    spec = spec_of(unit, gpus=[2])
    held = [0] * sb.GPUS
    held[2] = 300
    msg = "GPU 2: run `lxc-attach -n gpuops-soak-lxc-node2 -- systemctl stop soak-0-0.service`"
    named = {"free": False, "failed": True, "msg": msg, "actions": [sig(10)], "remaining": []}
    facts = dict(facts_of([proc(10, "end", 0, False)], named, after=held), node="node2")
    assert sb.judge(spec, facts) == {}
    other = dict(facts, node="node1")
    assert list(sb.judge(spec, other)) == ["wrong_reason"], "node1's guest is another guest"
