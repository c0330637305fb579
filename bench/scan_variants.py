"""Experiment: would another way of reading /proc/PID/fd make gpu_observe.scan_processes
faster? Same load as scan_bench.py (3,000 processes, ~130,000 fds), no GPU holders needed.

    .venv/bin/python bench/scan_variants.py [--reps 7]

Variants, timed alternately: the module's scan as it is; listing /proc/PID/fd only (the
floor of any fd scan: it does no readlink); os.scandir instead of os.listdir; fstatat
instead of readlinkat; a thread pool over PIDs (os.readlink releases the GIL) with 2 and 4
threads. Prints median/min seconds. Writes bench/results/scan_variants.json.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import benchlib as bl  # noqa: E402
import scan_bench as sb  # noqa: E402

PREFIX = "/dev/nvidia"


def _fds_or_none(observe, pid):
    try:
        return observe._device_fds("/proc/%d" % pid, pid, (PREFIX,))
    except observe.ProcError:
        return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    _unused, observe = bl.import_collection()
    root = tempfile.mkdtemp(prefix="scanvariants-")
    reaper = bl.Reaper()
    reaper.path(root)
    sb.start_load(root, reaper, 3000, 130000)

    def current():
        return observe.scan_processes((PREFIX,))

    def list_only():
        for pid in observe._pids("/proc"):
            try:
                os.listdir("/proc/%d/fd" % pid)
            except OSError:
                pass

    def per_fd(op):
        def scan():
            for pid in observe._pids("/proc"):
                try:
                    dfd = os.open("/proc/%d/fd" % pid, os.O_RDONLY | os.O_DIRECTORY)
                except OSError:
                    continue
                try:
                    names = [e.name for e in os.scandir(dfd)] if op == "scandir" else os.listdir(dfd)
                    for name in names:
                        try:
                            if op == "stat":
                                os.stat(name, dir_fd=dfd)
                            else:
                                os.readlink(name, dir_fd=dfd).startswith(PREFIX)
                        except OSError:
                            pass
                except OSError:
                    pass
                finally:
                    os.close(dfd)
        return scan

    def pool(n):
        def scan():
            pids = observe._pids("/proc")
            with ThreadPoolExecutor(n) as ex:
                return list(ex.map(lambda p: _fds_or_none(observe, p), pids, chunksize=64))
        return scan

    variants = {"scan_processes (as is)": current, "listdir only (floor)": list_only,
                "scandir + readlinkat": per_fd("scandir"), "listdir + fstatat": per_fd("stat"),
                "thread pool, 2": pool(2), "thread pool, 4": pool(4)}
    for fn in variants.values():
        fn()
    samples = {k: [] for k in variants}
    names = list(variants)
    for rep in range(args.reps):
        for k in names[rep % len(names):] + names[:rep % len(names)]:
            start = time.perf_counter()
            variants[k]()
            samples[k].append(time.perf_counter() - start)
    base = statistics.median(samples[names[0]])
    print("%-26s %9s %9s %8s" % ("variant", "median s", "min s", "x as is"))
    for k in names:
        st = bl.stats(samples[k])
        print("%-26s %9.3f %9.3f %8.2f" % (k, st["median_s"], st["min_s"], st["median_s"] / base))
    print("load average now: %s" % open("/proc/loadavg").read().split()[:3])
    bl.write_json("scan_variants.json", {k: bl.stats(v) for k, v in samples.items()})


if __name__ == "__main__":
    main()
