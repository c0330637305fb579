"""Runs on one lab node for bench/fleet_bench.py (sent with `ansible -m script`).

usage: fleet_node.py wedge       reset the stand-in, start a GPU monitor, wedge like the seeds
       fleet_node.py converged   reset the stand-in, start a GPU monitor (GPUs free)
       fleet_node.py verify      print one JSON line: GPU memory used, monitor alive, holders left

The wedge: a TP-8 server (`python3 -m sglang.launch_server --tp 8`, 8 scheduler children of
70,000 MiB, one per GPU) whose parent is SIGKILLed, so its 8 ranks are orphans re-parented to
PID 1; a `python3 run_inference.py` holding 6,000 MiB on GPU 2 that ignores SIGTERM; a monitor
(`gpu-monitor`, only /dev/nvidiactl open, as NVML-only tools have) that must survive.
Python 3.9+, stdlib only, run as root on the node.
"""

import json
import os
import signal
import subprocess
import sys
import time

GPUS = 8
TP_MIB = 70000
SIDE_MIB = 6000
FREE_MIB = 128
MONITOR_PIDFILE = "/run/bench-fleet-monitor.pid"
READY = "/run/bench-fleet-%s.json"


def start_detached(argv):
    """Start argv in its own session, output dropped: the SSH call must not wait for it."""
    subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def wait_file(path, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as handle:
                text = handle.read()
            if text.strip():
                return text
        except OSError:
            pass
        time.sleep(0.02)
    raise SystemExit("fleet_node: %s not written within %d s" % (path, timeout))


def start_time(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def hold(name, args):
    ready = READY % name
    start_detached(["fakegpu", "hold", "--ready-file", ready] + args)
    return json.loads(wait_file(ready))


def reset():
    subprocess.run(["lab-reset-gpus", "--gpus", str(GPUS)], stdout=subprocess.DEVNULL, check=True, timeout=120)
    for path in (READY % "tp8", READY % "noterm", MONITOR_PIDFILE):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def start_monitor():
    # A process whose only GPU file is nvidiactl, like nvidia-smi -l, DCGM or a exporter.
    start_detached(["bash", "-c", "echo $$ >%s.new && mv %s.new %s && exec -a gpu-monitor sleep infinity 3</dev/nvidiactl"
                    % (MONITOR_PIDFILE, MONITOR_PIDFILE, MONITOR_PIDFILE)])
    pid = int(wait_file(MONITOR_PIDFILE))
    with open(MONITOR_PIDFILE, "w") as handle:
        handle.write("%d %s\n" % (pid, start_time(pid)))


def wedge():
    kids = []
    for gpu in range(GPUS):
        kids += ["--child", "%d:%d:sglang::scheduler_TP%d" % (gpu, TP_MIB, gpu)]
    server = hold("tp8", kids + ["--title", "python3 -m sglang.launch_server --tp 8", "--exec-name", "python3"])
    hold("noterm", ["--gpu", "2:%d" % SIDE_MIB, "--ignore-term", "--title", "python3 run_inference.py --model kimi",
                    "--exec-name", "python3"])
    os.kill(server["pid"], signal.SIGKILL)   # the seeds: the parent gone, its TP ranks orphaned
    deadline = time.monotonic() + 10
    while start_time(server["pid"]) is not None and time.monotonic() < deadline:
        time.sleep(0.01)


def verify():
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    used = {int(i): int(m) for i, m in (line.split(",") for line in out.strip().splitlines())}
    try:
        with open(MONITOR_PIDFILE) as handle:
            pid, started = handle.read().split()
        monitor = start_time(int(pid)) == started
    except (OSError, ValueError):
        monitor = False
    print(json.dumps({"used_mib": used, "free": all(m <= FREE_MIB for m in used.values()),
                      "monitor_alive": monitor}))


def main(argv):
    if argv == ["wedge"]:
        reset()
        start_monitor()
        wedge()
    elif argv == ["converged"]:
        reset()
        start_monitor()
    elif argv == ["verify"]:
        verify()
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
