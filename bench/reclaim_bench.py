"""Reclaim benchmark: the collection's Ladder (gpu_reclaim's flow) against the seeds' manual
kill sequence, on the same seed-like wedge of the stand-in driver.

Each trial runs in its own PID namespace (`unshare --pid --fork --mount-proc`), where only
the scenario lives: `pkill -9 python3` and `fuser -k` there cannot reach the benchmark, the
host or other people's processes, and the whole namespace dies with the trial.

The wedge (8 stand-in GPUs, 81,920 MiB each):
  - a TP-8 server: `fakegpu hold --child 0:70000:sglang::scheduler_TP0 ... 7:...TP7`, whose
    parent (titled `python3 -m sglang.launch_server`) is SIGKILLed: 8 orphans, one per GPU;
  - `python3 run_inference.py` holding 6,000 MiB on GPU 2 and ignoring SIGTERM;
  - a stray holder titled `[kworker/3:1]` holding 6,000 MiB on GPU 5;
  - innocents: `gpu-monitor` with only nvidiactl open, and an unrelated `python3`.

With `--shape ranks` (issue 19 item 6, tests/gpu s12's shape): 24 ranks of 1,024 MiB on GPU 0,
all ignoring SIGTERM, started by one launcher shell that waits for them (as torchrun or a server's
parent does), on stand-in GPUs whose every context also uses 6 MiB that NVML charges to no process
(`fakegpu setup --context-uncharged-mib`; a real H200 with 24 such ranks: 141 MiB, more than
gpu_reclaim's default free_threshold_mib of 128). Methods ladder, force and blind (a SIGKILL of
every rank at once from the driver, s12's floor). `--shape s12`: the same ranks, children of
the driver, which runs the Ladder in a forked child, so their parent is an ancestor of the
Ladder's process, as tests/gpu s12's runner is of the module (no supervisor chain, no respawn
watch), and the Ladder gets `match: ['rank']`, as s12 passes its run id.

Methods, alternated trial by trial:
  ladder   Ladder(Surveyor(dev_dir=ROOT/dev), term_timeout=5)      (gpu_reclaim defaults otherwise)
  manual   pkill -f run_inference; sleep 1; pkill -9 -f sglang; sleep 3; pkill -9 python3;
           sleep 2; fuser -k ROOT/dev/nvidia*; sleep 2                 (the seeds' sequence)
  force    Ladder(..., force=True)                                      (no grace: "all levers")
  blind    os.kill(rank, SIGKILL) for every rank                        (--shape ranks/s12: the floor)
  ladder@REF, force@REF   with --before REF: the same, with plugins/ as of git commit REF

Time to free is measured from outside the namespace by polling the stand-in NVML every 20 ms,
from the moment the driver starts the method: for the Ladder that includes importing the
collection's module_utils (compiled from source, as AnsiballZ runs them on a managed host),
building the Surveyor, and Ladder.run; each is also timed on its own.

    bench/reclaim_bench.py [--reps 3] [--methods ladder,manual,force] [--term-timeout 5]
                           [--before REF]

Prints a table and writes bench/results/reclaim.json. No assertion on time.
"""
import argparse
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import benchlib as bl  # noqa: E402

GPUS = 8
GPU_MIB = 81920
TP_MIB = 70000
SIDE_MIB = 6000
FREE_MIB = 128          # gpu_reclaim's default free_threshold_mib
SETTLE_S = 3.0          # after a method returns: how long to wait for memory to come back
RANKS, RANK_MIB = 24, 1024   # --shape ranks: tests/gpu s12's 24 x 1 GiB
# Per live context, MiB that NVML charges to no process: a real H200 (driver 580) used 8 MiB more
# than its process list for 1 context, 14 for 2, 49 for 8, 141 for 24 (tests/gpu reports).
RANK_UNCHARGED_MIB = 6

MANUAL = ("pkill -f run_inference; sleep 1; pkill -9 -f sglang; sleep 3; pkill -9 python3; "
          "sleep 2; fuser -k {dev}/nvidia* 2>/dev/null; sleep 2\n")

INNOCENT = r"""
import ctypes, os, sys, time
name, fd_path, pidfile = sys.argv[1], sys.argv[2], sys.argv[3]
if name != "python3":
    ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)
if fd_path != "-":
    keep = os.open(fd_path, os.O_RDONLY)
with open(pidfile + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(pidfile + ".tmp", pidfile)
while True:
    time.sleep(3600)
"""


def set_comm(name):
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def nvml_used():
    """Used MiB (excluding reserved) per GPU index, through the stand-in NVML."""
    import pynvml
    pynvml.nvmlInit()
    try:
        used = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            used.append(pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used >> 20)
        return used
    finally:
        pynvml.nvmlShutdown()


def held(used):
    return [i for i, mib in enumerate(used) if mib > FREE_MIB]


# --- inside the namespace ----------------------------------------------------------------

def identity(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19]), fields[0]
    except (OSError, IndexError, ValueError):
        return None


def alive(pid, start):
    ident = identity(pid)
    return ident is not None and ident[0] == start and ident[1] != "Z"


def start_innocent(root, name, fd_path):
    pidfile = os.path.join(root, "innocent-%s.pid" % name)
    subprocess.Popen(bl.STRANGER + ["/usr/bin/python3", "-c", INNOCENT, name, fd_path, pidfile],
                     stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not os.path.exists(pidfile):
        if time.monotonic() > deadline:
            raise RuntimeError("innocent %s did not start" % name)
        time.sleep(0.02)
    pid = int(open(pidfile).read())
    return {"name": name, "pid": pid, "start": identity(pid)[0]}


def build_wedge(root):
    """The seed-like wedge; returns the processes to watch."""
    dev = os.path.join(root, "dev")

    class _Reg:   # inside the namespace everything dies with it; nothing to register
        def group(self, _unused):
            pass

    reg = _Reg()
    py = "/usr/bin/python3"   # comm "python3", as on the seeds' hosts
    kids = []
    for i in range(GPUS):
        kids += ["--child", "%d:%d:sglang::scheduler_TP%d" % (i, TP_MIB, i)]
    tp = bl.start_hold(root, reg, kids + ["--title", "python3 -m sglang.launch_server --tp 8",
                                          "--exec-name", "python3"], "tp8", python=py)
    term = bl.start_hold(root, reg, ["--gpu", "2:%d" % SIDE_MIB, "--ignore-term", "--title",
                                     "python3 run_inference.py --model kimi",
                                     "--exec-name", "python3"], "noterm", python=py)
    stray = bl.start_hold(root, reg, ["--gpu", "5:%d" % SIDE_MIB, "--title", "[kworker/3:1]"],
                          "stray", python=py)
    os.kill(tp["pid"], signal.SIGKILL)          # the seeds: parent gone, TP workers orphaned
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ident = identity(tp["pid"])
        if ident is None or ident[1] == "Z":
            break
        time.sleep(0.01)
    innocents = [start_innocent(root, "gpu-monitor", os.path.join(dev, "nvidiactl")),
                 start_innocent(root, "python3", "-")]
    holders = [{"name": "sglang::scheduler_TP%d" % i, "pid": p["pid"], "start": p["start_time"]}
               for i, p in enumerate(tp["processes"])]
    holders += [{"name": "run_inference (ignores TERM)", "pid": term["pid"],
                 "start": term["start_time"]},
                {"name": "[kworker/3:1] stray", "pid": stray["pid"], "start": stray["start_time"]}]
    return holders, innocents


def build_ranks(root, shape):
    """RANKS ranks on GPU 0, each ignoring SIGTERM; returns the ranks, and no innocents. `ranks`:
    children of one launcher shell that waits for them (a live ancestor the Ladder watches for a
    respawn until it exits after its ranks). `s12`: children of this driver, which runs the Ladder
    in a child of its own (run_ladder), so the ranks' parent is an ancestor of the Ladder's
    process, as the suite's runner is of the module in tests/gpu s12."""
    hold = [sys.executable, bl.FAKEGPU, "hold", "--gpu", "0:%d" % RANK_MIB, "--ignore-term",
            "--exec-name", "python3"]
    errors = os.path.join(root, "ranks-stderr.txt")
    with open(errors, "w") as stderr:
        if shape == "s12":
            for i in range(RANKS):
                subprocess.Popen(hold + ["--ready-file", os.path.join(root, "ready-rank%d.json" % i), "--title",
                                         "python3 rank %d" % i], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=stderr, env=dict(os.environ, FAKEGPU_ROOT=root))
        else:
            script = " ".join("%s --ready-file %s --title 'python3 rank %d' &" % (
                " ".join(hold), os.path.join(root, "ready-rank%d.json" % i), i) for i in range(RANKS))
            subprocess.Popen(["/bin/sh", "-c", script + " wait"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=stderr, env=dict(os.environ, FAKEGPU_ROOT=root))
    ranks = []
    deadline = time.monotonic() + 60
    for i in range(RANKS):
        ready = os.path.join(root, "ready-rank%d.json" % i)
        while not os.path.exists(ready):
            if time.monotonic() > deadline:
                with open(errors) as handle:
                    raise RuntimeError("rank %d not ready after 60 s: %s" % (i, handle.read()[-2000:]))
            time.sleep(0.02)
        with open(ready) as handle:
            record = json.load(handle)
        ranks.append({"name": "rank %d" % i, "pid": record["pid"], "start": record["start_time"]})
    return ranks, []


def in_child(fn):
    """fn() in a forked child (its result through a pipe): the Ladder of --shape s12, whose
    ancestors include the ranks' parent."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        code = 0
        try:
            os.write(write_end, json.dumps(fn()).encode())
        except BaseException:  # noqa: B902 - say what failed, in the parent
            import traceback
            os.write(write_end, json.dumps({"error": traceback.format_exc()}).encode())
            code = 1
        os._exit(code)
    os.close(write_end)
    data = b""
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        data += chunk
    os.close(read_end)
    os.waitpid(child, 0)
    detail = json.loads(data)
    if "error" in detail:
        raise RuntimeError(detail["error"])
    return detail


def run_blind(holders):
    """s12's floor: SIGKILL every rank at once, no check of anything."""
    for holder in holders:
        os.kill(holder["pid"], signal.SIGKILL)
    return {}


def run_ladder(root, term_timeout, force, collections, profile=None, match=None):
    started = time.monotonic()
    flow, _unused = bl.import_collection(collections)
    imported = time.monotonic()
    surveyor = flow.Surveyor(dev_dir=os.path.join(root, "dev"), nvml_timeout=10)
    built = time.monotonic()
    ladder = flow.Ladder(surveyor, term_timeout=term_timeout, release_timeout=10, passes=3,
                         force=force, match=match)
    if profile:
        import cProfile
        import io
        import pstats
        prof = cProfile.Profile()
        res = prof.runcall(ladder.run)
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(45)
        with open(profile, "a") as handle:
            handle.write("=== %s, first signal at %s s\n%s\n" % (
                "force" if force else "ladder", min([a["at_s"] for a in res["actions"]
                                                     if a["step"] in ("sigterm", "sigkill")], default=None),
                text.getvalue()))
    else:
        res = ladder.run()
    signals = [a["at_s"] for a in res["actions"] if a["step"] in ("sigterm", "sigkill")]
    return {"ladder_free": res["free"], "ladder_elapsed_s": res["elapsed_s"],
            "import_s": imported - started, "surveyor_s": built - imported,
            # when the first and the last signal's action were recorded, from the start of Ladder.run
            "first_signal_s": min(signals) if signals else None,
            "last_signal_s": max(signals) if signals else None,
            "steps": [(a["at_s"], a["step"], a.get("pid"), a.get("name"), a["result"])
                      for a in res["actions"]],
            "msg": res.get("msg")}


def run_manual(root):
    script = os.path.join(root, "manual.sh")
    with open(script, "w") as f:
        # A script file, not `bash -c '...'`: pkill -f would match (and kill) a shell whose
        # own command line holds the patterns. See README.
        f.write(MANUAL.format(dev=os.path.join(root, "dev")))
    out = subprocess.run(["bash", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=60, check=False)
    return {"rc": out.returncode, "output": out.stdout[-2000:]}


def driver(args):
    set_comm("bench-driver")
    root = args.root
    holders, innocents = build_ranks(root, args.shape) if args.shape != "seeds" else build_wedge(root)
    before = nvml_used()
    start = time.monotonic()
    with open(os.path.join(root, "start.json"), "w") as f:
        json.dump({"t": start, "held_before": held(before)}, f)
    if args.inner == "manual":
        detail = run_manual(root)
    elif args.inner == "blind":
        detail = run_blind(holders)
    else:
        def run():
            return run_ladder(root, args.term_timeout, force=args.inner.startswith("force"),
                              collections=args.collections, profile=args.profile,
                              # s12 passes `match` (its run id, in every rank's title)
                              match=["rank"] if args.shape == "s12" else None)
        detail = in_child(run) if args.shape == "s12" else run()
    returned = time.monotonic()
    deadline = returned + SETTLE_S
    used = nvml_used()
    while held(used) and time.monotonic() < deadline:
        time.sleep(0.05)
        used = nvml_used()
    result = {
        "method": args.inner, "t_start": start, "returned_s": returned - start,
        "used_before": before, "used_after": used, "held_after": held(used),
        "holders_alive": [h["name"] for h in holders if alive(h["pid"], h["start"])],
        "innocents_dead": [i["name"] for i in innocents if not alive(i["pid"], i["start"])],
        "detail": detail,
    }
    with open(os.path.join(root, "result.json"), "w") as f:
        json.dump(result, f)


def inner(args):
    """PID 1 of the trial's namespace: fork the driver, reap every orphan, exit with it."""
    set_comm("bench-init")
    child = os.fork()
    if child == 0:
        code = 0
        try:
            driver(args)
        except BaseException:  # noqa: B902 - report anything, then die
            import traceback
            with open(os.path.join(args.root, "error.txt"), "w") as f:
                f.write(traceback.format_exc())
            code = 1
        os._exit(code)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            os._exit(os.waitstatus_to_exitcode(status) if status else 0)


# --- outside: the orchestrator -----------------------------------------------------------

class Poller(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.samples = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                self.samples.append((time.monotonic(), held(nvml_used())))
            except Exception as exc:  # noqa: BLE001 - keep polling; record the failure
                self.samples.append((time.monotonic(), repr(exc)))
            time.sleep(0.02)


def trial(method, root, reaper, term_timeout, collections, shape, profile=None, timeout=90):
    for name in os.listdir(root):   # the last trial's ready/pid/result files (dirs are fakegpu's)
        if os.path.isfile(os.path.join(root, name)):
            os.unlink(os.path.join(root, name))
    bl.fakegpu(root, "setup", "--gpus", str(GPUS), "--memory-mib", str(GPU_MIB), "--context-uncharged-mib",
               str(0 if shape == "seeds" else RANK_UNCHARGED_MIB))
    if held(nvml_used()):
        raise RuntimeError("GPUs not free before the trial: %s" % nvml_used())
    poller = Poller()
    poller.start()
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
           sys.executable, os.path.realpath(__file__), "--inner", method, "--root", root,
           "--term-timeout", str(term_timeout), "--collections", collections, "--shape", shape]
    if profile:
        cmd += ["--profile", profile]
    # Only the tree under test on the path: `ansible_collections` is a namespace package, so
    # a second tree would lend an old commit the modules it lacks.
    path = [p for p in os.environ.get("PYTHONPATH", "").split(":") if p and p != bl.COLLECTIONS]
    env = dict(os.environ, PYTHONPATH=":".join([collections] + path))
    proc = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL, env=env)
    reaper.group(proc.pid)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    poller.stop.set()
    poller.join()
    err = os.path.join(root, "error.txt")
    if os.path.exists(err) or not os.path.exists(os.path.join(root, "result.json")):
        raise RuntimeError("trial %s failed (rc %s): %s" % (method, proc.returncode,
                           open(err).read() if os.path.exists(err) else "no result"))
    with open(os.path.join(root, "result.json")) as f:
        res = json.load(f)
    t0 = res["t_start"]
    first_free = None
    for t, h in poller.samples:
        if t >= t0 and h == []:
            first_free = t - t0
            break
    res["free_s"] = first_free
    detail = res["detail"]
    if first_free is not None and "import_s" in detail:
        # The Ladder's own time to free: what is left once the module code is loaded (import)
        # and the Surveyor built, the one-time cost of a module run.
        res["ladder_free_s"] = first_free - detail["import_s"] - detail["surveyor_s"]
    # Capacity lost: GPU-seconds still held from the first action until all were free (or the
    # end of the trial), integrated over the 20 ms samples.
    gpu_s, last_t, last_n = 0.0, t0, GPUS
    per_gpu = {}
    for t, h in poller.samples:
        if t < t0 or isinstance(h, str):
            continue
        gpu_s += last_n * (t - last_t)
        last_t, last_n = t, len(h)
        for i in range(GPUS):
            if i not in h and i not in per_gpu:
                per_gpu[i] = round(t - t0, 3)
        if not h:
            break
    res["gpu_s_held"] = gpu_s
    res["gpu_free_s"] = per_gpu
    res["samples"] = len(poller.samples)
    # The namespace is gone with its init: nothing of the trial is left.
    if held(nvml_used()):
        raise RuntimeError("memory still held after the namespace ended")
    return res


def print_ladder_times(methods, summary, labels):
    """Where the Ladder's time to free goes: import, Surveyor, first signal, Ladder.run."""
    ladders = [m for m in methods if "import_s_median" in summary[m]]
    if not ladders:
        return
    print()
    print("%-38s %13s %13s %13s %13s %13s %13s" % (
        "Ladder: median (min)", "import ms", "Surveyor ms", "1st signal ms", "last signal ms", "run ms",
        "free ms"))
    for m in ladders:
        s = summary[m]
        cells = []
        for key, scale in (("import_s", 1e3), ("surveyor_s", 1e3), ("first_signal_s", 1e3),
                           ("last_signal_s", 1e3), ("ladder_elapsed_s", 1e3)):
            cells.append("%5.0f (%4.0f)" % (s[key + "_median"] * scale, s[key + "_min"] * scale)
                         if key + "_median" in s else "-")
        cells.append("%5.0f (%4.0f)" % (s["free_s_median"] * 1e3, s["free_s_min"] * 1e3)
                     if s["free_s_median"] is not None else "never")
        print("%-38s %13s %13s %13s %13s %13s %13s" % tuple([labels.get(m, m)] + cells))
    print("import: importing gpu_flow (the collection's module_utils, compiled from source); "
          "Surveyor: building it (backend, access; pynvml is already imported by the driver); "
          "1st/last signal: from the start of Ladder.run; run: Ladder.run's elapsed_s.")


def print_ratios(methods, summary, before):
    """manual/ladder and force/ladder, today's and, with --before, as of REF: on the time to
    free, and on the Ladder's own time to free (without loading the module code)."""
    def ratio(num, den, key="free_s_median"):
        # manual has no load: its own time to free is its time to free
        a = summary.get(num, {}).get(key) or summary.get(num, {}).get("free_s_median")
        b = summary.get(den, {}).get(key)
        return "%.2f" % (a / b) if a and b else "-"
    print()
    for title, key in (("time-to-free ratios (medians):", "free_s_median"),
                       ("without the load (free - import - Surveyor):", "ladder_free_s_median")):
        print("%-45s manual/ladder %s, force/ladder %s"
              % (title, ratio("manual", "ladder", key), ratio("force", "ladder", key)))
        if before and "manual" in methods:
            print("%-45s manual/ladder %s, force/ladder %s"
                  % ("  as of %s:" % before, ratio("manual", "ladder@" + before, key),
                     ratio("force@" + before, "ladder@" + before, key)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--methods", help="default ladder,manual,force; with --shape ranks ladder,force,blind")
    parser.add_argument("--shape", choices=("seeds", "ranks", "s12"), default="seeds")
    parser.add_argument("--profile", nargs="?", const=True, default=None,
                        help="cProfile every Ladder.run into results/reclaim-profile.txt (slower: not for the times)")
    parser.add_argument("--term-timeout", type=float, default=5.0)
    parser.add_argument("--before", metavar="REF",
                        help="also run ladder@REF and force@REF: the Ladder as of git commit REF")
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    parser.add_argument("--collections", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="reclaim.json")
    args = parser.parse_args()
    if args.inner:
        return inner(args)

    root = bl.ensure_stand_in_env("reclaimbench-")
    reaper = bl.Reaper()
    reaper.path(root)
    bl.import_collection()
    methods = (args.methods or ("ladder,manual,force" if args.shape == "seeds" else "ladder,force,blind")).split(",")
    trees = {m: bl.COLLECTIONS for m in methods}
    if args.before:
        old = tempfile.mkdtemp(prefix="reclaimbench-before-")
        reaper.path(old)
        bl.collection_at(args.before, old)
        for m in [m for m in methods if m not in ("manual", "blind")]:
            trees[m + "@" + args.before] = old
            methods.insert(methods.index(m) + 1, m + "@" + args.before)
    t_all = time.monotonic()
    results = {m: [] for m in methods}
    for rep in range(args.reps):
        order = methods[rep % len(methods):] + methods[:rep % len(methods)]
        for method in order:
            res = trial(method, root, reaper, args.term_timeout, trees[method], args.shape,
                        profile=os.path.join(bl.RESULTS, "reclaim-profile.txt") if args.profile else None)
            results[method].append(res)
            bl.log("rep %d %-6s free at %s s, returned %.2f s, held after %s, innocents dead %s"
                   % (rep + 1, method, "%.2f" % res["free_s"] if res["free_s"] is not None
                      else "never", res["returned_s"], res["held_after"], res["innocents_dead"]))

    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    summary = {}
    for m in methods:
        rs = results[m]
        summary[m] = {
            "free_s_median": med([r["free_s"] for r in rs]),
            "free_s_min": min([r["free_s"] for r in rs if r["free_s"] is not None], default=None),
            "returned_s_median": med([r["returned_s"] for r in rs]),
            "gpu_s_held_median": med([r["gpu_s_held"] for r in rs]),
            "gpus_free_by_1s_median": med([sum(1 for v in r["gpu_free_s"].values() if v <= 1.0)
                                           for r in rs]),
            "trials": len(rs),
            "trials_free": sum(1 for r in rs if r["free_s"] is not None and not r["held_after"]),
            "gpus_left_held_max": max(len(r["held_after"]) for r in rs),
            "ladder_free_s_median": med([r.get("ladder_free_s") for r in rs]),
            "innocents_killed": sorted(set(n for r in rs for n in r["innocents_dead"])),
            "holders_left": sorted(set(n for r in rs for n in r["holders_alive"])),
        }
        for key in ("import_s", "surveyor_s", "first_signal_s", "last_signal_s", "ladder_elapsed_s"):
            values = [r["detail"].get(key) for r in rs if r["detail"].get(key) is not None]
            if values:
                summary[m][key + "_median"] = med(values)
                summary[m][key + "_min"] = min(values)
    base = summary.get("ladder", summary[methods[0]])["free_s_median"]
    labels = {"ladder": "Ladder (gpu_reclaim, term_timeout=%g)" % args.term_timeout,
              "manual": "seeds' manual sequence (pkill/fuser)",
              "force": "Ladder force=True (no grace)", "blind": "blind SIGKILL of every rank"}
    if args.before:
        labels["ladder@" + args.before] = "Ladder @%s" % args.before
        labels["force@" + args.before] = "Ladder force=True @%s" % args.before
    print()
    if args.shape != "seeds":
        print("Reclaim benchmark, %s: %d x %d MiB on stand-in GPU 0, all ignoring SIGTERM, %s; %d MiB per "
              "context charged to no process; %d reps, alternating"
              % (args.shape, RANKS, RANK_MIB, "under one launcher shell" if args.shape == "ranks" else
                 "children of an ancestor of the Ladder's process", RANK_UNCHARGED_MIB, args.reps))
    else:
        print("Reclaim benchmark: 8 stand-in GPUs, TP-8 orphans + TERM-ignoring holder + [kworker/3:1] "
              "stray; innocents gpu-monitor (nvidiactl only) and python3; %d reps, alternating"
              % args.reps)
    print("%-38s %8s %7s %8s %8s %7s %7s %5s %s" % (
        "method", "free s", "min s", "x ladder", "return s", "GPU*s", "free", "GPUs",
        "innocents killed"))
    print("%-38s %8s %7s %8s %8s %7s %7s %5s" % ("", "(median)", "", "", "(median)", "held",
                                                 "by 1 s", "held"))
    for m in methods:
        s = summary[m]

        def fmt(value):
            return "%.2f" % value if value is not None else "never"
        ratio = "%.2f" % (s["free_s_median"] / base) if s["free_s_median"] and base else "-"
        print("%-38s %8s %7s %8s %8s %7.1f %5d/%d %5d %s" % (
            labels.get(m, m), fmt(s["free_s_median"]), fmt(s["free_s_min"]), ratio,
            fmt(s["returned_s_median"]), s["gpu_s_held_median"], s["gpus_free_by_1s_median"], GPUS,
            s["gpus_left_held_max"], ", ".join(s["innocents_killed"]) or "none"))
    print("free s: first 20 ms NVML poll (outside the namespace) with all 8 GPUs <= %d MiB, from "
          "the start of the method (the Ladder's includes importing the collection); return s: when the method itself finished (manual: its sleeps); "
          "GPU*s held: GPU-seconds of capacity still held after the first action; free by 1 s: "
          "GPUs free 1 s after the first action; GPUs held: left held %g s after the method "
          "returned (max over trials)." % (FREE_MIB, SETTLE_S))
    print_ladder_times(methods, summary, labels)
    print_ratios(methods, summary, args.before)
    for m in methods:
        if summary[m]["holders_left"]:
            print("%s left holders alive: %s" % (m, ", ".join(summary[m]["holders_left"])))
    path = bl.write_json(args.out, {"summary": summary, "trials": results,
                                    "total_s": time.monotonic() - t_all})
    print("wrote %s (total %.0f s)" % (path, time.monotonic() - t_all))
    return 0


if __name__ == "__main__":
    sys.exit(main())
