"""Runs on one lab node for bench/holders_bench.py (sent with `ansible -m script`).

usage: holders_node.py load PROCS FDS FDLOAD   reset the stand-in, start GPU holders and the fd load
       holders_node.py split REPS [BEFORE]      time the module's load and its reads, on the node
       holders_node.py forget                   remove the kept AnsiballZ files
       holders_node.py down                     stop the load and the holders

load: a TP-2 server (parent on GPU 0, a `sglang::scheduler_TP1` child on GPU 1), a holder whose
forked child inherits its fds and mappings (GPU 2), a monitor with only /dev/nvidiactl open, and
`fdload PROCS FDS` (bench/fdload.c, built static on the controller) as a transient unit: PROCS
sleeping processes sharing about FDS open descriptors, as on the field notes' host.

split: the AnsiballZ files of one kept `gpu_holders` and one kept `ping` run (ANSIBLE_KEEP_REMOTE_FILES,
newest under /root/.ansible/tmp) are run here, alternating, REPS times each, with `fuser` on the GPU
files and the import of each module alone from its own payload zip (zipimport compiles every file,
as AnsiballZ does on every run). Prints one JSON line: wall and CPU seconds per sample.
Python 3.9+, stdlib only, run as root on the node.
"""

import base64
import glob
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

GPUS = 4
UNIT = "bench-holders-fdload"
OUT = "/run/bench-holders-fdload.out"
READY = "/run/bench-holders-%s.json"
MONITOR_PIDFILE = "/run/bench-holders-monitor.pid"
MODULES = {"gpu_holders": "ansible_collections.gpuops.reclaim.plugins.modules.gpu_holders",
           "ping": "ansible.modules.ping"}


def start_detached(argv):
    subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def wait_file(path, timeout=120, starts=""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as handle:
                text = handle.read()
            if text.strip() and text.startswith(starts):
                return text
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit("holders_node: %s not written within %d s" % (path, timeout))


def hold(name, args):
    ready = READY % name
    start_detached(["fakegpu", "hold", "--ready-file", ready] + args)
    return json.loads(wait_file(ready))


def down():
    subprocess.run(["systemctl", "stop", UNIT], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False, timeout=60)
    subprocess.run(["systemctl", "reset-failed", UNIT], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False, timeout=60)
    subprocess.run(["lab-reset-gpus", "--gpus", str(GPUS)], stdout=subprocess.DEVNULL, check=True, timeout=120)
    for path in glob.glob(READY % "*") + [MONITOR_PIDFILE, OUT]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def load(procs, fds, fdload):
    down()
    hold("tp", ["--gpu", "0:4000", "--child", "1:4000:sglang::scheduler_TP1", "--title", "sglang::main"])
    hold("fork", ["--gpu", "2:2000", "--fork-inherit", "--title", "trainer"])
    start_detached(["bash", "-c", "echo $$ >%s.new && mv %s.new %s && exec -a gpu-monitor sleep infinity 3</dev/nvidiactl"
                    % (MONITOR_PIDFILE, MONITOR_PIDFILE, MONITOR_PIDFILE)])
    wait_file(MONITOR_PIDFILE)
    files = tempfile.mkdtemp(prefix="bench-holders-files-")
    # Under a shell that waits for it: fdload exits at once when its parent is PID 1 (it dies with
    # whoever started it, and so must not be started by init).
    subprocess.run(["systemd-run", "--unit", UNIT, "--collect", "-p", "LimitNOFILE=1048576",
                    "-p", "StandardOutput=file:" + OUT, "/bin/sh", "-c", '"$@"; exit $?', "sh",
                    fdload, str(procs), str(fds), files],
                   stdout=subprocess.DEVNULL, check=True, timeout=60)
    _ready, started, opened = wait_file(OUT, timeout=300, starts="ready").split()
    nprocs = sum(1 for name in os.listdir("/proc") if name.isdigit())
    print(json.dumps({"fdload_procs": int(started), "fdload_fds": int(opened), "node_procs": nprocs}))


def kept(module, age=0):
    """The newest kept AnsiballZ file of `module` under /root/.ansible/tmp (age 1: the one before)."""
    found = sorted(glob.glob("/root/.ansible/tmp/ansible-tmp-*/AnsiballZ_%s.py" % module), key=os.path.getmtime)
    if len(found) <= age:
        raise SystemExit("holders_node: no kept AnsiballZ_%s.py (run it once with ANSIBLE_KEEP_REMOTE_FILES=1)" % module)
    return found[-1 - age]


def forget():
    for path in glob.glob("/root/.ansible/tmp/ansible-tmp-*"):
        shutil.rmtree(path, ignore_errors=True)


def payload_zip(wrapper, workdir, module):
    """The payload zip embedded in an AnsiballZ wrapper, written to workdir."""
    with open(wrapper) as handle:
        text = handle.read()
    match = re.search(r"zip_data='([A-Za-z0-9+/=]+)'", text) or re.search(r"ZIPDATA = \"\"\"([A-Za-z0-9+/=\n]+)\"\"\"", text)
    if not match:
        raise SystemExit("holders_node: no payload found in %s" % wrapper)
    path = os.path.join(workdir, module + ".zip")
    with open(path, "wb") as handle:
        handle.write(base64.b64decode(match.group(1)))
    return path


IMPORT = "import sys; sys.path.insert(0, sys.argv[1]); __import__(sys.argv[2])"


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv):
    """(wall s, CPU s of the command and what it reaped): on a shared 2-core host the CPU time moves
    far less with the load than the wall time does."""
    started, cpu = time.monotonic(), children_cpu()
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False, timeout=300)
    return time.monotonic() - started, children_cpu() - cpu


def split(reps, before=None):
    workdir = tempfile.mkdtemp(prefix="bench-holders-split-")
    try:
        wrappers = dict((m, kept(m)) for m in MODULES)
        if before:
            wrappers[before] = kept("gpu_holders", age=1)
        zips = dict((m, payload_zip(wrappers[m], workdir, m.replace("@", "-"))) for m in wrappers)
        devices = sorted(glob.glob("/dev/nvidia[0-9]*")) + ["/dev/nvidiactl"]
        runs = {"ping": ["python3", wrappers["ping"]], "ping_load": ["python3", "-c", IMPORT, zips["ping"], MODULES["ping"]]}
        for name in [n for n in wrappers if n != "ping"]:
            runs[name] = ["python3", wrappers[name]]
            runs[name + "_load"] = ["python3", "-c", IMPORT, zips[name], MODULES["gpu_holders"]]
        runs["fuser"] = ["fuser"] + devices
        wall, cpu = dict((name, []) for name in runs), dict((name, []) for name in runs)
        names = list(runs)
        for name in names:           # one untimed round: the page cache (and gpu_bytecode's cache) warm
            timed(runs[name])
        for rep in range(reps):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                took, used = timed(runs[name])
                wall[name].append(round(took, 4))
                cpu[name].append(round(used, 4))
        print(json.dumps({"wall": wall, "cpu": cpu}))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv):
    if len(argv) == 4 and argv[0] == "load":
        load(int(argv[1]), int(argv[2]), argv[3])
    elif len(argv) in (2, 3) and argv[0] == "split":
        split(int(argv[1]), argv[2] if len(argv) == 3 else None)
    elif argv == ["forget"]:
        forget()
    elif argv == ["down"]:
        down()
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
