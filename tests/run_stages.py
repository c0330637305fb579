"""Run `make test`'s stages: lanes side by side, the stages of one lane one after another.

    python3 tests/run_stages.py [--logs DIR] [--table FILE] [--skips DIR] LANE...

A LANE is STAGE[+STAGE...]; a STAGE is a make target, run as `make STAGE` with its output
(stdout and stderr) in DIR/STAGE.log. Lanes run at the same time because each lab stage has
a private lab (its own state, records and addresses) and its nodes mostly wait (issue 31). When
a stage ends, its whole log is printed at once, so concurrent stages never interleave. A stage
that fails ends its lane (the lane's later stages are listed as not run); the other lanes go
on, and the exit status is 1.

At the end: every skip and expected failure of the pytest stages (pytest -rsx lines in the
--skips DIR's logs, as before), then one table: each stage's wall time, its tests passed,
skipped and failed (from pytest's summary line, or Molecule's: its scenarios; '-' for a stage
that is neither), the CPU
time of its process tree on this machine (user + system; lab nodes' own processes are not in it), and its
wall time in the previous table (FILE as it was before this run, or TEST_TIMES_BEFORE),
marked GREW when it grew by more than a third (and 10 s). The table also goes to FILE.
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import threading
import time

GROWTH_FLAG = 4 / 3
GROWTH_FLOOR_S = 10   # a second or two of a short stage is noise, not growth
SUMMARY = re.compile(r"^=*\s*(?P<body>(?:\d+ \w+(?:, )?)+) in [\d.]+s\b")
COUNT = re.compile(r"(\d+) (passed|skipped|failed|errors?|xfailed|xpassed|deselected|warnings?)")
SKIP_LINE = re.compile(r"^(SKIPPED|XFAIL|XPASS)")


def pytest_counts(log_path):
    """{'passed': n, 'skipped': n, 'failed': n} summed over every pytest summary in the log,
    None when the log has none (not a pytest stage)."""
    totals, seen = {"passed": 0, "skipped": 0, "failed": 0}, False
    with open(log_path, errors="replace") as f:
        for line in f:
            match = SUMMARY.match(line.strip())
            if not match:
                continue
            seen = True
            for number, word in COUNT.findall(match.group("body")):
                key = {"error": "failed", "errors": "failed", "xpassed": "failed"}.get(word, word)
                if key in totals:
                    totals[key] += int(number)
    return totals if seen else None


ANSI = re.compile(r"\x1b\[[0-9;]*m")
MOLECULE_SUMMARY = re.compile(r"^(?P<name>[\w./-]+)\s*: actions=\d+\s+successful=(?P<ok>\d+)\s+disabled=\d+\s+"
                              r"skipped=\d+\s+missing=\d+\s+failed=(?P<failed>\d+)\s*$")


def molecule_counts(log_path):
    """Molecule's closing summary, one line per scenario and action group: {'passed': scenarios
    with no failed action, 'skipped': 0, 'failed': scenarios with one}, None when the log has no
    summary (not a Molecule stage, or it stopped before its summary)."""
    failed = {}
    with open(log_path, errors="replace") as f:
        for line in f:
            match = MOLECULE_SUMMARY.match(ANSI.sub("", line).strip())
            if match:
                name = match.group("name")
                failed[name] = failed.get(name, False) or int(match.group("failed")) > 0
    if not failed:
        return None
    return {"passed": sum(1 for bad in failed.values() if not bad), "skipped": 0,
            "failed": sum(1 for bad in failed.values() if bad)}


def previous_walls(path):
    """{stage: seconds} from an earlier table file; {} when there is none."""
    walls = {}
    if not path or not os.path.exists(path):
        return walls
    with open(path) as f:
        for line in f:
            cols = line.split()
            if len(cols) >= 3 and cols[1].endswith("s") and cols[1][:-1].isdigit():
                walls[cols[0]] = int(cols[1][:-1])
    return walls


def memory_used_mib():
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) // 1024


class Run:
    def __init__(self, logs):
        self.logs = logs
        self.lock = threading.Lock()
        self.results = {}  # stage -> dict
        self.peak_mib = memory_used_mib()
        self.done = threading.Event()

    def watch_memory(self):
        while not self.done.wait(2):
            self.peak_mib = max(self.peak_mib, memory_used_mib())

    def stage(self, name, lane):
        log_path = os.path.join(self.logs, name + ".log")
        start = time.monotonic()
        with self.lock:
            print(f"== {name}: started (lane {lane}), log {log_path}", flush=True)
        with open(log_path, "w") as log:
            proc = subprocess.Popen(["make", "--no-print-directory", name], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT)
            # wait4: the CPU time of the stage's whole process tree on the controller (the nodes'
            # own processes are not its descendants), beside its wall time.
            _pid, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = rc = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - start
        result = {"lane": lane, "wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rc": rc,
                  "counts": pytest_counts(log_path) or molecule_counts(log_path)}
        with self.lock:
            self.results[name] = result
            print(f"\n==================== {name}: {'passed' if rc == 0 else 'FAILED (rc %d)' % rc} "
                  f"in {wall:.0f} s; its whole log ({log_path}) ====================", flush=True)
            with open(log_path, errors="replace") as f:
                sys.stdout.write(f.read())
            print(f"==================== end of {name} ====================\n", flush=True)
        return rc == 0

    def lane(self, lane):
        stages = lane.split("+")
        for index, name in enumerate(stages):
            if not self.stage(name, lane):
                with self.lock:
                    for rest in stages[index + 1:]:
                        self.results[rest] = {"lane": lane, "wall": None, "cpu": None, "rc": None, "counts": None}
                return


def table(order, results, before, total_wall, peak_mib):
    rows = [f"{'stage':<22} {'wall':>7} {'cpu':>7} {'passed':>7} {'skipped':>8} {'failed':>7}  {'result':<10} previous wall"]
    for name in order:
        r = results[name]
        counts = r["counts"]
        cells = [str(counts[k]) for k in ("passed", "skipped", "failed")] if counts else ["-", "-", "-"]
        wall = "%ds" % round(r["wall"]) if r["wall"] is not None else "-"
        cpu = "%ds" % round(r["cpu"]) if r["cpu"] is not None else "-"
        result = "not run" if r["rc"] is None else ("passed" if r["rc"] == 0 else "FAILED")
        prev = before.get(name)
        note = "-"
        if prev is not None:
            note = "%ds" % prev
            if r["wall"] is not None and round(r["wall"]) > prev * GROWTH_FLAG and round(r["wall"]) - prev >= GROWTH_FLOOR_S:
                note += "  GREW %+d%%" % round(100 * (r["wall"] / prev - 1))
        rows.append(f"{name:<22} {wall:>7} {cpu:>7} {cells[0]:>7} {cells[1]:>8} {cells[2]:>7}  {result:<10} {note}")
    load = os.getloadavg()
    cpu_total = sum(r["cpu"] or 0 for r in results.values())
    rows.append(f"{'total':<22} {'%ds' % round(total_wall):>7} {'%ds' % round(cpu_total):>7}")
    rows.append("peak memory in use on the machine: %d MiB (all processes); load average at the end: "
                "%.2f %.2f %.2f" % (peak_mib, *load))
    return "\n".join(rows) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--logs", default=".build/logs")
    parser.add_argument("--table", default=".build/test-times.txt")
    parser.add_argument("--skips", default=None, help="directory of the pytest stages' -rsx logs")
    parser.add_argument("lanes", nargs="+")
    args = parser.parse_args()
    order = [stage for lane in args.lanes for stage in lane.split("+")]
    bad = [s for s in order if not re.fullmatch(r"[a-z][a-z0-9-]*", s)]
    if bad or len(set(order)) != len(order):
        parser.error(f"each stage is a make target named once: got {' '.join(order)}")
    before = previous_walls(os.environ.get("TEST_TIMES_BEFORE") or args.table)
    os.makedirs(args.logs, exist_ok=True)
    os.makedirs(os.path.dirname(args.table) or ".", exist_ok=True)

    run = Run(args.logs)
    start = time.monotonic()
    watcher = threading.Thread(target=run.watch_memory, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=run.lane, args=(lane,)) for lane in args.lanes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run.done.set()
    total = time.monotonic() - start

    if args.skips:
        print("== what did not run, or was expected to fail (pytest -rsx of each pytest stage) ==")
        lines = []
        for path in sorted(glob.glob(os.path.join(args.skips, "*.log"))):
            with open(path, errors="replace") as f:
                lines += [line.rstrip("\n") for line in f if SKIP_LINE.match(line)]
        print("\n".join(lines) if lines else "nothing: every collected test ran")
    text = table(order, run.results, before, total, run.peak_mib)
    with open(args.table, "w") as f:
        f.write(text)
    print(f"\n== make test: each stage ({args.table}) ==")
    sys.stdout.write(text)
    sys.exit(0 if all(r["rc"] == 0 for r in run.results.values()) else 1)


if __name__ == "__main__":
    main()
