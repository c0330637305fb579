"""Randomised soak: gpu_reclaim on random owner shapes on a lab node, as a reliability figure.

usage: bench/run soak [--n N] [--seed S] [--only K[,K...]] [--budget SECONDS] [--kinds a,b]
                      [--batch B] [--keep] [--nodes M] [--guest-share F]

Boots --nodes lab nodes (the private lab of LAB_STATE/LAB_RUN/LAB_ADDR_BASE when set, else
/var/lib/gpuops-lab-bench at base 200; with podman when LAB_CONTAINERS=1; with docker,
supervisord, runit and lxc when LAB_RUNTIMES=1), copies the
collection's plugins and ansible-core's module_utils to it, and runs N trials. Trial K of seed
S is always the same shape (random.Random("S-K")): a few parts, each on its own GPU, drawn from
KINDS below, and gpu_reclaim's arguments. The node (bench/soak_node.py) builds the shape, runs
the module, watches the selected GPUs for longer than the slowest comeback any part could make,
and cleans up by name; this side judges each trial against what its shape allows:

  wrong kill   a PID that must live (protected, out of scope, a bystander) died, or a
               bystander or must-live PID was signalled at all (the action log)
  early free   free: true, and a selected GPU was held again while watched after the run
  unfreed      a selected GPU the shape allows to end free did not (or the run failed)
  not ended    a PID the shape says must end (a holder, a respawn loop) still lives
  wrong reason the run's remaining holders are not exactly the protected holders of selected
               GPUs, each with reason_code protected (when the module returns reason codes)
  infra        the lab could not build the shape (not counted against the module)

Prints a table and every failing trial with its replay command; writes
bench/results/soak.json (every trial's shape, seed, facts, outcome and timing). The whole run
is bounded by --budget; when it ends first, the table says how many trials ran.
"""
import argparse
import collections
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import benchlib as bl

LAB = os.path.join(bl.REPO, "tests", "lab", "lab")
NODE_SCRIPT = os.path.join(bl.BENCH, "soak_node.py")
TREE = "/opt/gpuops-soak"
LAB_DEFAULTS = {"LAB_STATE": "/var/lib/gpuops-lab-bench", "LAB_RUN": "/run/gpuops-lab-bench",
                "LAB_ADDR_BASE": "200"}
GPUS = 8
FREE_MIB = 128
SIGNALS = ("sigterm", "sigkill", "sigstop", "sigcont")
# What each kind is, and what it needs on the node.
KINDS = {
    "plain": "a hand-started holder (maybe ignoring SIGTERM, maybe with a forked child holding the context)",
    "orphan": "a launcher's scheduler child, the launcher SIGKILLed (the seeds)",
    "unit": "a systemd service holding the GPU, Restart=always|on-failure|no",
    "container": "a podman (or docker, on a runtimes node) container holding the GPU, --restart=always|on-failure|no, "
                 "with or without --init",
    "supervised": "a program of a real supervisor (supervisord or runit, on a runtimes node), autorestart on, beside "
                  "another program of it: the holder ends; the other program, the supervisor and its unit live",
    "loop": "a respawn loop restarting the holder (depth 1) or a python/bash launcher of it (depth 2); "
            "each start re-titles after import_s and takes the GPU load_s later",
    "protected": "a holder matching protect (^keepme): must live, its GPU stays held, reason protected",
    "daemon": "a holder titled like GPU infrastructure (nv-hostengine, nvidia-persistenced, dcgm-exporter): run by "
             "root it is shielded by identity (lives, its GPU held, reason protected); run by an unprivileged user "
             "under the same title it is not (ends, GPU free)",
    "outscope": "a holder on a GPU not selected: must live, never signalled",
    "monitor": "a bystander with only /dev/nvidiactl open: must live, never signalled",
    "shell": "a bystander shell that started a holder and then only runs other programs: the holder ends, "
             "the shell lives, never signalled",
    "lxc": "a unit of a real LXC guest's own systemd in the node (a runtimes node), Restart=always|on-failure|no: "
           "the module on the node, the host around the guest; a unit that restarts what the host ended keeps its "
           "GPU, and the failure names `lxc-attach -n GUEST -- systemctl stop UNIT`",
    "guest": "the trial's parts (plain, orphan, unit, protected, outscope, monitor) run in the node, and "
             "gpu_reclaim runs on the controller around it (a host around its guest, tests/integration/"
             "test_guests.py): a guest unit that restarts what the host ended keeps its GPU, named",
}
# The parts of a guest trial: what a host sees of a guest. Loops and shells are left out (their
# respawner would be the guest's), containers too (a runtime in a guest is a guest's).
GUEST_PARTS = ("plain", "orphan", "unit", "protected", "outscope", "monitor")
# kind -> what the node must offer, any of (install() reads it from the node)
NEEDS = {"container": ("podman", "docker"), "supervised": ("supervisord", "runit"), "loop": ("load_s",),
         "lxc": ("lxc",)}
def lxc_guest(node):
    """soak_node.GUEST on `node` (the node's hostname is its lab name)."""
    return "gpuops-soak-lxc-%s" % node
RUNTIMES, SUPERVISORS = ("podman", "docker"), ("supervisord", "runit")
# How often each kind is drawn: a podman container on the lab's vfs storage costs about 5 s
# to start and stop, the other parts under 1 s (measured on the 2-core host, seed 1).
WEIGHTS = {"plain": 3, "orphan": 2, "unit": 2, "container": 1, "supervised": 2, "loop": 3, "protected": 1,
           "daemon": 1, "outscope": 1, "monitor": 1, "shell": 2, "lxc": 1}
GUEST_SHARE = 0.1      # of the trials, when "guest" is among the kinds
TITLES = ["python3 run_inference.py --model kimi", "sglang::scheduler_TP0", "[kworker/3:1]", "VLLM::Worker_TP0"]
HOLDING = ("plain", "orphan", "unit", "container", "supervised", "loop", "protected", "daemon", "outscope",
           "shell", "lxc")
INFRA_NAMES = ("nv-hostengine", "nvidia-persistenced", "dcgm-exporter")


# --- shapes (pure) ---------------------------------------------------------------------------


def comeback_s(part):
    """The longest a part could take to hold its GPU again after the run, if anything of it
    brought a holder back: the after-run watch is longer than the slowest part's."""
    if part["kind"] == "loop":
        return part["sleep_s"] + part["import_s"] + part["load_s"]
    if part["kind"] in ("unit", "lxc"):
        # RestartSec=100ms + a Python holder's start: a SIGKILLed holder's unit held its GPU
        # again 0.33-0.56 s later (3 kills, load 6-8 on the 2-core host)
        return 1.0
    if part["kind"] == "container":
        # podman's restart of a --restart=always container whose holder was SIGKILLed: its GPU
        # held again 0.55-0.67 s later (3 kills, same host)
        return 2.0
    if part["kind"] == "supervised":
        # runsv waits 1 s before it starts a service again; supervisord at once; then a
        # Python holder's start
        return 2.0
    return 0.0


def shape(seed, trial, kinds, offered=("podman", "supervisord", "runit"), guest_share=GUEST_SHARE):
    """Trial `trial` of seed `seed`: {"parts": [...], "args": {...}, "watch_s": s}. Pure and
    deterministic (random.Random seeded with the string "SEED-TRIAL") for the same kinds and
    node offer (a container's runtime and a supervisor are drawn from what the node has), and
    the same share of guest trials."""
    rng = random.Random("%d-%d" % (seed, trial))
    host = "guest" in kinds and rng.random() < guest_share
    drawn = [k for k in kinds if k != "guest" and (k in GUEST_PARTS or not host)]
    parts = []
    for _part in range(rng.randint(1, 4)):
        kind = rng.choices(drawn, [WEIGHTS[k] for k in drawn])[0]
        if kind == "container" and any(p["kind"] == "container" for p in parts):
            kind = "plain"      # one container a trial: podman on vfs is the slowest part
        part = {"kind": kind}
        if kind in HOLDING:
            part["mib"] = rng.choice([300, 1000, 4000])
        if kind in ("plain", "orphan", "unit", "protected", "container", "lxc"):
            part["ignore_term"] = rng.random() < 0.3
        if kind == "plain":
            part["title"] = rng.choice(TITLES)
            part["fork_inherit"] = rng.random() < 0.3
        elif kind == "outscope":
            part["title"] = rng.choice(TITLES)
        elif kind in ("unit", "lxc"):
            part["restart"] = rng.choice(["always", "on-failure", "no"])
        elif kind == "container":
            part["runtime"] = rng.choice([r for r in RUNTIMES if r in offered])
            part["restart"] = rng.choice(["always", "on-failure", "no"])
            part["init"] = rng.random() < 0.5
        elif kind == "loop":
            part["depth"] = rng.choice([1, 2])
            if part["depth"] == 2:
                part["launcher"] = rng.choice(["python", "bash"])
            part["sleep_s"] = rng.choice([0.1, 0.3, 1.0])
            part["import_s"] = rng.choice([0.0, 0.5, 1.5])
            part["load_s"] = rng.choice([0.5, 1.0, 2.0])
        elif kind == "daemon":
            part["name"] = rng.choice(INFRA_NAMES)
            part["as_user"] = rng.random() < 0.5
        elif kind == "supervised":
            part["supervisor"] = rng.choice([x for x in SUPERVISORS if x in offered])
        elif kind == "shell":
            part["variant"] = rng.choice(["background", "ran-once"])
        parts.append(part)
    gpus = rng.sample(range(GPUS), sum(1 for p in parts if p["kind"] in HOLDING))
    for part in parts:
        if part["kind"] in HOLDING:
            part["gpu"] = gpus.pop()
    used = {p["gpu"] for p in parts if "gpu" in p}
    outside = {p["gpu"] for p in parts if p["kind"] == "outscope"}
    selected = {p["gpu"] for p in parts if "gpu" in p and p["kind"] != "outscope"}
    idle = sorted(set(range(GPUS)) - used)
    selected |= set(rng.sample(idle, rng.randint(0 if selected else 1, min(2, len(idle)))))
    assert selected and not selected & outside
    args = {"gpus": [str(i) for i in sorted(selected)], "protect": ["^keepme"],
            "term_timeout": rng.choice([1.0, 2.0]), "release_timeout": 5.0, "nvml_timeout": 5.0,
            "lock_timeout": 30.0}
    return {"trial": trial, "seed": seed, "parts": parts, "args": args, "host": host,
            "watch_s": round(max([1.0] + [comeback_s(p) + 1.0 for p in parts]), 2)}


def guest_comes_back(spec, part):
    """In a guest trial, the guest's systemd starts a unit's holder again after the host ended
    it: Restart=always, or on-failure when it took SIGKILL (it ignores SIGTERM; SIGTERM is a
    clean end for on-failure)."""
    guest = part["kind"] == "lxc" or (spec.get("host") and part["kind"] == "unit")
    return guest and (part["restart"] == "always" or (part["restart"] == "on-failure" and part["ignore_term"]))


def shielded(part):
    """A part the module must not end: a protect match, or infrastructure by identity (root's)."""
    return part["kind"] == "protected" or (part["kind"] == "daemon" and not part["as_user"])


def expect(spec, node="node1"):
    """What the shape allows on `node`: the selected GPUs that must end free, those that stay
    held (by whom), and whether the run must succeed."""
    selected = {int(g) for g in spec["args"]["gpus"]}
    held_by_protected = {p["gpu"] for p in spec["parts"] if shielded(p) and p["gpu"] in selected}
    guest_units = {p["gpu"]: ("lxc-attach -n %s -- systemctl stop soak-%d-%d.service"
                              % (lxc_guest(node), spec["trial"], k) if p["kind"] == "lxc" else "soak-%d-%d.service" % (spec["trial"], k))
                   for k, p in enumerate(spec["parts"]) if guest_comes_back(spec, p) and p["gpu"] in selected}
    blocked = held_by_protected | set(guest_units)
    return {"free_gpus": sorted(selected - blocked), "blocked_gpus": sorted(blocked),
            "protected_gpus": sorted(held_by_protected), "guest_units": guest_units, "free": not blocked}


def judge(spec, facts):
    """The trial's failures: {kind: [details]} (empty: the trial passed)."""
    if "shape_error" in facts:
        return {"infra": [facts["shape_error"]]}
    exp = expect(spec, facts.get("node", "node1"))
    result = facts["result"]
    failures = collections.defaultdict(list)
    signalled = {a.get("pid") for a in result.get("actions") or [] if a.get("step") in SIGNALS and a.get("changed")}
    for pid in result.get("soak_signalled_outside_node") or []:
        failures["wrong_kill"].append("controller PID %d, not the node's, was signalled" % pid)
    for p in facts["procs"]:
        label = "%s PID %d (part %d, %s)" % (p["what"], p["pid"], p["part"], spec["parts"][p["part"]]["kind"])
        if p["role"] in ("live", "bystander"):
            if not p["alive"]:
                failures["wrong_kill"].append("%s died" % label)
            elif p["pid"] in signalled:
                failures["wrong_kill"].append("%s was signalled" % label)
        elif p["role"] == "end" and p["alive"]:
            failures["not_ended"].append("%s still alive" % label)
    selected = [int(g) for g in spec["args"]["gpus"]]
    back = [g for g in selected if facts["watch_peak_mib"][g] > FREE_MIB]
    if result.get("free") is True and back:
        failures["early_free"].append("free: true, then GPU %s held again (first at %s s of %s s watched)" % (
            ",".join(map(str, back)), ",".join(str(facts["watch_first_held_s"].get(str(g), 0)) for g in back),
            facts["watched_s"]))
    unfreed = [g for g in exp["free_gpus"] if facts["after_mib"][g] > FREE_MIB]
    if exp["free"] and result.get("free") is not True:
        failures["unfreed"].append("run failed: %s" % (result.get("msg") or "")[:400])
    elif unfreed and not failures["early_free"]:
        failures["unfreed"].append("GPU %s held after the run" % ",".join(map(str, unfreed)))
    if not exp["free"]:
        if result.get("free") is True:
            failures["wrong_reason"].append("free: true while a protected holder keeps GPU %s" % exp["blocked_gpus"])
        protected = {p["pid"] for p in facts["procs"] if p["role"] == "live" and shielded(spec["parts"][p["part"]])}
        remaining = result.get("remaining") or []
        on_blocked = [r for r in remaining if set(r.get("gpus") or []) & set(exp["protected_gpus"])]
        named = {r.get("pid") for r in on_blocked}
        # Besides the protected holders, a process with the device open is named on a GPU still
        # held (it blocks a reset) when the last survey read every process: here only a
        # bystander monitor may be one (nvidiactl).
        bystanders = {p["pid"] for p in facts["procs"] if p["role"] == "bystander"}
        handles = {r.get("pid") for r in on_blocked if r.get("pid") in bystanders
                   and (r.get("reason_code") == "device_open" or "device open" in (r.get("reason") or ""))}
        if named - handles != protected:
            failures["wrong_reason"].append("remaining names PIDs %s on the protected holders' GPUs (handles %s), "
                                            "the protected holders are %s" % (
                                                sorted(x for x in named if x), sorted(handles), sorted(protected)))
        codes = {r.get("reason_code") for r in remaining if r.get("pid") in protected and "reason_code" in r}
        if codes - {"protected"}:
            failures["wrong_reason"].append("reason codes %s for protected holders" % sorted(codes))
        # A guest's unit that restarts what the host ended: the failure names it (the host never
        # stops a guest's unit; its lever is the guest's systemctl).
        for gpu, unit in sorted(exp["guest_units"].items()):
            if unit not in (result.get("msg") or ""):
                failures["wrong_reason"].append("GPU %d: the failure does not name `%s`: %s" % (
                    gpu, unit, (result.get("msg") or "")[:300]))
    for program, state in facts.get("supervised", {}).items():
        if program.endswith("-bystander") and state != "running":
            failures["wrong_kill"].append("supervised program %s is %s (only the holder's program may stop)"
                                          % (program, state))
    for name, state in facts.get("containers", {}).items():
        if state.get("status") == "removed":
            failures["wrong_kill"].append("container %s was removed (stop it, never remove it)" % name)
    if facts.get("cleanup"):
        failures["infra"].append("clean-up left %s" % facts["cleanup"])
    return {kind: found for kind, found in failures.items() if found}


COUNTED = ("wrong_kill", "early_free", "unfreed", "not_ended", "wrong_reason", "infra")


# --- the lab side ----------------------------------------------------------------------------


def lab(*args, timeout=900, stdin=None):
    run = subprocess.run([LAB] + list(args), input=stdin, capture_output=True, timeout=timeout, check=False)
    if run.returncode != 0:
        raise SystemExit("lab %s failed (rc %d):\n%s\n%s" % (
            " ".join(args[:2]), run.returncode, run.stdout.decode()[-2000:], run.stderr.decode()[-2000:]))
    return run.stdout.decode()


def install(node):
    """Copy the module's code (this checkout's plugins, ansible-core's module_utils) and the
    node script to TREE on the node; return what the node offers (podman, fakegpu --load-s)."""
    import ansible
    staging = tempfile.mkdtemp(prefix="bench-soak-")
    try:
        coll = os.path.join(staging, "ansible_collections", "gpuops", "reclaim")
        shutil.copytree(os.path.join(bl.REPO, "plugins"), os.path.join(coll, "plugins"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(os.path.join(os.path.dirname(ansible.__file__), "module_utils"),
                        os.path.join(staging, "ansible", "module_utils"), ignore=shutil.ignore_patterns("__pycache__"))
        open(os.path.join(staging, "ansible", "__init__.py"), "w").close()
        shutil.copy(NODE_SCRIPT, staging)
        tar = subprocess.run(["tar", "-c", "-C", staging, "."], capture_output=True, check=True).stdout
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    lab("exec", node, "rm -rf %s && mkdir -p %s && tar -x -C %s" % (TREE, TREE, TREE), stdin=tar, timeout=120)
    out = lab("exec", node, "for t in podman docker supervisord; do command -v $t >/dev/null && echo $t; done; "
                            "command -v runsvdir >/dev/null && systemctl cat runit.service >/dev/null 2>&1 && echo runit;"
                            "command -v lxc-start >/dev/null && echo lxc; "
                            "fakegpu hold --help | grep -q -- --load-s && echo load_s; true")
    return set(out.split())


def node_record(node):
    with open(os.path.join(os.environ.get("LAB_RUN", "/run/gpuops-lab"), "nodes", "%s.json" % node)) as handle:
        return json.load(handle)


def foreign_nodes():
    """PIDs of systemd-nspawn processes on the controller that are not this lab's nodes.

    A guest trial runs gpu_reclaim on the controller, and the controller is the host of every
    lab's nodes: a holder in another lab's node has its own /dev/nvidiaN open, and from the
    controller that reads as the very path of this node's GPU (one kernel, many stand-in
    drivers; on a real host every guest's /dev/nvidiaN is the host's GPU). The module would
    take it for a holder of the selected GPU and end it. Seen at 21:53 on the shared host:
    another lab's protected holder was named among this node's remaining holders. So guest
    trials run only while no other lab's node is up."""
    mine = set()
    run_dir = os.path.join(os.environ.get("LAB_RUN", "/run/gpuops-lab"), "nodes")
    for name in os.listdir(run_dir) if os.path.isdir(run_dir) else []:
        with open(os.path.join(run_dir, name)) as handle:
            mine.add(json.load(handle).get("nspawn_pid"))
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/comm" % entry) as handle:
                if handle.read().strip() == "systemd-nspawn" and int(entry) not in mine:
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return sorted(found)


def available(kinds, offered, nodes=1):
    """(the kinds that can run here, {left-out kind: what it needs}).

    Guest trials need the controller to themselves for the whole run: this checks at the start
    only, so a lab booted during the run is not seen (this happened beside CI's lab on
    2026-12-02: start no lab while a soak with guest trials runs)."""
    missing = {k: " or ".join(NEEDS[k]) for k in kinds if k in NEEDS and not set(NEEDS[k]) & set(offered)}
    if "guest" in kinds and nodes > 1:
        # This lab's other nodes are as foreign to a guest trial as another lab's: seen on
        # 2026-12-02 with --nodes 2 (a wrong kill and a wrong reason in guest trials on node1
        # while node2 ran its own trials).
        missing["guest"] = "--nodes 1 (from the controller, every node's /dev/nvidiaN reads as this node's)"
    elif "guest" in kinds:
        foreign = foreign_nodes()
        if foreign:
            missing["guest"] = ("no other lab's node on this controller (systemd-nspawn PIDs %s are not this "
                                "lab's)" % ", ".join(map(str, foreign[:5])))
    return [k for k in kinds if k not in missing], missing


def node_pids(pid_ns):
    """{controller PID: node PID} of every process in the node's own PID namespace."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink("/proc/%s/ns/pid" % entry) != pid_ns:
                continue
            with open("/proc/%s/status" % entry) as handle:
                nspid = [line.split()[1:] for line in handle if line.startswith("NSpid:")][0]
        except (OSError, IndexError):
            continue
        found[int(entry)] = int(nspid[-1])
    return found


def to_node_pids(value, pids):
    """The result with every `pid` and `pids` the controller's PID of a node process turned
    into the node's PID (what the node's facts name); others are left as they are."""
    if isinstance(value, list):
        return [to_node_pids(v, pids) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if key == "pid" and isinstance(item, int):
            out[key] = pids.get(item, item)
        elif key == "pids" and isinstance(item, list):
            out[key] = [pids.get(x, x) if isinstance(x, int) else x for x in item]
        else:
            out[key] = to_node_pids(item, pids)
    return out


def host_module(node, spec):
    """gpu_reclaim on the controller around `node` (test_guests.py's arrangement: the stand-in
    driver's state read through the node's root), its result in node PIDs, written into the
    node for soak_node.py to read."""
    record = node_record(node)
    before = node_pids(record["pid_ns"])
    workdir = tempfile.mkdtemp(prefix="bench-soak-host-")
    try:
        args_path = os.path.join(workdir, "args.json")
        with open(args_path, "w") as handle:
            json.dump({"ANSIBLE_MODULE_ARGS": spec["args"]}, handle)
        env = dict(os.environ, PYTHONPATH=bl.COLLECTIONS, LD_LIBRARY_PATH=bl.LIB_DIR,
                   FAKEGPU_ROOT="/proc/%d/root" % record["leader_pid"])
        started = time.monotonic()
        try:
            run = subprocess.run([sys.executable, "-m", "ansible_collections.gpuops.reclaim.plugins.modules.gpu_reclaim",
                                  args_path], cwd=workdir, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                 text=True, timeout=180, check=False)
            try:
                result = json.loads(run.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                result = {"failed": True, "soak_no_result": True,
                          "msg": "soak: no JSON from gpu_reclaim on the controller (rc %d): %s"
                          % (run.returncode, (run.stderr or run.stdout)[-1000:])}
        except subprocess.TimeoutExpired:
            result = {"failed": True, "soak_timeout": True, "msg": "soak: gpu_reclaim on the controller ran past 180 s"}
        took = time.monotonic() - started
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    pids = node_pids(record["pid_ns"])
    pids.update(before)
    # A process the module signalled that is not this node's is another lab's (foreign_nodes):
    # named, and a wrong kill.
    result["soak_signalled_outside_node"] = sorted(
        a["pid"] for a in result.get("actions") or []
        if a.get("step") in SIGNALS and a.get("changed") and a.get("pid") not in pids)
    result = to_node_pids(result, pids)
    result["soak_module_s"] = round(took, 3)
    run_dir = "/proc/%d/root/run/gpuops-soak" % record["leader_pid"]
    path = os.path.join(run_dir, "host-result-%d.json" % spec["trial"])
    with open(path + ".new", "w") as handle:
        json.dump(result, handle)
    os.rename(path + ".new", path)


def run_batch(node, specs, deadline, on_line):
    """Run specs on the node, one JSON line per trial to on_line; bounded by the deadline."""
    path = "%s/specs.json" % TREE
    lab("exec", node, "cat > %s" % path, stdin=json.dumps(specs).encode())
    proc = subprocess.Popen([LAB, "exec", node, "python3 %s/soak_node.py run %s --deadline %.0f"
                             % (TREE, path, deadline)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    hard = deadline + 400        # a trial started just before the deadline ends well before this
    try:
        for line in proc.stdout:
            on_line(json.loads(line))
            if time.time() > hard:
                break
    finally:
        if proc.poll() is None:
            try:
                proc.wait(timeout=max(1, hard - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                lab("exec", node, "python3 %s/soak_node.py cleanup" % TREE, timeout=300)
    return proc.returncode


# --- report ----------------------------------------------------------------------------------


def replay(spec, guest_share=GUEST_SHARE):
    share = "" if guest_share == GUEST_SHARE else " --guest-share %g" % guest_share
    return "bench/run soak --seed %d --only %d%s" % (spec["seed"], spec["trial"], share)


def report(args, seed, trials, started, stopped_by_budget, offered):
    n = len(trials)
    counts = {k: sum(len(t["failures"].get(k, [])) for t in trials) for k in COUNTED}
    failed = [t for t in trials if any(k != "infra" for k in t["failures"])]
    infra = [t for t in trials if "infra" in t["failures"]]
    print("\nSoak: seed %d, %d of %d trials run%s, %.0f s; kinds %s" % (
        seed, n, args.n if not args.only else len(args.only),
        " (the time budget of %d s ended it first)" % args.budget if stopped_by_budget else "",
        time.time() - started, ",".join(args.kinds)))
    by_kind = collections.OrderedDict((k, collections.Counter()) for k in args.kinds)
    for t in trials:
        kinds = {p["kind"] for p in t["spec"]["parts"]} | ({"guest"} if t["spec"].get("host") else set())
        for k in kinds & set(by_kind):
            by_kind[k]["trials"] += 1
            by_kind[k]["failed"] += 1 if any(x != "infra" for x in t["failures"]) else 0
    print("%-10s %7s %7s" % ("kind", "trials", "failed"))
    for k, c in by_kind.items():
        print("%-10s %7d %7d" % (k, c["trials"], c["failed"]))
    print()
    print("%-12s %6s" % ("count", "n"))
    for k in COUNTED:
        print("%-12s %6d" % (k.replace("_", " "), counts[k]))
    times = [t["facts"].get("total_s", 0) for t in trials]
    mod = [t["facts"]["module_s"] for t in trials if "module_s" in t["facts"]]
    if times:
        print("\nper trial: median %.2f s (max %.2f); gpu_reclaim run: median %.2f s (max %.2f)" % (
            statistics.median(times), max(times), statistics.median(mod) if mod else 0, max(mod) if mod else 0))
    for t in failed + [t for t in infra if t not in failed]:
        print("\nFAILED trial %d (seed %d): %s\n  shape: %s\n  replay: %s" % (
            t["spec"]["trial"], seed, json.dumps(t["failures"]), json.dumps(t["spec"]["parts"]),
            replay(t["spec"], args.guest_share)))
    commit = args.commit
    print("\ncommit %s; a trial's shape depends on the code, the kinds and what the node offers (%s): replay "
          "at this commit on the same kind of node" % (commit, ",".join(sorted(offered))))
    path = bl.write_json(args.out, {
        "commit": commit, "seed": seed, "n_requested": args.n, "n_run": n, "budget_s": args.budget,
        "stopped_by_budget": stopped_by_budget, "kinds": args.kinds, "node_offers": sorted(offered),
        "guest_share": args.guest_share,
        "counts": counts, "failed_trials": [t["spec"]["trial"] for t in failed],
        "infra_trials": [t["spec"]["trial"] for t in infra],
        "trials": trials})
    print("\ntrials: %s" % path)
    return counts


def soak(nodes, seed, indices, kinds, budget, batch, log=bl.log, offered=("podman", "supervisord", "runit"),
         guest_share=GUEST_SHARE):
    """Run trials `indices` of `seed` on `nodes` (up and installed; one name or a list), the
    trials dealt round-robin, one thread per node; return (trials, stopped_by_budget)."""
    nodes = [nodes] if isinstance(nodes, str) else list(nodes)
    started = time.time()
    deadline = started + budget
    trials = []
    lock = threading.Lock()
    specs = {i: shape(seed, i, kinds, offered, guest_share) for i in indices}
    errors = []

    def on_line(node, facts):
        if "await_host_module" in facts:
            host_module(node, specs[facts["await_host_module"]])
            return
        spec = specs[facts["trial"]]
        facts = dict(facts, node=node)
        failures = judge(spec, facts)
        with lock:
            trials.append({"spec": spec, "facts": facts, "failures": failures})
            log("trial %d: %s %.1f s  %s%s%s" % (
                facts["trial"], "ok" if not failures else "FAIL " + ",".join(failures), facts.get("total_s", 0),
                "%s " % node if len(nodes) > 1 else "", "guest: " if spec.get("host") else "",
                " ".join(p["kind"] for p in spec["parts"])))

    def worker(node, mine):
        try:
            while mine and time.time() < deadline:
                chunk, mine = mine[:batch], mine[batch:]
                run_batch(node, [specs[i] for i in chunk], deadline, lambda facts: on_line(node, facts))
        except BaseException as exc:   # reported after the other nodes finish
            errors.append("%s: %r" % (node, exc))

    indices = list(indices)
    threads = [threading.Thread(target=worker, args=(node, indices[j::len(nodes)]), daemon=True)
               for j, node in enumerate(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if "lxc" in kinds:
        for node in nodes:     # the LXC guest's tree lives on the controller's disk
            lab("exec", node, "python3 %s/soak_node.py teardown" % TREE, timeout=300)
    if errors:
        raise SystemExit("soak: %s" % "; ".join(errors))
    trials.sort(key=lambda t: t["spec"]["trial"])
    return trials, len(trials) < len(indices)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50, help="trials (default 50)")
    parser.add_argument("--seed", type=int, help="base seed (default: from the clock, printed)")
    parser.add_argument("--only", help="run only these trials of --seed (comma-separated): a replay")
    parser.add_argument("--budget", type=float, default=1800, help="seconds for the whole run (default 1800)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="kinds to draw from (default: all the node offers)")
    parser.add_argument("--batch", type=int, default=25, help="trials per SSH call (default 25)")
    parser.add_argument("--out", default="soak.json", help="file name under bench/results (default soak.json)")
    parser.add_argument("--nodes", type=int, default=1, help="lab nodes to deal the trials over (default 1)")
    parser.add_argument("--keep", action="store_true", help="leave the lab node up afterwards")
    parser.add_argument("--guest-share", type=float, default=GUEST_SHARE,
                        help="share of trials run from the controller around the node, when 'guest' is among "
                             "the kinds (default %g; 1 for a run of guest trials only)" % GUEST_SHARE)
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or args.n < 1 or args.budget <= 0 or args.batch < 1 or not 1 <= args.nodes <= 4:
        parser.error("--kinds: unknown %s (known: %s); --n, --budget and --batch must be positive, --nodes 1..4"
                     % (",".join(unknown) or "none", ",".join(KINDS)))
    if not 0 <= args.guest_share <= 1:
        parser.error("--guest-share %r: a share from 0 to 1" % args.guest_share)
    if args.only and args.seed is None:
        parser.error("--only replays trials of one seed: give --seed too")
    seed = args.seed if args.seed is not None else int(time.time()) % 100000
    only = [int(k) for k in args.only.split(",")] if args.only else None
    for key, value in LAB_DEFAULTS.items():
        os.environ.setdefault(key, value)
    bl.log("lab up %d (LAB_STATE=%s LAB_ADDR_BASE=%s LAB_CONTAINERS=%s LAB_RUNTIMES=%s)" % (
        args.nodes, os.environ["LAB_STATE"], os.environ["LAB_ADDR_BASE"], os.environ.get("LAB_CONTAINERS", ""),
        os.environ.get("LAB_RUNTIMES", "")))
    # The code the nodes run is this checkout as it is now (install copies it): name it now.
    args.commit = subprocess.run(["git", "-C", bl.REPO, "describe", "--always", "--dirty"], capture_output=True,
                                 text=True, check=False).stdout.strip()
    lab("up", str(args.nodes))
    nodes = ["node%d" % i for i in range(1, args.nodes + 1)]
    started = time.time()
    try:
        offered = set.intersection(*[install(node) for node in nodes])
        args.kinds, missing = available(kinds, offered, len(nodes))
        if missing:
            bl.log("left out: %s" % "; ".join("%s (needs %s)" % kv for kv in missing.items()))
        bl.log("seed %d; kinds %s" % (seed, ",".join(args.kinds)))
        args.only = only
        trials, stopped = soak(nodes, seed, only or range(args.n), args.kinds, args.budget, args.batch,
                               offered=offered, guest_share=args.guest_share)
    finally:
        if not args.keep:
            lab("down")
    counts = report(args, seed, trials, started, stopped, offered)
    return 1 if any(counts[k] for k in COUNTED if k != "infra") else 0


if __name__ == "__main__":
    sys.exit(main())
