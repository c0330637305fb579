"""Runs on one lab node for bench/soak_bench.py: builds each trial's owner shape, runs
gpu_reclaim on it, watches what happens after, and cleans up. Python 3.9+, stdlib + pynvml.

usage: soak_node.py run SPECS.json [--deadline EPOCH]   one JSON line per trial on stdout
       soak_node.py cleanup                              end everything a trial may have left
       soak_node.py teardown                             that, and stop the soak's LXC guest

Every process a trial starts runs in a transient unit named soak-<trial>-<part>
(a scope, or the service of a `unit` part) or a podman container of that name, so the
clean-up ends exactly those, by name, and nothing else on the node. Every wait polls with
a bound. This script only gathers facts; bench/soak_bench.py decides what they mean.

The module runs as `python3 -m ansible_collections.gpuops.reclaim.plugins.modules.gpu_reclaim
ARGS.json` from the tree the controller copied to /opt/gpuops-soak (the collection's plugins
and ansible-core's module_utils): the module's own code, without AnsiballZ's wrapper.
"""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time

TREE = "/opt/gpuops-soak"
RUN = "/run/gpuops-soak"
PREFIX = "soak-"
MODULE = "ansible_collections.gpuops.reclaim.plugins.modules.gpu_reclaim"
IMAGE = "localhost/gpuops-lab-base:1"
FREE_MIB = 128
READY_S = 30          # bound for a shape to be in place (never reached when healthy)
MODULE_S = 180        # bound for one gpu_reclaim run
POLL_S = 0.05
IMPORT_IMAGE = (
    "podman image exists %s || { d=$(mktemp -d) && cd \"$d\" && "
    "mkdir -p usr etc proc sys dev tmp run var/lib/fakegpu opt/gpuops-lab etc/fakegpu && "
    "ln -s usr/bin bin && ln -s usr/lib lib && ln -s usr/lib64 lib64 && ln -s usr/sbin sbin && "
    "tar -c . | podman import -q - %s >/dev/null && cd / && rm -rf \"$d\"; }" % (IMAGE, IMAGE))


class ShapeError(Exception):
    """A shape could not be built (the lab's fault, not the module's)."""


def sh(cmd, timeout=60, check=True):
    run = subprocess.run(["bash", "-c", cmd], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=timeout, check=False)
    if check and run.returncode != 0:
        raise ShapeError("%s: rc %d: %s" % (cmd, run.returncode, (run.stderr or run.stdout).strip()[-500:]))
    return run.stdout


def identity(pid):
    """(start time, state) of a PID, or None."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19]), fields[0]


def alive(pid, start):
    found = identity(pid)
    return found is not None and found[0] == start and found[1] not in ("Z", "X")


def wait_for(check, what, timeout=READY_S):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ShapeError("%s: not reached within %s s" % (what, timeout))
        time.sleep(POLL_S)


def read_file(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


class Gpus:
    """Used MiB per GPU through the stand-in NVML (pynvml, as the module reads it). NVML holds
    every device file open while initialised, as the real library does: this observer would be
    a handle holder the module names (a host around the node reads every process). So each
    reading initialises NVML and shuts it down again: nothing of it is open during a run."""

    def __init__(self):
        import pynvml
        self.nvml = pynvml

    def used(self):
        nvml = self.nvml
        nvml.nvmlInit()
        try:
            # v2: "used" without the driver-reserved part, as nvidia-smi shows it and the module reads it
            return [nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i), version=nvml.nvmlMemory_v2).used
                    // (1024 * 1024) for i in range(nvml.nvmlDeviceGetCount())]
        finally:
            nvml.nvmlShutdown()


def scope(name, shell):
    """Run a shell command line detached in scope soak-NAME (not a child of this script: the
    module leaves its own process tree alone, and a real holder is nobody's child here)."""
    subprocess.run(["setsid", "-f", "systemd-run", "--quiet", "--scope", "--collect", "--unit=%s%s" % (PREFIX, name),
                    "--", "bash", "-c", shell], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True, timeout=30)


def hold_cmd(part, ready=None, title=None):
    args = ["fakegpu", "hold", "--gpu", "%d:%d" % (part["gpu"], part["mib"])]
    if title or part.get("title"):
        args += ["--title", title or part["title"]]
    if part.get("ignore_term"):
        args.append("--ignore-term")
    if part.get("fork_inherit"):
        args.append("--fork-inherit")
    if part.get("import_s"):
        args += ["--import-s", str(part["import_s"])]
    if part.get("load_s"):
        args += ["--load-s", str(part["load_s"])]
    if ready:
        args += ["--ready-file", ready]
    return " ".join(shlex.quote(a) for a in args)


def ready_record(path, what):
    return json.loads(wait_for(lambda: read_file(path).strip(), what))


def proc(pid, role, what):
    found = identity(pid)
    if found is None:
        raise ShapeError("%s (PID %d) gone before the run" % (what, pid))
    return {"pid": pid, "start": found[0], "role": role, "what": what}


def holds(gpus, index, mib):
    return lambda: gpus.used()[index] >= mib


def children(pid):
    return [int(p) for p in read_file("/proc/%d/task/%d/children" % (pid, pid)).split()]


# --- the shapes' builders: each returns {"procs": [...], "unit"/"container": name} -------------


def build_plain(name, part, gpus):
    ready = "%s/%s.json" % (RUN, name)
    scope(name, "exec " + hold_cmd(part, ready))
    rec = ready_record(ready, "holder %s ready" % name)
    procs = [proc(rec["pid"], "end", "holder")]
    procs += [proc(pid, "end", "forked child") for pid in rec.get("forked", [])]
    return {"procs": procs}


def build_orphan(name, part, gpus):
    """A launcher whose scheduler child holds the GPU; the launcher SIGKILLed (the seeds)."""
    ready = "%s/%s.json" % (RUN, name)
    cmd = ["fakegpu", "hold", "--title", "python3 -m sglang.launch_server --tp 1", "--exec-name", "python3",
           "--child", "%d:%d:sglang::scheduler_TP0" % (part["gpu"], part["mib"]), "--ready-file", ready]
    if part.get("ignore_term"):
        cmd.append("--ignore-term")
    scope(name, "exec " + " ".join(shlex.quote(a) for a in cmd))
    rec = ready_record(ready, "launcher %s ready" % name)
    procs = [proc(pid, "end", "orphaned scheduler") for pid in rec["spawned"]]
    os.kill(rec["pid"], 9)
    wait_for(lambda: identity(rec["pid"]) is None, "launcher %d reaped" % rec["pid"])
    return {"procs": procs}


def build_unit(name, part, gpus):
    ready = "%s/%s.json" % (RUN, name)
    sh("systemd-run --quiet --unit=%s%s -p Restart=%s -p RestartSec=100ms -- /usr/bin/env %s"
       % (PREFIX, name, part["restart"], hold_cmd(part, ready)))
    rec = ready_record(ready, "unit %s ready" % name)
    return {"procs": [proc(rec["pid"], "end", "unit's holder")], "unit": PREFIX + name + ".service"}


DOCKER_STAND_IN = ("opt/gpuops-lab usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 "
                   "usr/local/bin/fakegpu usr/local/bin/nvidia-smi usr/local/bin/fakeserve")
# docker imports the lab's base tree (bound read-only into a runtimes node) and the stand-in
# (tests/integration/test_docker.py's image); a tag per the stand-in's content.
DOCKER_IMAGE = (
    "set -e; tag=$(cd / && find %s -type f -print0 | sort -z | xargs -0 cat | sha256sum | cut -c1-12); "
    "img=localhost/gpuops-lab-base:$tag; "
    "docker image inspect \"$img\" >/dev/null 2>&1 || "
    "tar -C /opt/gpuops-lab-base -c . -C / %s | docker import - \"$img\" >/dev/null; echo \"$img\""
    % (DOCKER_STAND_IN, DOCKER_STAND_IN))


def build_container(name, part, gpus):
    """A container of the part's runtime (podman, or docker on a runtimes node) whose process
    holds the GPU; with --init the holder is the init's child, else the container's PID 1."""
    devices = " ".join("-v /dev/%s:/dev/%s" % (d, d) for d in sorted(os.listdir("/dev")) if d.startswith("nvidia"))
    ctr = PREFIX + name
    runtime = part.get("runtime", "podman")
    if runtime == "docker":
        image = sh(DOCKER_IMAGE, timeout=300).strip().splitlines()[-1]
        sh("docker run -d --name %s --restart=%s --network host %s %s -v /var/lib/fakegpu:/var/lib/fakegpu "
           "-v /etc/fakegpu:/etc/fakegpu:ro %s %s"
           % (ctr, part["restart"], "--init" if part.get("init") else "", devices, image,
              hold_cmd(part, title="sglang-ctr")), timeout=120)
    else:
        sh(IMPORT_IMAGE, timeout=120)
        sh("podman run -d --name %s --restart=%s %s -v /usr:/usr:ro -v /opt/gpuops-lab:/opt/gpuops-lab:ro "
           "-v /etc/fakegpu:/etc/fakegpu:ro -v /etc/ld.so.cache:/etc/ld.so.cache:ro "
           "-v /var/lib/fakegpu:/var/lib/fakegpu %s %s %s"
           % (ctr, part["restart"], "--init" if part.get("init") else "", devices, IMAGE,
              hold_cmd(part, title="sglang-ctr")), timeout=120)
    wait_for(holds(gpus, part["gpu"], part["mib"]), "container %s holding GPU %d" % (ctr, part["gpu"]))
    pid = int(sh("%s inspect --format '{{.State.Pid}}' %s" % (runtime, ctr)).strip())
    holder = pid if not part.get("init") else wait_for(lambda: (children(pid) or [None])[0], "init's child")
    return {"procs": [proc(holder, "end", "container's holder")], "container": ctr, "runtime": runtime}


BYSTANDER_PROGRAM = "/usr/bin/python3 -c 'import time; time.sleep(100000)'"


def supervised_pid(part, program):
    """The program's PID while its supervisor says it runs, else None."""
    if part["supervisor"] == "supervisord":
        found = re.search(r"RUNNING\s+pid (\d+),", sh("supervisorctl status %s || true" % program, check=False))
    else:
        found = re.match(r"run: \S+ \(pid (\d+)\)", sh("sv status /etc/service/%s 2>/dev/null || true" % program,
                                                       check=False))
    return int(found.group(1)) if found else None


def build_supervised(name, part, gpus):
    """Two programs of a real supervisor (Debian's supervisord, or runit), automatic restart
    on: the holder, and a bystander that must outlive any reclaim of the holder; the
    supervisor (and its systemd unit) must live too."""
    holder, bystander = PREFIX + name + "-holder", PREFIX + name + "-bystander"
    hold = "/usr/local/bin/" + hold_cmd(part, title="sglang-sup")
    unit = "supervisor.service" if part["supervisor"] == "supervisord" else "runit.service"
    sh("systemctl start %s" % unit, timeout=60)   # a trial before may have stopped it
    if part["supervisor"] == "supervisord":
        wait_for(lambda: subprocess.run(["supervisorctl", "pid"], capture_output=True, check=False).returncode == 0,
                 "supervisord answering")
        with open("/etc/supervisor/conf.d/%s.conf" % (PREFIX + name), "w") as handle:
            handle.write("[program:%s]\ncommand=%s\nautorestart=true\nstartsecs=1\n"
                         "[program:%s]\ncommand=%s\nautorestart=true\nstartsecs=1\n"
                         % (holder, hold, bystander, BYSTANDER_PROGRAM))
        sh("supervisorctl update >/dev/null")
    else:
        for service, run in ((holder, hold), (bystander, BYSTANDER_PROGRAM)):
            os.makedirs("/etc/sv/%s" % service, exist_ok=True)
            with open("/etc/sv/%s/run" % service, "w") as handle:
                handle.write("#!/bin/sh\nexec %s\n" % run)
            os.chmod("/etc/sv/%s/run" % service, 0o755)
            os.symlink("/etc/sv/%s" % service, "/etc/service/%s" % service)
    wait_for(holds(gpus, part["gpu"], part["mib"]), "supervised holder %s on GPU %d" % (holder, part["gpu"]))
    main = int(sh("systemctl show -p MainPID --value %s" % unit).strip())
    procs = [proc(wait_for(lambda: supervised_pid(part, holder), "program %s" % holder), "end", "supervised holder"),
             proc(wait_for(lambda: supervised_pid(part, bystander), "program %s" % bystander), "live",
                  "the supervisor's other program"),
             proc(main, "live", "the supervisor (%s MainPID)" % unit)]
    return {"procs": procs, "supervised": [holder, bystander], "supervisor": part["supervisor"]}


def end_supervised():
    """Remove every soak-* program from both supervisors (they stop them), bounded."""
    confs = os.listdir("/etc/supervisor/conf.d") if os.path.isdir("/etc/supervisor/conf.d") else []
    mine = [f for f in confs if f.startswith(PREFIX)]
    for conf in mine:
        os.unlink("/etc/supervisor/conf.d/" + conf)
    if mine:
        sh("systemctl is-active -q supervisor.service && supervisorctl update >/dev/null; true", check=False)
    if os.path.isdir("/etc/service"):
        for service in [s for s in os.listdir("/etc/service") if s.startswith(PREFIX)]:
            sh("sv -w 10 force-shutdown /etc/service/%s >/dev/null 2>&1; rm -f /etc/service/%s; rm -rf /etc/sv/%s; true"
               % (service, service, service), check=False, timeout=30)


# The first start takes the GPU at once (the run begins once the shape is in place); every
# restart after it re-titles after import_s and maps its memory load_s later, as a restarted
# SGLang scheduler does (FIELD_NOTES, H200 third round). The respawner sees the same program
# either way (fakegpu hold under python3).
LOOP = "echo $$ > %s; slow=; while :; do %s; slow=%s; sleep %s; done"


def build_loop(name, part, gpus):
    """A respawn loop: depth 1 restarts the holder itself; depth 2 restarts a launcher
    (python, or bash) that runs the holder and exits when it ends."""
    pidfile = "%s/%s.pid" % (RUN, name)
    fast = dict(part, import_s=0, load_s=0)
    worker = hold_cmd(fast, title="sglang::scheduler_TP0") + " $slow"
    if part["depth"] == 1:
        body = worker
    elif part.get("launcher") == "python":
        body = "python3 -c %s %s" % (shlex.quote("import subprocess, sys\nsys.exit(subprocess.call(sys.argv[1:]))"),
                                     worker)
    else:
        body = "bash -c %s launcher %s" % (shlex.quote('"$@"; exit $?'), worker)
    slow = shlex.quote("--import-s %s --load-s %s" % (part["import_s"], part["load_s"]))
    scope(name, LOOP % (pidfile, body, slow, part["sleep_s"]))
    wait_for(holds(gpus, part["gpu"], part["mib"]), "loop %s holding GPU %d" % (name, part["gpu"]))
    loop = int(read_file(pidfile))
    procs = [proc(loop, "end", "respawn loop")]
    level = children(loop)
    for depth in range(part["depth"]):
        what = "holder" if depth == part["depth"] - 1 else "launcher"
        procs += [proc(pid, "end", what) for pid in level]
        level = [c for pid in level for c in children(pid)]
    return {"procs": procs}


def build_protected(name, part, gpus):
    ready = "%s/%s.json" % (RUN, name)
    scope(name, "exec " + hold_cmd(part, ready, title="keepme-notebook"))
    rec = ready_record(ready, "protected holder %s ready" % name)
    return {"procs": [proc(rec["pid"], "live", "protected holder")]}


# A real LXC guest in the node (a runtimes node: Debian's lxc), booted once and kept across
# trials by the node's lab-lxc-guest (tests/lab/node/lab-lxc-guest, as tests/integration/test_lxc.py
# boots its guest): the module runs on the node, the host around the guest, and sees the guest's
# processes under /lxc.payload.GUEST.
# One name per node: lxc reaches a running guest through an abstract socket named by its name, in
# the network namespace every lab node shares, so two nodes' guests of one name collide (seed 3003
# at 79ccc10: node1 read node2's guest as its own and every node1 lxc trial waited 90 s, infra).
GUEST = "gpuops-soak-lxc-" + socket.gethostname()


def in_guest(cmd):
    return "lxc-attach -n %s -- %s" % (GUEST, cmd)


def build_lxc(name, part, gpus):
    """A unit of the LXC guest's own systemd (Restart= as drawn) holding the GPU."""
    sh("lab-lxc-guest up %s" % GUEST, timeout=150)
    unit = PREFIX + name + ".service"
    sh(in_guest("systemd-run --quiet --unit=%s -p Restart=%s -p RestartSec=100ms /opt/gpuops-lab/fakegpu/%s"
                % (unit, part["restart"], hold_cmd(part, title="sglang-guest"))))
    wait_for(holds(gpus, part["gpu"], part["mib"]), "guest unit %s holding GPU %d" % (unit, part["gpu"]))
    suffix = "/lxc.payload.%s/system.slice/%s" % (GUEST, unit)
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()
            and any(line.endswith(suffix) for line in read_file("/proc/%s/cgroup" % p).splitlines())]
    return {"procs": [proc(pid, "end", "guest unit's holder") for pid in pids]}


def end_guest_units():
    if "RUNNING" in sh("lxc-info -n %s -s 2>/dev/null || true" % GUEST, check=False):
        sh(in_guest("sh -c %s" % shlex.quote(
            "for u in $(systemctl list-units --all --plain --no-legend '%s*' | awk '{print $1}'); do "
            "systemctl kill -s KILL $u; systemctl stop $u; systemctl reset-failed $u; done >/dev/null 2>&1; true"
            % PREFIX)), check=False, timeout=60)


def teardown():
    """Stop the LXC guest and remove its tree (the end of a soak)."""
    sh("lab-lxc-guest down %s" % GUEST, check=False, timeout=150)


USER, USER_UID = "soakuser", 1990
USER_RUN = RUN + "/user"


def build_daemon(name, part, gpus):
    """A holder named like GPU infrastructure (nv-hostengine, ...). Run by root (four uids 0,
    its exe owned by root) the name shields it; run by an unprivileged user with the very same
    name it does not (a name a user chose never shields: the trust boundary)."""
    ready = "%s/%s.json" % (USER_RUN, name)
    sh("mkdir -p %s && chmod 1777 %s" % (USER_RUN, USER_RUN))
    cmd = hold_cmd(part, ready, title=part["name"])
    if part["as_user"]:
        # A real driver lets every user make a context; the stand-in keeps its books here.
        sh("id -u %s >/dev/null 2>&1 || useradd -M -u %d %s; chmod 1777 /var/lib/fakegpu/alloc /var/lib/fakegpu/dead"
           % (USER, USER_UID, USER))
        cmd = "setpriv --reuid=%d --regid=%d --clear-groups %s" % (USER_UID, USER_UID, cmd)
    scope(name, "exec " + cmd)
    rec = ready_record(ready, "%s holder %s ready" % (part["name"], name))
    if part["as_user"]:
        return {"procs": [proc(rec["pid"], "end", "a user's holder titled %s" % part["name"])]}
    return {"procs": [proc(rec["pid"], "live", "infrastructure daemon %s (root)" % part["name"])]}


def build_outscope(name, part, gpus):
    ready = "%s/%s.json" % (RUN, name)
    scope(name, "exec " + hold_cmd(part, ready))
    rec = ready_record(ready, "holder %s ready" % name)
    return {"procs": [proc(rec["pid"], "live", "holder of a GPU not selected")]}


def build_monitor(name, part, gpus):
    pidfile = "%s/%s.pid" % (RUN, name)
    scope(name, "echo $$ > %s; exec -a gpu-monitor sleep infinity 3</dev/nvidiactl" % pidfile)
    pid = int(wait_for(lambda: read_file(pidfile).strip(), "monitor %s" % name))
    wait_for(lambda: os.path.exists("/proc/%d/fd/3" % pid) and identity(pid) and
             "gpu-monitor" in read_file("/proc/%d/cmdline" % pid), "monitor %s exec'd" % name)
    return {"procs": [proc(pid, "bystander", "monitor (nvidiactl only)")]}


def build_shell(name, part, gpus):
    """A user's shell that started the holder and then only runs other programs: a bystander."""
    pidfile = "%s/%s.pid" % (RUN, name)
    if part.get("variant") == "ran-once":
        body = "%s; while :; do sleep 0.2; cat /proc/loadavg >/dev/null; done" % hold_cmd(part)
    else:
        body = "%s & while :; do sleep 0.2; done" % hold_cmd(part)
    scope(name, "echo $$ > %s; %s" % (pidfile, body))
    wait_for(holds(gpus, part["gpu"], part["mib"]), "shell %s's holder on GPU %d" % (name, part["gpu"]))
    shell = int(read_file(pidfile))
    procs = [proc(shell, "bystander", "shell running other programs")]
    holder = [p for p in children(shell) if "fakegpu" in read_file("/proc/%d/cmdline" % p)
              or "python" in read_file("/proc/%d/comm" % p)]
    procs += [proc(p, "end", "holder started by the shell") for p in holder]
    return {"procs": procs}


BUILDERS = {"plain": build_plain, "orphan": build_orphan, "unit": build_unit, "container": build_container,
            "supervised": build_supervised, "daemon": build_daemon, "lxc": build_lxc,
            "loop": build_loop, "protected": build_protected, "outscope": build_outscope,
            "monitor": build_monitor, "shell": build_shell}


# --- a trial ---------------------------------------------------------------------------------


def run_module(args):
    path = "%s/args.json" % RUN
    with open(path, "w") as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
    started = time.monotonic()
    try:
        run = subprocess.run([sys.executable, "-m", MODULE, path], cwd="/", stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=MODULE_S, check=False,
                             env=dict(os.environ, PYTHONPATH=TREE))
    except subprocess.TimeoutExpired:
        return {"failed": True, "msg": "soak: gpu_reclaim ran past %d s" % MODULE_S, "soak_timeout": True}, \
            time.monotonic() - started
    took = time.monotonic() - started
    try:
        return json.loads(run.stdout.strip().splitlines()[-1]), took
    except (ValueError, IndexError):
        return {"failed": True, "msg": "soak: no JSON from gpu_reclaim (rc %d): %s"
                % (run.returncode, (run.stderr or run.stdout)[-1000:]), "soak_no_result": True}, took


def await_host_module(spec, built):
    """A guest trial: the module runs on the controller, around this node (as on a Proxmox host
    around its LXC guest). Say which processes the shape has, then wait (bounded) for the
    controller to drop the module's result, PIDs translated to this node's, into RUN."""
    path = "%s/host-result-%d.json" % (RUN, spec["trial"])
    print(json.dumps({"await_host_module": spec["trial"],
                      "procs": [p["pid"] for s in built for p in s["procs"]]}), flush=True)
    started = time.monotonic()
    try:
        text = wait_for(lambda: read_file(path).strip(), "the controller's gpu_reclaim result", timeout=MODULE_S + 60)
    except ShapeError:
        return {"failed": True, "msg": "soak: no result from the controller's gpu_reclaim",
                "soak_no_result": True}, time.monotonic() - started
    result = json.loads(text)
    return result, result.pop("soak_module_s", time.monotonic() - started)


def unit_state(unit):
    return sh("systemctl is-active %s || true" % unit, check=False).strip()


def container_state(runtime, ctr):
    out = sh("%s inspect --format '{{.State.Status}} {{.RestartCount}}' %s 2>/dev/null || echo removed 0"
             % (runtime, ctr), check=False).split()
    return {"status": out[0], "restarts": int(out[1])} if len(out) == 2 else {"status": "unknown"}


def trial(spec, gpus):
    t0 = time.monotonic()
    facts = {"trial": spec["trial"], "seed": spec["seed"]}
    built = []
    try:
        os.makedirs(RUN, exist_ok=True)
        for k, part in enumerate(spec["parts"]):
            name = "%d-%d" % (spec["trial"], k)
            shape = BUILDERS[part["kind"]](name, part, gpus)
            shape["part"] = k
            built.append(shape)
        facts["before_mib"] = gpus.used()
        facts["build_s"] = round(time.monotonic() - t0, 3)

        result, took = await_host_module(spec, built) if spec.get("host") else run_module(spec["args"])
        facts["module_s"] = round(took, 3)
        facts["result"] = {k: result.get(k) for k in ("free", "failed", "msg", "actions", "remaining", "elapsed_s",
                                                      "soak_timeout", "soak_no_result", "soak_signalled_outside_node")}
        facts["alive_after_run"] = {str(p["pid"]): alive(p["pid"], p["start"]) for s in built for p in s["procs"]}

        # After the run: watch the selected GPUs for longer than the slowest comeback any part
        # could make (a respawn's restart pause + import + load, a unit's RestartSec, a
        # container's restart), polling; record the most each GPU held.
        watch_s = spec["watch_s"]
        peak = gpus.used()
        first_back = {}
        w0 = time.monotonic()
        while time.monotonic() - w0 < watch_s:
            used = gpus.used()
            for i, mib in enumerate(used):
                peak[i] = max(peak[i], mib)
                if mib > FREE_MIB and i not in first_back:
                    first_back[i] = round(time.monotonic() - w0, 3)
            time.sleep(0.1)
        facts["after_mib"] = gpus.used()
        facts["watch_peak_mib"] = peak
        facts["watch_first_held_s"] = {str(k): v for k, v in first_back.items()}
        facts["watched_s"] = round(time.monotonic() - w0, 3)
        facts["procs"] = [dict(p, part=s["part"], alive=alive(p["pid"], p["start"])) for s in built
                          for p in s["procs"]]
        facts["units"] = {s["unit"]: unit_state(s["unit"]) for s in built if "unit" in s}
        facts["containers"] = {s["container"]: container_state(s["runtime"], s["container"])
                               for s in built if "container" in s}
        facts["supervised"] = {p: ("running" if supervised_pid(spec["parts"][s["part"]], p) else "down")
                               for s in built if "supervised" in s for p in s["supervised"]}
    except ShapeError as exc:
        facts["shape_error"] = str(exc)
    except subprocess.TimeoutExpired as exc:
        facts["shape_error"] = "timed out: %s" % exc
    c0 = time.monotonic()
    facts["cleanup"] = cleanup(gpus)
    facts["cleanup_s"] = round(time.monotonic() - c0, 3)
    facts["total_s"] = round(time.monotonic() - t0, 3)
    return facts


def cleanup(gpus=None):
    """End the containers, units and scopes named soak-*, by name; then wait (bounded) for the
    stand-in GPUs to be idle. Returns what was left, if anything."""
    for runtime in ("podman", "docker"):
        if not os.path.exists("/usr/bin/" + runtime):
            continue
        names = sh("%s ps -a --format '{{.Names}}'" % runtime, check=False).split()
        mine = [n for n in names if n.startswith(PREFIX)]
        if mine:
            sh("%s rm -f %s %s >/dev/null 2>&1 || true" % (runtime, "-t 0" if runtime == "podman" else "",
                                                           " ".join(mine)), timeout=120, check=False)
    end_supervised()
    end_guest_units()
    units = sh("systemctl list-units --all --plain --no-legend '%s*' | awk '{print $1}'" % PREFIX,
               check=False).split()
    for unit in units:
        sh("systemctl kill -s KILL %s >/dev/null 2>&1; systemctl stop %s >/dev/null 2>&1; "
           "systemctl reset-failed %s >/dev/null 2>&1; true" % (unit, unit, unit), check=False)
    left = {}
    if gpus is not None:
        try:
            wait_for(lambda: all(m <= FREE_MIB for m in gpus.used()), "GPUs idle after clean-up", timeout=20)
        except ShapeError:
            left["used_mib"] = gpus.used()
    left_units = sh("systemctl list-units --plain --no-legend '%s*' | awk '{print $1}'" % PREFIX,
                    check=False).split()
    if left_units:
        left["units"] = left_units
    sh("rm -rf %s/*" % RUN, check=False)
    return left


def main(argv):
    if argv[:1] == ["cleanup"]:
        print(json.dumps(cleanup()))
        return 0
    if argv[:1] == ["teardown"]:
        cleanup()
        teardown()
        return 0
    if len(argv) < 2 or argv[0] != "run":
        raise SystemExit(__doc__)
    with open(argv[1]) as handle:
        specs = json.load(handle)
    deadline = float(argv[argv.index("--deadline") + 1]) if "--deadline" in argv else None
    gpus = Gpus()
    cleanup(gpus)
    for spec in specs:
        if deadline is not None and time.time() > deadline:
            break
        print(json.dumps(trial(spec, gpus)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
