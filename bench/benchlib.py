"""Shared helpers of the benchmarks: paths, the stand-in GPU root, process groups, cleanup.

Every process a benchmark starts is in a process group it owns (or a PID namespace it
owns) and is SIGKILLed at exit, on Ctrl-C, on SIGTERM and on failure.
"""
import atexit
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(BENCH)
FAKEGPU_DIR = os.path.join(REPO, "tests", "fakegpu")
FAKEGPU = os.path.join(FAKEGPU_DIR, "fakegpu")
NVIDIA_SMI = os.path.join(FAKEGPU_DIR, "nvidia-smi")
LIB_DIR = os.path.join(FAKEGPU_DIR, "build")
COLLECTIONS = os.path.join(REPO, ".build", "collections")
RESULTS = os.path.join(BENCH, "results")


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def ensure_stand_in_env(prefix):
    """Re-exec this script with FAKEGPU_ROOT (a fresh temp dir) and the stand-in library on
    LD_LIBRARY_PATH: the dynamic loader reads LD_LIBRARY_PATH only at process start, and
    pynvml dlopens libnvidia-ml.so.1 at nvmlInit()."""
    if os.environ.get("BENCH_STAND_IN") == "1":
        return os.environ["FAKEGPU_ROOT"]
    if not os.path.exists(os.path.join(LIB_DIR, "libnvidia-ml.so.1")):
        subprocess.run(["make", "-s", "-C", FAKEGPU_DIR], check=True)
    root = tempfile.mkdtemp(prefix=prefix)
    env = dict(os.environ, BENCH_STAND_IN="1", FAKEGPU_ROOT=root,
               LD_LIBRARY_PATH=LIB_DIR + (":" + os.environ["LD_LIBRARY_PATH"]
                                          if os.environ.get("LD_LIBRARY_PATH") else ""))
    env["PYTHONPATH"] = COLLECTIONS + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)
    return None  # not reached


def import_collection(collections=COLLECTIONS):
    """gpu_flow and gpu_observe of the collection under `collections` (this checkout's link by
    default; a tree from collection_at for an older commit)."""
    if collections not in sys.path:
        sys.path.insert(0, collections)
    link = os.path.join(collections, "ansible_collections", "gpuops", "reclaim")
    if not os.path.exists(link):
        raise SystemExit("collection link %s missing: run `make collection-link`" % link)
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_flow, gpu_observe
    return gpu_flow, gpu_observe


def collection_at(ref, parent):
    """The collection's playbooks, roles, plugins and metadata as of git commit REF, extracted
    to PARENT/ansible_collections/gpuops/reclaim; returns that path."""
    tree = os.path.join(parent, "ansible_collections", "gpuops", "reclaim")
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", REPO, "archive", ref, "galaxy.yml", "meta", "plugins", "roles",
                              "playbooks"], capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit("--before %s: git archive failed: %s" % (ref, archive.stderr.decode()))
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    return tree


class Reaper:
    """Kills every process group / process registered with it, once, at the end.

    Installed for normal exit (atexit), SIGINT and SIGTERM (turned into SystemExit so
    `finally` blocks run), and raised exceptions.
    """

    def __init__(self):
        self.groups = []
        self.pids = []
        self.paths = []
        self.done = False
        atexit.register(self.cleanup)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, _frame):
        raise SystemExit(128 + signum)

    def group(self, pgid):
        self.groups.append(pgid)

    def pid(self, pid):
        self.pids.append(pid)

    def path(self, path):
        self.paths.append(path)

    def cleanup(self):
        if self.done:
            return
        self.done = True
        for pgid in self.groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        # Reap our own children so nothing is left as a zombie.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                pid, _unused = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.02)
        # Orphans of a killed group are reaped by init: wait until the groups are empty, so
        # the next benchmark does not scan our dying load.
        for pgid in self.groups:
            while time.monotonic() < deadline:
                try:
                    os.killpg(pgid, 0)
                except (ProcessLookupError, PermissionError):
                    break
                time.sleep(0.05)
        for path in self.paths:
            shutil.rmtree(path, ignore_errors=True)


# Runs a command as the child of a shell, not of the benchmark: gpu_holders leaves out the
# module's own children (nvidia-smi, systemctl), so a holder must not be ours directly.
STRANGER = ["/bin/sh", "-c", '"$@" & wait', "stranger"]


def fakegpu(root, *args, check=True):
    env = dict(os.environ, FAKEGPU_ROOT=root)
    return subprocess.run([sys.executable, FAKEGPU] + list(args), env=env, capture_output=True,
                          text=True, check=check, timeout=60)


def start_hold(root, reaper, args, name, python=None, wait=60):
    """`fakegpu hold ARGS` in its own process group; returns its ready record."""
    ready = os.path.join(root, "ready-%s.json" % name)
    cmd = [python or sys.executable, FAKEGPU, "hold", "--ready-file", ready] + list(args)
    proc = subprocess.Popen(STRANGER + cmd, env=dict(os.environ, FAKEGPU_ROOT=root), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    reaper.group(proc.pid)
    deadline = time.monotonic() + wait
    while not os.path.exists(ready):
        if proc.poll() is not None:
            raise RuntimeError("fakegpu hold %s exited %s: %s"
                               % (" ".join(args), proc.returncode, proc.stderr.read().decode()))
        if time.monotonic() > deadline:
            raise RuntimeError("fakegpu hold %s not ready after %ss" % (" ".join(args), wait))
        time.sleep(0.02)
    with open(ready) as handle:
        record = json.load(handle)
    record["popen"] = proc
    return record


def stats(samples):
    return {"median_s": statistics.median(samples), "min_s": min(samples),
            "max_s": max(samples), "n": len(samples), "samples_s": samples}


def device_files(root):
    return sorted(glob.glob(os.path.join(root, "dev", "nvidia*")))


def write_json(name, data):
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, name)
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)
    return path
