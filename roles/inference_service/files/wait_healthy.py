"""Wait for an inference server's health, and stop waiting the moment its unit crashes.

usage: wait_healthy.py REQUEST_JSON
  REQUEST_JSON: {"url": "http://HOST:PORT/health", "unit": "NAME.service",
                 "timeout": SECONDS, "delay": SECONDS}

Prints JSON: {"healthy": bool, "seconds", "status" (last HTTP status, -1 closed),
              "reason" (why it stopped waiting, when not healthy), "unit": {...}}.

Healthy means /health answered 200 (Type=simple counts a unit started when it forks,
so readiness is only what the server says). While the port is closed or answers 503
(loading weights, warming up) it keeps waiting, up to `timeout`; but the unit is read
every half second, and a failed unit, a restart (NRestarts grew) or a main process
gone or replaced ends the wait at once: waiting longer would wait for nothing.
Stdlib only, Python 3.9+.
"""
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

UNIT_POLL_S = 0.5
FIELDS = ("ActiveState", "SubState", "Result", "MainPID", "NRestarts", "ExecMainStatus", "ExecMainCode")


def unit_state(unit):
    out = subprocess.run(["systemctl", "show", "--no-pager"] + ["-p%s" % f for f in FIELDS] + ["--", unit],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=10, check=False).stdout.decode()
    state = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    for field in ("MainPID", "NRestarts", "ExecMainStatus"):
        state[field] = int(state.get(field) or 0)
    return state


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


def main():
    req = json.loads(sys.argv[1])
    start = time.monotonic()
    deadline = start + float(req["timeout"])
    delay = max(0.5, float(req["delay"]))
    first = dict(unit_state(req["unit"]), unit=req["unit"])
    now, status, reason, next_probe = first, -1, None, start
    while True:
        t = time.monotonic()
        if t >= next_probe:
            status = health(req["url"], max(0.5, min(5.0, deadline - t)))
            next_probe = time.monotonic() + delay
            if status == 200:
                break
        now = dict(unit_state(req["unit"]), unit=req["unit"])
        reason = crashed(first, now)
        if reason:
            break
        if time.monotonic() >= deadline:
            reason = "no health 200 at %s within %s s (last answer: %s; %s is %s/%s, main PID %d)" % (
                req["url"], req["timeout"], "port closed" if status == -1 else status, req["unit"],
                now["ActiveState"], now["SubState"], now["MainPID"])
            break
        time.sleep(max(0.0, min(UNIT_POLL_S, next_probe - time.monotonic(), deadline - time.monotonic())))
    print(json.dumps({"healthy": status == 200 and not reason, "status": status, "reason": reason,
                      "seconds": round(time.monotonic() - start, 2), "unit": now}))


if __name__ == "__main__":
    main()
