"""Read an inference server's health: wait for it, stopping the moment its unit crashes, or
observe it once over a window of probes (issue 30).

usage: wait_healthy.py REQUEST_JSON
  REQUEST_JSON: {"url": "http://HOST:PORT/health", "unit": "NAME.service",
                 "timeout": SECONDS, "delay": SECONDS,
                 "container": {"runtime": "/usr/bin/docker", "name": "NAME"} (optional),
                 "generate": {"url": "http://HOST:PORT/generate", "body": {...}, "timeout": SECONDS}
                             (optional: after /health 200, one completion must answer),
                 "mode": "wait" (default) or "observe",
                 "probe": {"period": S, "failures": N, "timeout": S}, "health_timeout": S (observe)}

wait prints JSON: {"healthy": bool, "seconds", "status" (last HTTP status, -1 closed),
              "reason" (why it stopped waiting, when not healthy), "cause" (what ended the wait:
              "unit", "container", "deadline", "generate", or null when healthy), "unit": {...},
              "container": {status, restarts, pid, exit_code} or null, "generate": {ok, hung, status,
              ttft_s, error} or null, "time_to_serve_s" (from the unit's main process start to the
              completion's answer), "ready_mono" (CLOCK_MONOTONIC at the first 200), "last_line"}.
observe prints JSON: {"unit": {... "age_s"}, "probe": {healthy, statuses, seconds}, "generate",
              "last_line": {line, age_s} or null}: facts only; the role's server_state filter judges them.

Observe: a running server is unhealthy only after `failures` probes `period` s apart all failed
(Kubernetes' failureThreshold x periodSeconds): one slow answer on a busy server is no fault. A unit
younger than health_timeout that fails its first probe is left to the role's wait (it is loading).

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
Healthy means a 200, then the completion answering (when "generate" is given): /health 200 alone
does not show that the engine generates. The port is polled every `delay` s (0.5 s by default
in the role: a probe of a closed port is one refused connect), so a 200 is seen within 1 s.
Stdlib only, Python 3.9+.
"""
import datetime
import http.client
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

UNIT_POLL_S = 0.5
# How long the unit is read again after its container exited (docker run and conmon exit
# with it): a bound, not a wait; the reading ends as soon as the unit shows the crash.
UNIT_AFTER_CONTAINER_S = 2.0
FIELDS = ("ActiveState", "SubState", "Result", "MainPID", "NRestarts", "ExecMainStatus", "ExecMainCode", "LoadState",
          "ExecMainStartTimestampMonotonic")


def unit_state(unit):
    out = subprocess.run(["systemctl", "show", "--no-pager"] + ["-p%s" % f for f in FIELDS] + ["--", unit],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=10, check=False).stdout.decode()
    state = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    for field in ("MainPID", "NRestarts", "ExecMainStatus", "ExecMainStartTimestampMonotonic"):
        state[field] = int(state.get(field) or 0)
    # systemd's start of the main process, on the clock time.monotonic() reads (CLOCK_MONOTONIC).
    start = state["ExecMainStartTimestampMonotonic"]
    state["age_s"] = round(time.monotonic() - start / 1e6, 2) if start and state["MainPID"] else None
    # The same instant on the wall clock, which the journal's and the runtime's log stamps use.
    state["start_epoch"] = time.time() - state["age_s"] if state["age_s"] is not None else None
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
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        # HTTPException: something that is not an HTTP server answers on the port (sshd on a
        # port that is taken): no health, as a closed port.
        return -1


def generate(req):
    """One completion through the engine's own API (max tokens 1): {ok, hung, status, ttft_s, error}.
    With one token the whole answer is the first token, so its time is the time to first token."""
    start = time.monotonic()
    body = json.dumps(req.get("body") or {}).encode()
    request = urllib.request.Request(req["url"], data=body, headers={"Content-Type": "application/json"})
    status, error, hung = -1, None, False
    try:
        with urllib.request.urlopen(request, timeout=float(req.get("timeout") or 60)) as resp:
            status = resp.status
            resp.read()
    except urllib.error.HTTPError as exc:
        status, error = exc.code, "answered %s" % exc.code
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        hung = "timed out" in str(reason) or isinstance(reason, TimeoutError)
        error = "no answer within %s s" % req.get("timeout") if hung else str(reason)
    seconds = round(time.monotonic() - start, 3)
    return {"ok": status == 200, "hung": hung, "status": status, "ttft_s": seconds if status == 200 else None,
            "error": error, "url": req["url"]}


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?\s(.*)$")


def _stamped(text):
    """(epoch seconds, line) of `RUNTIME logs --timestamps` output (RFC 3339, nanoseconds), or None."""
    found = _STAMP.match(text)
    if not found:
        return None
    when = datetime.datetime.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S")
    zone = found.group(3) or "Z"
    offset = 0 if zone == "Z" else (1 if zone[0] == "+" else -1) * (int(zone[1:3]) * 3600 + int(zone[-2:]) * 60)
    epoch = when.replace(tzinfo=datetime.timezone.utc).timestamp() - offset + float("0." + (found.group(2) or "0"))
    return epoch, found.group(4)


def last_line(unit, ctr, since_epoch):
    """The server's last log line since its main process started, and its age: {line, age_s} or None.
    systemd: the journal of the unit's own processes (_SYSTEMD_UNIT, not systemd's lines about it);
    docker, podman: the container's log through its runtime."""
    try:
        if ctr:
            out = subprocess.run([ctr["runtime"], "logs", "--tail", "1", "--timestamps", ctr["name"]],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=10, check=False)
            lines = [ln for ln in out.stdout.decode(errors="replace").splitlines() if ln.strip()]
            seen = _stamped(lines[-1]) if out.returncode == 0 and lines else None
        else:
            out = subprocess.run(["journalctl", "_SYSTEMD_UNIT=%s" % unit, "-n", "1", "-o", "json", "--no-pager"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=10, check=False)
            entry = json.loads(out.stdout.decode(errors="replace").strip().splitlines()[-1]) if out.stdout.strip() else None
            message = entry.get("MESSAGE") if entry else None
            if isinstance(message, list):  # journald stores a non-UTF-8 line as bytes
                message = bytes(message).decode(errors="replace")
            seen = (int(entry["__REALTIME_TIMESTAMP"]) / 1e6, message) if entry and message is not None else None
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError):
        return None
    if not seen or (since_epoch and seen[0] < since_epoch - 1):
        return None
    return {"line": seen[1].strip()[:300], "age_s": round(max(0.0, time.time() - seen[0]), 1)}


def observe(req):
    """Facts of a running server for the role's server_state filter; judges nothing."""
    unit, ctr = req.get("unit"), req.get("container") or {}
    probe = req.get("probe") or {}
    period, failures = float(probe.get("period", 5)), max(1, int(probe.get("failures", 3)))
    now = dict(unit_state(unit), unit=unit) if unit else {}
    statuses, start = [], time.monotonic()
    active = now.get("ActiveState") == "active" if unit else True
    for n in range(failures if active else 1):
        due = start + n * period
        time.sleep(max(0.0, due - time.monotonic()))
        statuses.append(health(req["url"], max(0.5, min(float(probe.get("timeout", 5)), period))))
        if statuses[-1] == 200:
            break
        age = now.get("age_s")
        if n == 0 and age is not None and age < float(req.get("health_timeout") or 0):
            break  # younger than its budget: loading, the role's wait follows
    healthy = statuses[-1] == 200
    gen = generate(req["generate"]) if healthy and req.get("generate") else None
    return {"unit": now, "probe": {"healthy": healthy, "statuses": statuses,
                                   "seconds": round(time.monotonic() - start, 2)},
            "generate": gen, "last_line": last_line(unit, ctr, now.get("start_epoch"))}


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
    if req.get("mode") == "observe":
        print(json.dumps(observe(req)))
        return
    start = time.monotonic()
    deadline = start + float(req["timeout"])
    delay = max(0.2, float(req["delay"]))
    unit = req.get("unit")
    ctr = req.get("container") or {}
    first = dict(unit_state(unit), unit=unit) if unit else {}
    ctr_first = ctr_now = None
    now, status, reason, cause, next_probe = first, -1, None, None, start
    gen = ready_mono = None
    while True:
        t = time.monotonic()
        if t >= next_probe:
            status = health(req["url"], max(0.5, min(5.0, deadline - t)))
            next_probe = time.monotonic() + delay
            if status == 200:
                ready_mono = time.monotonic()
                if req.get("generate"):
                    # Ready means it generated: one completion, bounded; no answer fails the start.
                    gen = generate(req["generate"])
                    if not gen["ok"]:
                        cause = "generate"
                        reason = "%s answered 200 but one completion at %s %s: the engine does not serve" % (
                            req["url"], gen["url"], gen["error"])
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
    healthy = status == 200 and not reason
    if unit:
        now = dict(unit_state(unit), unit=unit)
    began = now.get("ExecMainStartTimestampMonotonic") if unit else 0
    print(json.dumps({"healthy": healthy, "status": status, "reason": reason, "cause": cause,
                      "seconds": round(time.monotonic() - start, 2), "unit": now,
                      "container": ctr_now, "generate": gen, "ttft_s": gen["ttft_s"] if gen else None,
                      "ready_mono": ready_mono,
                      "time_to_serve_s": round(time.monotonic() - began / 1e6, 2) if healthy and began else None,
                      "last_line": last_line(unit, ctr, now.get("start_epoch"))}))


if __name__ == "__main__":
    main()
