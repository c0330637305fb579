"""Wait for an inference server's health, and stop waiting the moment its unit crashes.

usage: wait_healthy.py REQUEST_JSON
  REQUEST_JSON: {"url": "http://HOST:PORT/health", "unit": "NAME.service",
                 "timeout": SECONDS, "delay": SECONDS,
                 "container": {"runtime": "/usr/bin/docker", "name": "NAME"} (optional)}

Prints JSON: {"healthy": bool, "seconds", "status" (last HTTP status, -1 closed),
              "reason" (why it stopped waiting, when not healthy), "cause" (what ended the wait:
              "unit", "container", "deadline", or null when healthy), "unit": {...},
              "container": {status, restarts, pid, exit_code} or null}.

Healthy means /health answered 200 (Type=simple counts a unit started when it forks,
so readiness is only what the server says). While the port is closed or answers 503
(loading weights, warming up) it keeps waiting, up to `timeout`; but the unit is read
every half second, and a failed unit, a restart (NRestarts grew) or a main process
gone or replaced ends the wait at once: waiting longer would wait for nothing.
With "container", the container is read through its runtime at the same pace (`inspect`:
State.Status, RestartCount): once it has been seen, its exit (exited, dead, gone) or a restart
(RestartCount grew, or the runtime shows it restarting) ends the wait at once too. That is the
only sign of a crash when the runtime's --restart policy brings the engine back inside a
container that never stops, so the unit that wraps it sees nothing. Before the runtime knows
the container (the unit's `run` is still creating it) nothing is concluded from it.
Without "unit", only the container is watched.
Stdlib only, Python 3.9+.
"""
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

UNIT_POLL_S = 0.5
# How long the unit is read again after its container exited (docker run and conmon exit
# with it): a bound, not a wait; the reading ends as soon as the unit shows the crash.
UNIT_AFTER_CONTAINER_S = 2.0
FIELDS = ("ActiveState", "SubState", "Result", "MainPID", "NRestarts", "ExecMainStatus", "ExecMainCode")


def unit_state(unit):
    out = subprocess.run(["systemctl", "show", "--no-pager"] + ["-p%s" % f for f in FIELDS] + ["--", unit],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=10, check=False).stdout.decode()
    state = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    for field in ("MainPID", "NRestarts", "ExecMainStatus"):
        state[field] = int(state.get(field) or 0)
    return state


def container_state(runtime, name):
    """{status, restarts, pid} of a container as its runtime reports it, or None when it has none."""
    fmt = "{{.State.Status}} {{.RestartCount}} {{.State.Pid}} {{.State.ExitCode}}"
    try:
        out = subprocess.run([runtime, "container", "inspect", "--format", fmt, name], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = out.stdout.decode().split()
    if out.returncode != 0 or len(words) != 4 or not words[1].isdigit():
        return None
    return {"status": words[0], "restarts": int(words[1]), "pid": int(words[2]) if words[2].isdigit() else 0,
            "exit_code": words[3]}


def container_gone(name, first, now):
    """Why the container shows the engine crashed or restarted, else None (first: its first reading)."""
    if first is None:
        return None
    if now is None:
        return "container %s is gone (it was %s)" % (name, first["status"])
    if now["restarts"] > first["restarts"] or now["status"] == "restarting":
        return "container %s crashed and was restarted by its runtime (RestartCount %d -> %d, %s, last exit code %s)" % (
            name, first["restarts"], now["restarts"], now["status"], now["exit_code"])
    if now["status"] in ("exited", "dead", "stopped", "removing"):
        return "container %s %s with exit code %s" % (name, now["status"], now["exit_code"])
    return None


def health(url, timeout):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError, ValueError):
        return -1


def crashed(first, now):
    """Why the unit shows the server is gone for good (or restarting), else None."""
    exited = "exit status %s" % now["ExecMainStatus"]
    if now["ActiveState"] == "failed":
        return "%s failed (Result=%s, %s)" % (now["unit"], now["Result"], exited)
    if now["NRestarts"] > first["NRestarts"]:
        return "%s crashed and was restarted by systemd (NRestarts %d -> %d, last %s)" % (
            now["unit"], first["NRestarts"], now["NRestarts"], exited)
    if now["ActiveState"] in ("inactive", "deactivating"):
        # A unit that wraps a container runtime (podman's conmon, docker run) is deactivating
        # when its container exits, before systemd restarts it: a failure status is a crash.
        if now["ExecMainStatus"] != 0 or now["Result"] not in ("success", ""):
            return "%s main process exited with status %d (%s/%s, Result=%s): the server crashed" % (
                now["unit"], now["ExecMainStatus"], now["ActiveState"], now["SubState"], now["Result"])
        return "%s stopped (%s/%s, %s)" % (now["unit"], now["ActiveState"], now["SubState"], exited)
    if first["MainPID"] and now["MainPID"] != first["MainPID"]:
        return "%s main process %d is gone (%s/%s, %s)" % (
            now["unit"], first["MainPID"], now["ActiveState"], now["SubState"], exited)
    if not now["MainPID"]:
        return "%s has no main process (%s/%s, %s)" % (now["unit"], now["ActiveState"], now["SubState"], exited)
    return None


def unit_verdict(unit, first, within):
    """(state, reason) once the unit shows the crash, polled for `within` seconds, else None."""
    end = time.monotonic() + within
    while True:
        now = dict(unit_state(unit), unit=unit)
        reason = crashed(first, now)
        if reason or time.monotonic() >= end:
            return (now, reason) if reason else None
        time.sleep(0.1)


def main():
    req = json.loads(sys.argv[1])
    start = time.monotonic()
    deadline = start + float(req["timeout"])
    delay = max(0.5, float(req["delay"]))
    unit = req.get("unit")
    ctr = req.get("container") or {}
    first = dict(unit_state(unit), unit=unit) if unit else {}
    ctr_first = ctr_now = None
    now, status, reason, cause, next_probe = first, -1, None, None, start
    while True:
        t = time.monotonic()
        if t >= next_probe:
            status = health(req["url"], max(0.5, min(5.0, deadline - t)))
            next_probe = time.monotonic() + delay
            if status == 200:
                break
        # The unit first: its reading names the exit status when both show the same crash.
        if unit:
            now = dict(unit_state(unit), unit=unit)
            reason = crashed(first, now)
            if reason:
                cause = "unit"
                break
        if ctr:
            ctr_now = container_state(ctr["runtime"], ctr["name"])
            if ctr_first is None and ctr_now is not None and ctr_now["status"] not in ("created", "configured"):
                ctr_first = ctr_now
            reason = container_gone(ctr["name"], ctr_first, ctr_now)
            if reason:
                cause = "container"
                if unit:
                    # The unit that wraps the runtime ends with the container (its `run` exits):
                    # its reading names the exit status, so it is read again for a moment.
                    seen = unit_verdict(unit, first, UNIT_AFTER_CONTAINER_S)
                    if seen:
                        now, reason, cause = seen[0], seen[1], "unit"
                break
        if time.monotonic() >= deadline:
            cause = "deadline"
            reason = "no health 200 at %s within %s s (last answer: %s; %s)" % (
                req["url"], req["timeout"], "port closed" if status == -1 else status,
                "%s is %s/%s, main PID %d" % (unit, now["ActiveState"], now["SubState"], now["MainPID"]) if unit
                else "container %s is %s" % (ctr.get("name"), (ctr_now or {}).get("status", "unknown")))
            break
        time.sleep(max(0.0, min(UNIT_POLL_S, next_probe - time.monotonic(), deadline - time.monotonic())))
    print(json.dumps({"healthy": status == 200 and not reason, "status": status, "reason": reason, "cause": cause,
                      "seconds": round(time.monotonic() - start, 2), "unit": now,
                      "container": ctr_now}))


if __name__ == "__main__":
    main()
