"""gpu_reclaim over SSH on a lab node, on random holder sets drawn by Hypothesis.

Process trees (a holder with a child on another GPU, its parent SIGKILLed or not, a forked
child inheriting the context), names (ordinary, misleading, infrastructure, a user-protected
one), SIGTERM handling, a holder run by a Restart=always unit, and GPU selections. After the
run: nothing protected or out of scope was signalled or died, and every selected GPU is free
or the failure names the protected holder that keeps it.
"""

from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from . import scenarios as sc

FQCN = "gpuops.reclaim.gpu_reclaim"
GPUS = 8
NAMES = ["python3", "sglang::scheduler_TP1", "[kworker/3:1]", "VLLM::Worker_TP0", "nv-hostengine",
         "keepme-notebook"]
PROTECTED = {"nv-hostengine", "keepme-notebook"}

holder_spec = st.fixed_dictionaries({
    "gpu": st.integers(0, GPUS - 1),
    "mib": st.integers(100, 4000),
    "name": st.sampled_from(NAMES),
    "ignore_term": st.booleans(),
    "child_gpu": st.one_of(st.none(), st.integers(0, GPUS - 1)),
    "orphan": st.booleans(),
    "fork_inherit": st.booleans(),
})


def start(lab, node, index, spec):
    """Start one drawn holder; returns [(pid, start_time, name, gpus)] of its processes."""
    args = ["--gpu", "%d:%d" % (spec["gpu"], spec["mib"]), "--title", spec["name"]]
    if spec["ignore_term"]:
        args.append("--ignore-term")
    if spec["fork_inherit"]:
        args.append("--fork-inherit")
    if spec["child_gpu"] is not None:
        args += ["--child", "%d:200:%s" % (spec["child_gpu"], spec["name"])]
    rec = sc.hold(lab, node, "rand%d" % index, *args)
    procs = [(rec["pid"], rec["start_time"], spec["name"], {spec["gpu"]})]
    starts = {p["pid"]: p["start_time"] for p in rec["processes"]}
    procs += [(pid, starts[pid], spec["name"], {spec["gpu"]}) for pid in rec["forked"]]
    procs += [(pid, starts[pid], spec["name"], {spec["child_gpu"]}) for pid in rec["spawned"]]
    if spec["orphan"] and rec["spawned"]:
        # The scenario's own SIGKILL of the parent (the seed incident): it is not the module's.
        sc.kill9_and_wait_reaped(lab, node, rec["pid"])
        procs = procs[1:]
    return procs


# Few examples, no shrinking: each one boots real processes and runs Ansible over SSH, and a
# failing example is printed as drawn.
@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(holder_spec, min_size=1, max_size=4),
       selected=st.sets(st.integers(0, GPUS - 1), min_size=1, max_size=GPUS),
       unit_gpu=st.one_of(st.none(), st.integers(0, GPUS - 1)))
def test_random_holders_spare_protected_and_out_of_scope(lab, specs, selected, unit_gpu):
    node = lab.nodes[-1]
    sc.cleanup(lab, node)
    try:
        procs = []
        for index, spec in enumerate(specs):
            procs += start(lab, node, index, spec)
        if unit_gpu is not None:
            rec = sc.start_unit(lab, node, "--gpu", "%d:300" % unit_gpu)
            procs.append((rec["pid"], rec["start_time"], "unit", {unit_gpu}))

        result = lab.module(node, FQCN, {"gpus": [str(i) for i in sorted(selected)],
                                         "protect": ["^keepme"], "term_timeout": 1,
                                         "release_timeout": 5})

        signalled = {a["pid"] for a in result["actions"] if a["step"] in ("sigterm", "sigkill") and a["changed"]}
        for pid, start_time, name, gpus in procs:
            if name in PROTECTED:
                assert pid not in signalled, "protected %s (%d) was signalled" % (name, pid)
                assert sc.alive(lab, node, pid, start_time), "protected %s (%d) died" % (name, pid)
            if not gpus & selected:
                assert pid not in signalled, "PID %d on GPU %s (not selected) was signalled" % (pid, gpus)
                assert sc.alive(lab, node, pid, start_time), "PID %d out of scope died" % pid
        if result.get("failed"):
            assert "protected" in result["msg"], result["msg"]
        else:
            assert result["free"] is True
            for index in selected:
                assert sc.gpu_used_mib(lab, node, index) == 0 or any(
                    name in PROTECTED and index in gpus for _p, _s, name, gpus in procs)
    finally:
        sc.cleanup(lab, node)
