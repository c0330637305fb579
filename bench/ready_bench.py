"""How soon the inference_service role knows its server serves (issue 30 item 5).

For each trial: start the stand-in server (tests/fakeserve, no GPU backend) with a load of a
random 1-3 s, and at once the role's wait (roles/inference_service/files/wait_healthy.py, wait
mode, with its one completion). The server's own ready time is when its log line "The server is
fired up and ready to roll!" reached the log (stamped on CLOCK_MONOTONIC as the bench reads the
server's stdout); the role's healthy time is the wait's `ready_mono` (its first 200, same clock).
The difference is how late the role learns it. Compared: the old default poll of 10 s and the
new 0.5 s; each trial's load is random so the poll's phase is too.

    .venv/bin/python bench/ready_bench.py [--trials 10] [--delays 10,0.5]

Prints a table, writes bench/results/ready.json. Never fails on a time.
"""
import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER = os.path.join(ROOT, "tests", "fakeserve", "fakeserve")
WAIT = os.path.join(ROOT, "roles", "inference_service", "files", "wait_healthy.py")
READY = "The server is fired up and ready to roll!"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trial(delay, load):
    port = free_port()
    server = subprocess.Popen([sys.executable, SERVER, "--model-path", "m", "--port", str(port),
                               "--fake-backend", "none", "--fake-gpu-total-mib", "1000",
                               "--fake-load-seconds", str(load)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = {}

    def read():
        for line in server.stdout:
            if READY in line and "ready" not in seen:
                seen["ready"] = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    url = "http://127.0.0.1:%d" % port
    request = {"url": url + "/health", "timeout": 60, "delay": delay,
               "generate": {"url": url + "/generate", "timeout": 10,
                            "body": {"text": "Hello", "sampling_params": {"max_new_tokens": 1}}}}
    try:
        out = subprocess.run([sys.executable, WAIT, json.dumps(request)], capture_output=True, text=True,
                             timeout=120, check=False)
        result = json.loads(out.stdout)
    finally:
        os.killpg(server.pid, 9)
        server.wait()
        reader.join(5)
    if not result.get("healthy") or "ready" not in seen:
        return {"delay": delay, "load": load, "error": result.get("reason") or "no ready line"}
    return {"delay": delay, "load": round(load, 2), "late_s": round(result["ready_mono"] - seen["ready"], 3),
            "ttft_s": result.get("ttft_s")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--delays", default="10,0.5")
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = []
    for delay in [float(d) for d in args.delays.split(",")]:
        samples = [trial(delay, rng.uniform(1, 3)) for trial_no in range(args.trials)]
        late = [s["late_s"] for s in samples if "late_s" in s]
        rows.append({"delay": delay, "samples": samples, "errors": len(samples) - len(late),
                     "median_s": statistics.median(late) if late else None, "max_s": max(late) if late else None})
        print("poll %5.1f s: the role learns it serves %s s (median) / %s s (max) after the server's ready line; "
              "%d errors, %d trials" % (delay, rows[-1]["median_s"], rows[-1]["max_s"], rows[-1]["errors"], len(samples)))
    if len(rows) == 2 and rows[0]["median_s"] and rows[1]["median_s"]:
        print("median ratio %.0fx" % (rows[0]["median_s"] / rows[1]["median_s"]))
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "ready.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
