"""Stop a server started by hand, with its whole process tree, through systemd.

usage: adopt.py REQUEST_JSON
  REQUEST_JSON: {"scope": "NAME-adopted", "roots": [{"pid", "start_time"}], "stop_timeout": SECONDS}

Prints JSON: {"scope", "procs": [{pid, name, cmdline, root}], "skipped": [sentence],
              "stopped": bool, "left": [pid], "seconds", "error"}.

The roots (the launcher on the port, TP ranks and orphans on the GPUs, each re-identified
by its start time) and every descendant of them are moved into a new transient scope
unit, and that scope is stopped: systemd sends SIGTERM to every process of it, SIGKILL
after `stop_timeout`, exactly as it stops the managed unit (KillMode=control-group). So
the adopted tree dies the way a unit's does, orphans included, and no signal is sent
from here. Processes are pinned by pidfd before the move; if one died and its PID was
reused before systemd moved it, the scope is left unstopped and the run fails saying so.
Stdlib only, Python 3.9+; needs root and systemd (busctl).
"""
import json
import os
import select
import subprocess
import sys
import time


def stat_of(pid):
    """(ppid, start_time) from /proc/PID/stat, or None when gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def text_of(pid, name):
    try:
        with open("/proc/%d/%s" % (pid, name), "rb") as f:
            return f.read().rstrip(b"\0\n").replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def own_tree():
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        st = stat_of(pid)
        pid = st[0] if st else 0
    return pids


def children_map():
    kids = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = stat_of(int(entry))
            if st:
                kids.setdefault(st[0], []).append(int(entry))
    return kids


def pin(pid):
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None  # kernel or Python without pidfds: the start time is the only check


def exited(pid, start_time, fd):
    if fd is not None:
        return bool(select.select([fd], [], [], 0)[0])
    st = stat_of(pid)
    return st is None or st[1] != start_time


def main():
    req = json.loads(sys.argv[1])
    started = time.monotonic()
    out = {"scope": None, "procs": [], "skipped": [], "stopped": False, "left": [], "error": None}
    mine = own_tree()
    tree, roots = {}, set()
    for root in req["roots"]:
        pid = int(root["pid"])
        st = stat_of(pid)
        if pid <= 1 or pid in mine:
            out["skipped"].append("PID %d is never adopted (init or this run's own tree)" % pid)
        elif st is None:
            out["skipped"].append("PID %d exited before adoption" % pid)
        elif root.get("start_time") is not None and st[1] != int(root["start_time"]):
            out["skipped"].append("PID %d is now another process (start time changed): left alone" % pid)
        else:
            tree[pid], roots = st[1], roots | {pid}
    kids = children_map()
    stack = list(tree)
    while stack:
        for child in kids.get(stack.pop(), []):
            st = stat_of(child)
            if st and child not in tree and child not in mine:
                tree[child] = st[1]
                stack.append(child)
    pinned = {}
    for pid, start_time in sorted(tree.items()):
        fd = pin(pid)
        st = stat_of(pid)
        if st is None or st[1] != start_time:
            if fd is not None:
                os.close(fd)
            continue
        pinned[pid] = (start_time, fd)
        out["procs"].append({"pid": pid, "name": text_of(pid, "comm"), "cmdline": text_of(pid, "cmdline")[:300],
                             "root": pid in roots})
    if not pinned:
        out["seconds"] = round(time.monotonic() - started, 3)
        print(json.dumps(out))
        return
    scope = "%s-%d.scope" % (req["scope"], int(time.time()))
    out["scope"] = scope
    stop_us = int(float(req["stop_timeout"]) * 1000000)
    argv = (["busctl", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
             "org.freedesktop.systemd1.Manager", "StartTransientUnit", "ssa(sv)a(sa(sv))", scope, "fail", "3",
             "Description", "s", "adopted by gpuops.reclaim.inference_service: " + req["scope"],
             "TimeoutStopUSec", "t", str(stop_us),
             "PIDs", "au", str(len(pinned))] + [str(p) for p in sorted(pinned)] + ["0"])
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30, check=False)
    if proc.returncode != 0:
        out["error"] = "systemd refused the scope %s: %s" % (scope, proc.stderr.decode().strip())
    else:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and subprocess.run(
                ["systemctl", "is-active", "--quiet", scope], check=False).returncode != 0:
            time.sleep(0.05)
        for pid, (start_time, fd) in pinned.items():
            st = stat_of(pid)
            if exited(pid, start_time, fd) and st and st[1] != start_time \
                    and scope in text_of(pid, "cgroup"):
                out["error"] = ("PID %d exited and its number was reused by another process before systemd "
                                "moved it into %s; the scope is left running, nothing stopped: look at it with "
                                "`systemctl status %s` and stop what belongs to the old server by hand"
                                % (pid, scope, scope))
        if not out["error"]:
            # systemctl stop waits for the job: SIGTERM, TimeoutStopUSec, SIGKILL, all cgroup members gone.
            stop = subprocess.run(["systemctl", "stop", scope], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  timeout=float(req["stop_timeout"]) + 60, check=False)
            out["stopped"] = stop.returncode == 0
            if stop.returncode != 0:
                out["error"] = "systemctl stop %s failed: %s" % (scope, stop.stderr.decode().strip())
    deadline = time.monotonic() + 5
    while True:
        out["left"] = [pid for pid, (start_time, fd) in sorted(pinned.items()) if not exited(pid, start_time, fd)]
        if not out["left"] or time.monotonic() > deadline or out["error"]:
            break
        time.sleep(0.05)
    for _start_time, fd in pinned.values():
        if fd is not None:
            os.close(fd)
    out["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
