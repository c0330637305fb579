"""The node side of bench/server_soak_bench.py: reads what the soak judges by, on the lab node.

usage: python3 - facts SPEC_JSON    (this file on stdin)
SPEC: {"slots": [{"unit": U, "port": P}], "host": ADDRESS, "bystanders": {NAME: [PID, START]}}
Prints {"slots": [{main: [PID, START] or null, active, children: [[PID, START]...], health: CODE}],
        "bystanders": {NAME: alive (the same PID with the same start time)}}.

Stdlib only (the node's python3): a process is named by PID and start time, so a PID reused by
another process never reads as the one recorded.
"""
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request


def start_time(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def parent(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def children(pid):
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and parent(int(name)) == pid:
            out.append([int(name), start_time(int(name))])
    return sorted(out)


def health(host, port):
    try:
        with urllib.request.urlopen("http://%s:%d/health" % (host, port), timeout=2) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return -1


def slot(unit, host, port):
    shown = subprocess.run(["systemctl", "show", "-p", "MainPID", "-p", "ActiveState", unit],
                           capture_output=True, text=True, timeout=20, check=False).stdout
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    pid = int(props.get("MainPID") or 0)
    main = [pid, start_time(pid)] if pid else None
    return {"main": main, "active": props.get("ActiveState"), "children": children(pid) if pid else [],
            "health": health(host, port)}


def main():
    if sys.argv[1:2] != ["facts"] or len(sys.argv) != 3:
        raise SystemExit("usage: python3 - facts SPEC_JSON")
    spec = json.loads(sys.argv[2])
    out = {"slots": [slot(s["unit"], spec["host"], s["port"]) for s in spec["slots"]],
           "bystanders": {name: start_time(pid) == start for name, (pid, start) in spec.get("bystanders", {}).items()}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
