"""Who sent a SIGTERM or SIGKILL: the kernel's signal:signal_generate tracepoint, read on the host.

A lab node is a systemd-nspawn container on the host's kernel, so the host sees every signal any
node's process sends or receives. SignalTrace makes a trace instance of its own (the host's top
trace buffer and other instances are left alone), filters the tracepoint to `sig == 15 || sig == 9`,
reads trace_pipe in a thread and writes one JSON line per event: when (CLOCK_MONOTONIC, the
clock the bench and the nodes share), the signal and its si_code, and for the sender and the
target their host PID, comm, PID in their own namespace (NSpid), start time (clock ticks since
boot, as /proc/PID/stat and the bench's facts name a process), cmdline and cgroup, read from
/proc as the event is read (a process already gone reads as null: a short-lived `kill`, or a
SIGKILLed target).

Used by bench/server_soak_bench.py --trace-signals (issue 30 item 8: the needless restart of
seed 3010 trial 72 was a SIGTERM to a rank from a sender nobody could name). Stdlib only; root.
"""
import json
import os
import re
import subprocess
import sys
import threading
import time

TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
EVENT = "events/signal/signal_generate"
FILTER = "sig == 15 || sig == 9"
# trace_pipe's line: "  COMM-PID  [CPU] FLAGS  TS: signal_generate: sig=15 errno=0 code=0 comm=T pid=N grp=1 res=0";
# with record-tgid, "(TGID)" after the PID. COMM may hold spaces and dashes: the PID is the last -N.
LINE = re.compile(r"^\s*(?P<comm>.*?)-(?P<pid>\d+)\s+(?:\(\s*(?P<tgid>[\d-]+)\)\s+)?\[\d+\]\s+\S+\s+(?P<ts>[\d.]+): "
                  r"signal_generate: sig=(?P<sig>\d+) errno=(?P<errno>-?\d+) code=(?P<code>-?\d+) "
                  r"comm=(?P<tcomm>.*) pid=(?P<tpid>\d+) grp=(?P<grp>\d+) res=(?P<res>\d+)\s*$")
# si_code names (include/uapi/asm-generic/siginfo.h): who the kernel says asked for the signal.
CODES = {0: "SI_USER (kill)", 128: "SI_KERNEL", -1: "SI_QUEUE", -6: "SI_TKILL (tgkill)", -2: "SI_TIMER"}
RESULTS = {0: "delivered", 1: "ignored", 2: "already pending", 3: "group ignored", 4: "ptrace"}


def tracefs():
    """The mounted tracefs that has the signal events, mounting it at /sys/kernel/tracing when
    no place has it; (path, None) or (None, why not)."""
    for path in TRACEFS:
        if os.path.isdir(os.path.join(path, EVENT)):
            return path, None
    mount = subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS[0]], capture_output=True, text=True,
                           timeout=10, check=False)
    if os.path.isdir(os.path.join(TRACEFS[0], EVENT)):
        return TRACEFS[0], None
    return None, "no tracefs with %s at %s (mount: rc %d %s)" % (EVENT, " or ".join(TRACEFS), mount.returncode,
                                                                 mount.stderr.strip() or mount.stdout.strip())


def _read(path, binary=False):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data if binary else data.decode(errors="replace")


def proc(pid):
    """What /proc says of host PID `pid` now; None for a process already gone."""
    stat = _read("/proc/%d/stat" % pid)
    if stat is None:
        return None
    status = _read("/proc/%d/status" % pid) or ""
    nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
    tgid = next((line.split()[1] for line in status.splitlines() if line.startswith("Tgid:")), None)
    cmdline = _read("/proc/%d/cmdline" % pid, binary=True) or b""
    cgroup = (_read("/proc/%d/cgroup" % pid) or "").strip().splitlines()
    try:
        fields = stat.rsplit(")", 1)[1].split()
        start, ppid = int(fields[19]), int(fields[1])
    except (IndexError, ValueError):
        start = ppid = None
    return {"comm": stat[stat.find("(") + 1:stat.rfind(")")], "tgid": int(tgid) if tgid else None,
            "ppid": ppid, "nspid": [int(p) for p in nspid], "start": start,
            "cmdline": [a.decode(errors="replace") for a in cmdline.split(b"\0") if a],
            # The v2 line (0::) names the unit; on a hybrid host the name=systemd line does too.
            "cgroup": next((c.split(":", 2)[2] for c in cgroup if c.startswith("0::")),
                           cgroup[0].split(":", 2)[2] if cgroup else None)}


def parse(line):
    """One trace_pipe line as a dict, or None for a line that is not a signal_generate event."""
    m = LINE.match(line)
    if not m:
        return None
    return {"ts": float(m["ts"]), "sig": int(m["sig"]), "code": int(m["code"]), "errno": int(m["errno"]),
            "result": int(m["res"]), "group": int(m["grp"]),
            "sender": {"pid": int(m["pid"]), "tgid": int(m["tgid"]) if m["tgid"] and m["tgid"].isdigit() else None,
                       "comm": m["comm"].strip()},
            "target": {"pid": int(m["tpid"]), "comm": m["tcomm"]}}


def describe(event):
    """One sentence naming who signalled whom, for a report."""
    s, t = event["sender"], event["target"]

    def who(p):
        seen = p.get("now") or {}
        # /proc is read after the event: a PID that exec'd since reads as its new program.
        return "%s (host pid %d%s%s%s%s)" % (
            p["comm"], p["pid"], ", now %s" % seen["comm"] if seen.get("comm") and seen["comm"] != p["comm"] else "",
            ", pid %d in its namespace" % seen["nspid"][-1] if seen.get("nspid") and len(seen["nspid"]) > 1 else "",
            ", cgroup %s" % seen["cgroup"] if seen.get("cgroup") else ", gone when read",
            ", cmdline %r" % " ".join(seen["cmdline"])[:200] if seen.get("cmdline") else "")
    return "SIG%s %s from %s to %s, %s" % (
        {9: "KILL", 15: "TERM"}.get(event["sig"], event["sig"]), CODES.get(event["code"], "code %d" % event["code"]),
        who(s), who(t), RESULTS.get(event["result"], "result %d" % event["result"]))


class SignalTrace:
    """Record SIGTERM and SIGKILL on the host into `path` (JSON lines) while started.

    keep(event) chooses what to write (e.g. events whose sender or target is in one lab's
    cgroups); by default every event. start() returns None when recording runs (its check:
    a SIGTERM to a process of its own was seen), else why not: the caller says so and goes on.
    """

    def __init__(self, name, path, keep=None, log=None):
        self.name, self.path, self.keep = name, path, keep or (lambda event: True)
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.root = self.instance = None
        self.thread = self.pipe = None
        self.events = []
        self.seen = 0
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def start(self, check_timeout=10.0):
        root, why = tracefs()
        if root is None:
            return why
        self.root = root
        self.instance = os.path.join(root, "instances", self.name)
        try:
            if os.path.isdir(self.instance):
                os.rmdir(self.instance)     # a run of ours that ended without its stop()
            os.mkdir(self.instance)
            for rel, value in (("trace_clock", "mono"), ("options/record-tgid", "1"),
                               ("buffer_size_kb", "4096"), (EVENT + "/filter", FILTER), (EVENT + "/enable", "1")):
                path = os.path.join(self.instance, rel)
                if os.path.exists(path):
                    with open(path, "w") as f:
                        f.write(value)
            self.pipe = open(os.path.join(self.instance, "trace_pipe"), "rb", buffering=0)
        except OSError as exc:
            self.stop()
            return "trace instance %s: %s" % (self.instance, exc)
        self.out = open(self.path, "w")
        self.thread = threading.Thread(target=self._reader, name="signal-trace", daemon=True)
        self.thread.start()
        # The check: SIGTERM a sleep of ours and see the event come through the whole path.
        probe = subprocess.Popen(["sleep", "60"])
        probe.terminate()
        probe.wait()
        deadline = time.monotonic() + check_timeout
        while time.monotonic() < deadline:
            with self.lock:
                if any(e["target"]["pid"] == probe.pid and e["sig"] == 15 for e in self.events):
                    return None
            time.sleep(0.1)
        self.stop()
        return "trace instance %s: our own test SIGTERM to pid %d did not come through in %.0f s" % (
            self.instance, probe.pid, check_timeout)

    def _reader(self):
        buf = b""
        while not self.stopping.is_set():
            try:
                chunk = self.pipe.read(65536)
            except OSError:
                break
            if not chunk:
                continue
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                event = parse(raw.decode(errors="replace"))
                if event is None:
                    continue
                event["read_mono"] = round(time.monotonic(), 3)
                event["read_wall"] = round(time.time(), 3)
                event["sender"]["now"] = proc(event["sender"]["tgid"] or event["sender"]["pid"])
                event["target"]["now"] = proc(event["target"]["pid"])
                self.seen += 1
                if not (self.keep(event) or self._own(event)):
                    continue
                with self.lock:
                    self.events.append(event)
                self.out.write(json.dumps(event) + "\n")
                self.out.flush()

    def _own(self, event):
        return event["sender"]["pid"] == os.getpid() or event["sender"].get("tgid") == os.getpid()

    def stop(self):
        """Disable the event and remove the instance (nothing of ours is left in tracefs)."""
        self.stopping.set()
        if self.thread is not None:
            # trace_pipe's read blocks until data; a signal of ours wakes it (and is recorded).
            nudge = subprocess.Popen(["sleep", "60"])
            nudge.kill()
            nudge.wait()
            self.thread.join(5)
        if self.instance and os.path.isdir(self.instance):
            try:
                with open(os.path.join(self.instance, EVENT, "enable"), "w") as f:
                    f.write("0")
            except OSError:
                pass
        if self.pipe is not None:
            self.pipe.close()
            self.pipe = None
        for _unused in range(50):
            if not self.instance or not os.path.isdir(self.instance):
                break
            try:
                os.rmdir(self.instance)
            except OSError:
                time.sleep(0.1)     # EBUSY while the reader's file is still being closed
        if getattr(self, "out", None) is not None:
            self.out.close()
            self.out = None
        return not (self.instance and os.path.isdir(self.instance))

    def snapshot(self):
        with self.lock:
            return list(self.events)


def matching(events, pids, since=None, until=None, host=None, cgroup=None):
    """Events between since and until (CLOCK_MONOTONIC) whose target is one of `pids` ([NSPID,
    START] as the bench's facts name a process: its PID in the node's namespace and its start
    time) or, with `cgroup`, in a cgroup containing it. host: {host PID: {"named": [NSPID,
    START], "cgroup": CGROUP}} read earlier, for a target already gone when its event was read."""
    want = {(p[0], p[1]) for p in pids if p}
    out = []
    for e in events:
        if since is not None and e["ts"] < since or until is not None and e["ts"] > until:
            continue
        now = e["target"].get("now") or {}
        if now.get("nspid"):
            named, where = (now["nspid"][-1], now.get("start")), now.get("cgroup") or ""
        else:
            known = (host or {}).get(e["target"]["pid"]) or {}
            named, where = tuple(known.get("named") or ()), known.get("cgroup") or ""
        if named in want or (cgroup and cgroup in where):
            out.append(e)
    return out


if __name__ == "__main__":
    # A quick look: record for N seconds (default 10) and print each event's sentence.
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    trace = SignalTrace("signal-trace-%d" % os.getpid(), "/dev/null")
    why = trace.start()
    if why:
        raise SystemExit("no signal trace: " + why)
    try:
        time.sleep(seconds)
    finally:
        trace.stop()
    for e in trace.snapshot():
        print(describe(e))
