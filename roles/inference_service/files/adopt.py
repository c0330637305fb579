"""Stop a server started by hand, with its whole process tree, through systemd.

usage: adopt.py SCOPE STOP_TIMEOUT PID:START_TIME...
  SCOPE: the scope's name stem ("NAME-adopted"); STOP_TIMEOUT: seconds before SIGKILL;
  each root: a PID and the start time (clock ticks after boot, /proc/PID/stat field 22)
  recorded when it was found. Only numbers come in on the command line: no command line of a
  node process ever reaches a shell line (one past 128 KiB would not even fit: E2BIG).

Prints JSON: {"scope", "procs": [{pid, name, cmdline, root}], "skipped": [sentence],
              "killed_at_once": [{pid, at_s}], "stopped": bool, "left": [pid], "seconds", "error"}.

The roots (the launcher on the port, TP ranks and orphans on the GPUs) and every descendant
of them are moved into a new transient scope unit, and that scope is stopped: systemd sends
SIGTERM to every process of it, SIGKILL after STOP_TIMEOUT, exactly as it stops the managed
unit (KillMode=control-group). So the adopted tree dies the way a unit's does, orphans
included. One exception, the collection's ladder's (gpu_reclaim): a process whose SigIgn mask
holds SIGTERM would only wait out STOP_TIMEOUT, so it gets SIGKILL at once, through its pidfd,
before the scope's stop (killed_at_once, with the time since the start of this script).

Identity (issue 22): every root must come with its start time; one without is refused,
naming it, and nothing is adopted. Each process is pinned by a pidfd before the move, and its
start time read again after the pin: from then on the pidfd says whether that very process
still lives. systemd's StartTransientUnit takes numbers (busctl cannot hand it pidfds), so
the move is verified after the fact, before anything is stopped: every member of the new
scope must be a pinned process that is still alive (a live process's PID cannot be reused)
or a child one of them forked since. Anything else (a PID reused between the pin and the
move) leaves the scope unstopped and fails, saying so.
Stdlib only, Python 3.9+ (os.pidfd_open, Linux 5.3+); needs root and systemd (busctl).
"""
import json
import os
import select
import signal
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


def ignores_term(pid):
    """Whether /proc/PID/status's SigIgn mask holds SIGTERM (the ladder's SIGKILL-at-once rule)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except (OSError, ValueError, IndexError):
        pass
    return False


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


def exited(fd):
    """The pinned process has ended (its pidfd is readable)."""
    return bool(select.select([fd], [], [], 0)[0])


def parse_roots(words):
    """[(pid, start_time or None)] from PID:START_TIME words; ValueError names a bad one."""
    roots = []
    for word in words:
        pid, _sep, start = word.partition(":")
        if not pid.isdigit():
            raise ValueError("bad root %r: expected PID:START_TIME" % word)
        roots.append((int(pid), int(start) if start.isdigit() else None))
    return roots


def zombie(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True   # gone


def scope_members(control_group):
    """PIDs whose systemd cgroup is the scope's."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or zombie(int(entry)):
            continue   # a zombie holds nothing and is its parent's to reap
        for line in text_of(int(entry), "cgroup").splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3 and parts[1] in ("name=systemd", "") and parts[2] == control_group:
                members.append(int(entry))
                break
    return members


def strangers(members, pinned):
    """Members that are neither a live pinned process nor a descendant of one."""
    live = set(pid for pid, (_st, fd) in pinned.items() if not exited(fd))
    found = []
    for pid in members:
        chain, seen = pid, set()
        while chain > 1 and chain not in live and chain not in seen:
            seen.add(chain)
            st = stat_of(chain)
            chain = st[0] if st else 0
        if chain not in live:
            found.append(pid)
    return found


def main():
    started = time.monotonic()
    out = {"scope": None, "procs": [], "skipped": [], "killed_at_once": [], "stopped": False, "left": [], "error": None}
    try:
        stem, stop_timeout, roots = sys.argv[1], float(sys.argv[2]), parse_roots(sys.argv[3:])
    except (IndexError, ValueError) as exc:
        out["error"] = "adopt.py: %s (usage: adopt.py SCOPE STOP_TIMEOUT PID:START_TIME...)" % exc
        print(json.dumps(out))
        return
    unknown = [pid for pid, start_time in roots if start_time is None]
    if unknown:
        out["error"] = ("no start time was recorded for PID %s when it was found: without it this run cannot "
                        "tell it from a process that took its number since, so nothing was adopted or stopped. "
                        "Run again (it is read afresh), or stop the hand-started server yourself"
                        % ", ".join(str(pid) for pid in unknown))
        print(json.dumps(out))
        return
    if not hasattr(os, "pidfd_open"):
        out["error"] = ("this Python has no os.pidfd_open (3.9+ on Linux 5.3+ needed to pin the processes "
                        "before the move); nothing was adopted or stopped: stop the hand-started server yourself")
        print(json.dumps(out))
        return
    mine = own_tree()
    tree, marked = {}, set()
    for pid, start_time in roots:
        st = stat_of(pid)
        if pid <= 1 or pid in mine:
            out["skipped"].append("PID %d is never adopted (init or this run's own tree)" % pid)
        elif st is None:
            out["skipped"].append("PID %d exited before adoption" % pid)
        elif st[1] != start_time:
            out["skipped"].append("PID %d is now another process (start time changed): left alone" % pid)
        else:
            tree[pid] = st[1]
            marked.add(pid)
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
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # gone since the walk
        st = stat_of(pid)
        if st is None or st[1] != start_time:
            os.close(fd)   # the number is another process's now: never moved
            continue
        pinned[pid] = (start_time, fd)
        out["procs"].append({"pid": pid, "name": text_of(pid, "comm"), "cmdline": text_of(pid, "cmdline")[:300],
                             "root": pid in marked})
    if not pinned:
        out["seconds"] = round(time.monotonic() - started, 3)
        print(json.dumps(out))
        return
    scope = "%s-%d.scope" % (stem, int(time.time()))
    out["scope"] = scope
    stop_us = int(stop_timeout * 1000000)
    argv = (["busctl", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
             "org.freedesktop.systemd1.Manager", "StartTransientUnit", "ssa(sv)a(sa(sv))", scope, "fail", "3",
             "Description", "s", "adopted by gpuops.reclaim.inference_service: " + stem,
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
        group = subprocess.run(["systemctl", "show", "-p", "ControlGroup", "--value", "--", scope],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30,
                               check=False).stdout.decode().strip()
        odd = strangers(scope_members(group), pinned) if group else None
        if odd is None:
            out["error"] = ("systemd gave the scope %s no control group to verify; left running, nothing stopped: "
                            "look at it with `systemctl status %s`" % (scope, scope))
        elif odd:
            out["error"] = ("%s holds PID %s, which is no process this run pinned (a number reused between the "
                            "check and the move): the scope is left running, nothing stopped. Look at it with "
                            "`systemctl status %s` and stop what belongs to the old server by hand"
                            % (scope, ", ".join(str(p) for p in odd), scope))
        if not out["error"]:
            # The ladder's rule: SIGTERM would do nothing to these, so no grace (pidfd: the very process).
            for pid, (_start_time, fd) in sorted(pinned.items()):
                if not exited(fd) and ignores_term(pid):
                    try:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                    except OSError:
                        continue  # exited meanwhile
                    out["killed_at_once"].append({"pid": pid, "at_s": round(time.monotonic() - started, 3)})

            # When they were all, the scope empties and systemd collects it: nothing is left to stop.
            def all_gone():
                return all(exited(fd) for _start_time, fd in pinned.values())
            gone_by = time.monotonic() + 2
            while out["killed_at_once"] and not all_gone() and time.monotonic() < gone_by:
                time.sleep(0.02)
            if out["killed_at_once"] and all_gone():
                out["stopped"] = True
            else:
                # systemctl stop waits for the job: SIGTERM, TimeoutStopUSec, SIGKILL, all cgroup members gone.
                stop = subprocess.run(["systemctl", "stop", "--", scope], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, timeout=stop_timeout + 60, check=False)
                # A scope whose last member died meanwhile is gone before the stop: stopped all the same.
                out["stopped"] = stop.returncode == 0 or all_gone()
                if not out["stopped"]:
                    out["error"] = "systemctl stop %s failed: %s" % (scope, stop.stderr.decode().strip())
    deadline = time.monotonic() + 5
    while True:
        out["left"] = [pid for pid, (_start_time, fd) in sorted(pinned.items()) if not exited(fd)]
        if not out["left"] or time.monotonic() > deadline or out["error"]:
            break
        time.sleep(0.05)
    for _start_time, fd in pinned.values():
        os.close(fd)
    out["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
