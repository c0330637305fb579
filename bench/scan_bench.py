"""Scan benchmark: how long gpu_holders takes to find GPU holders on a busy host, beside
fuser, the nvidia-smi stand-in and a naive /proc/*/fd readlink scan; and whether they all
find the same holders.

Load: ~3,000 sleeping processes with ~130,000 open fds in total (bench/fdload.c), plus a
few holders of the stand-in driver (tests/fakegpu) on a fresh FAKEGPU_ROOT. Everything
started here is SIGKILLed at the end, also on Ctrl-C or failure.

    bench/scan_bench.py [--procs 3000] [--fds 130000] [--reps 7] [--profile]

Prints a table and writes bench/results/scan.json. No assertion on time: it only reports.
"""
import argparse
import cProfile
import io
import os
import platform
import pstats
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import benchlib as bl  # noqa: E402


def build_fdload(workdir):
    exe = os.path.join(workdir, "fdload")
    subprocess.run(["cc", "-O2", "-o", exe, os.path.join(bl.BENCH, "fdload.c")], check=True)
    return exe


def start_load(workdir, reaper, procs, fds, timeout=120):
    exe = build_fdload(workdir)
    files = os.path.join(workdir, "files")
    os.makedirs(files, exist_ok=True)
    proc = subprocess.Popen([exe, str(procs), str(fds), files], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    reaper.group(proc.pid)
    started = time.monotonic()
    line = proc.stdout.readline()   # "ready NPROCS NFDS" once every child sleeps
    if not line.startswith("ready"):
        raise RuntimeError("fdload failed (exit %s)" % proc.poll())
    if time.monotonic() - started > timeout:
        raise RuntimeError("fdload took too long")
    _unused, nprocs, nfds = line.split()
    return proc, int(nprocs), int(nfds), time.monotonic() - started


def host_load():
    """(processes, open fds) on the whole host, as /proc shows them now."""
    nprocs = nfds = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            nfds += len(os.listdir("/proc/%s/fd" % name))
            nprocs += 1
        except OSError:
            pass
    return nprocs, nfds


# GPUs 0-2 hold only memory NVML charges to live holders; GPU 3 holds memory no process does
# (a leak), which makes any survey that selects it read every process's fds and maps.
HELD_GPUS = ("0", "1", "2")
LEAKED_GPU = 3


# --- the tools ----------------------------------------------------------------------------

def tool_survey(flow, dev_dir, deep=False, full=True, gpus=HELD_GPUS):
    survey = flow.Surveyor(dev_dir=dev_dir, nvml_timeout=30, gpus=gpus).survey(deep=deep, full=full)
    return set(h["pid"] for h in survey.holders) | set(c["pid"] for c in survey.clients)


def tool_scan(observe, dev_dir):
    procs, _unused = observe.scan_processes((dev_dir + "/nvidia",))
    return set(procs)


def tool_fuser(files):
    out = subprocess.run(["fuser"] + files, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, timeout=120, check=False)
    # PIDs go to stdout; file names and access letters (m = mapped) to stderr.
    return set(int(tok) for tok in re.findall(r"\d+", out.stdout))


def tool_smi():
    out = subprocess.run([sys.executable, bl.NVIDIA_SMI, "--query-compute-apps=pid,used_memory",
                          "--format=csv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=120, check=True)
    lines = out.stdout.splitlines()[1:]
    return set(int(line.split(",")[0]) for line in lines if line.strip())


def tool_naive(prefix):
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        base = "/proc/%s/fd/" % name
        try:
            fds = os.listdir(base)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(base + fd)
            except OSError:
                continue
            if target.startswith(prefix):
                found.add(int(name))
                break
    return found


# --- the scenario -------------------------------------------------------------------------

MONITOR = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)     # what a monitoring tool keeps: nvidiactl only
open(sys.argv[2], "w").write(str(os.getpid()))
while True:
    time.sleep(3600)
"""


def start_holders(root, reaper):
    """A TP-2 holder (parent + spawned child), a holder whose forked child inherits its fds and
    mappings, and a monitor with only nvidiactl open. Returns {name: set(pids)}."""
    bl.fakegpu(root, "setup", "--gpus", "4", "--memory-mib", "81920")
    bl.fakegpu(root, "leak", "--gpu", str(LEAKED_GPU), "--mib", "3000")
    tp = bl.start_hold(root, reaper, ["--gpu", "0:4000", "--child", "1:4000:sglang::scheduler_TP1",
                                      "--title", "sglang::main"], "tp")
    fork = bl.start_hold(root, reaper, ["--gpu", "2:2000", "--fork-inherit",
                                        "--title", "trainer"], "fork")
    pidfile = os.path.join(root, "monitor.pid")
    monitor_argv = [sys.executable, "-c", MONITOR, os.path.join(root, "dev", "nvidiactl"), pidfile]
    mon = subprocess.Popen(bl.STRANGER + monitor_argv, start_new_session=True, stdin=subprocess.DEVNULL)
    reaper.group(mon.pid)
    deadline = time.monotonic() + 30
    while not os.path.exists(pidfile) or not open(pidfile).read():
        if time.monotonic() > deadline:
            raise RuntimeError("monitor did not start")
        time.sleep(0.02)
    return {
        "contexts_nvml": {tp["pid"]} | set(tp["spawned"]) | {fork["pid"]},
        "inherited": set(fork["forked"]),
        "monitor": {int(open(pidfile).read())},
    }


def profile_scan(observe, dev_dir, out):
    prof = cProfile.Profile()
    prof.enable()
    observe.scan_processes((dev_dir + "/nvidia",))
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
    out["profile_scan_processes"] = text.getvalue()
    print(text.getvalue())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--procs", type=int, default=3000)
    parser.add_argument("--fds", type=int, default=130000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="cProfile one scan_processes run")
    parser.add_argument("--out", default="scan.json")
    args = parser.parse_args()

    root = bl.ensure_stand_in_env("scanbench-")
    reaper = bl.Reaper()
    reaper.path(root)
    flow, observe = bl.import_collection()
    dev_dir = os.path.join(root, "dev")
    if not shutil.which("fuser"):
        raise SystemExit("fuser not found: apt-get install psmisc (bench/run does this)")

    t0 = time.monotonic()
    groups = start_holders(root, reaper)
    _unused, nprocs, nfds, load_s = start_load(root, reaper, args.procs, args.fds)
    host_procs, host_fds = host_load()
    bl.log("load: %d processes with %d fds started in %.1f s; host now %d processes, %d open fds"
           % (nprocs, nfds, load_s, host_procs, host_fds))

    files = bl.device_files(root)
    prefix = dev_dir + "/nvidia"
    fd_holders = groups["contexts_nvml"] | groups["inherited"] | groups["monitor"]
    tools = [
        # (key, label, fn, expected pid set, what it is expected to see)
        ("survey", "gpu_holders: Surveyor.survey()", lambda: tool_survey(flow, dev_dir),
         fd_holders, "contexts + inherited + monitor (as client)"),
        ("listed", "handles=false, NVML explains all memory", lambda: tool_survey(flow, dev_dir, full=False),
         groups["contexts_nvml"], "the cheap case (gpu_reclaim's surveys): NVML's PIDs only"),
        ("listed_leak", "handles=false, + a GPU with a leak", lambda: tool_survey(flow, dev_dir, full=False, gpus=[]),
         fd_holders, "the worst case: NVML's PIDs, then one pass of every fd and maps"),
        ("leak", "gpu_holders, + a GPU with a leak", lambda: tool_survey(flow, dev_dir, gpus=[]),
         fd_holders, "the worst case: memory charged to no PID, one pass of every fd and maps"),
        ("deep", "gpu_holders deep (reads every maps)", lambda: tool_survey(flow, dev_dir, True),
         fd_holders, "every fd and maps, asked for"),
        ("scan", "observe.scan_processes() alone", lambda: tool_scan(observe, dev_dir),
         fd_holders, "every fd/mmap holder"),
        ("fuser", "fuser <root>/dev/nvidia*", lambda: tool_fuser(files),
         fd_holders, "every fd/mmap holder"),
        ("smi", "nvidia-smi --query-compute-apps (stand-in)", tool_smi,
         groups["contexts_nvml"], "NVML contexts only (not inherited fds, not the monitor)"),
        ("naive", "naive Python /proc/*/fd readlink", lambda: tool_naive(prefix),
         fd_holders, "every fd holder"),
    ]
    own = {os.getpid()}
    samples = {key: [] for key, *_unused in tools}
    found = {}
    for _unused, _unused, fn, _unused, _unused in tools:    # warm-up: dentries of /proc/PID/fd, page cache, imports
        fn()
    for rep in range(args.reps):
        order = tools[rep % len(tools):] + tools[:rep % len(tools)]
        for key, _unused, fn, _unused, _unused in order:
            start = time.perf_counter()
            pids = fn()
            samples[key].append(time.perf_counter() - start)
            found.setdefault(key, []).append(sorted(pids - own))
        bl.log("rep %d/%d done" % (rep + 1, args.reps))

    result = {"host": {"platform": platform.platform(), "python": sys.version.split()[0],
                       "cpus": os.cpu_count()},
              "load": {"procs_started": nprocs, "fds_started": nfds, "host_procs": host_procs,
                       "host_fds": host_fds},
              "holders": {k: sorted(v) for k, v in groups.items()},
              "tools": {}}
    base = bl.stats(samples["survey"])["median_s"]
    fuser_s = bl.stats(samples["fuser"])["median_s"]
    print()
    print("Scan benchmark: %d processes, %d open fds on the host (load: %d procs, %d fds); "
          "%d reps, alternating" % (host_procs, host_fds, nprocs, nfds, args.reps))
    header = ("tool", "median s", "min s", "x survey", "x fuser", "holders", "found the expected PIDs?")
    print("%-44s %9s %9s %9s %8s  %-7s %s" % header)
    for key, label, _unused, expected, note in tools:
        st = bl.stats(samples[key])
        sets = found[key]
        stable = all(s == sets[0] for s in sets)
        got = set(sets[-1])
        ok = got == expected
        verdict = "yes" if ok and stable else "NO: missing %s extra %s%s" % (
            sorted(expected - got), sorted(got - expected), "" if stable else " (varied)")
        print("%-44s %9.3f %9.3f %9.2f %8.3f  %-7d %s (%s)"
              % (label, st["median_s"], st["min_s"], st["median_s"] / base, st["median_s"] / fuser_s,
                 len(got), verdict, note))
        result["tools"][key] = dict(st, label=label, ratio_to_survey=st["median_s"] / base,
                                    ratio_to_fuser=st["median_s"] / fuser_s,
                                    pids=sorted(got), expected=sorted(expected), correct=ok,
                                    stable=stable)
    print("(nvidia-smi here is tests/fakegpu/nvidia-smi, a Python stand-in reading the stand-in "
          "NVML: its time is Python start-up plus NVML, not the real tool's.)")
    if args.profile:
        profile_scan(observe, dev_dir, result)
    result["total_s"] = time.monotonic() - t0
    print("wrote %s" % bl.write_json(args.out, result))


if __name__ == "__main__":
    main()
