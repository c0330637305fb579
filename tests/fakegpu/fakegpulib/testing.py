"""Helpers for tests that drive the stand-in driver with the real pynvml.

Usage (pytest):
    from fakegpulib.testing import FakeGpuRoot
    root = FakeGpuRoot(tmp_path); root.setup("--gpus", "4")
    holder = root.hold("--gpu", "2:1024")        # waits until the memory is visible
    root.nvml()                                 # what pynvml reports, per GPU
    root.cleanup()                              # SIGKILLs every process it started
"""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
FAKEGPU = os.path.join(HERE, "fakegpu")
NVIDIA_SMI = os.path.join(HERE, "nvidia-smi")
LIB_DIR = os.path.join(HERE, "build")

# Runs in a subprocess so that pynvml loads the stand-in through LD_LIBRARY_PATH.
NVML_PROBE = r"""
import json, sys, pynvml as n
n.nvmlInit()
out = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    m1 = n.nvmlDeviceGetMemoryInfo(h)
    m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    out.append({
        "index": n.nvmlDeviceGetIndex(h), "minor": n.nvmlDeviceGetMinorNumber(h),
        "uuid": n.nvmlDeviceGetUUID(h), "name": n.nvmlDeviceGetName(h),
        "pci_bus_id": n.nvmlDeviceGetPciInfo(h).busId,
        "total_mib": m1.total >> 20, "used_v1_mib": m1.used >> 20,
        "used_mib": m2.used >> 20, "reserved_mib": m2.reserved >> 20, "free_mib": m2.free >> 20,
        "procs": [[p.pid, p.usedGpuMemory >> 20]
                  for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
        "persistence": n.nvmlDeviceGetPersistenceMode(h),
    })
n.nvmlShutdown()
print(json.dumps(out))
"""


def build_lib():
    subprocess.run(["make", "-s", "-C", HERE], check=True)


class Holder:
    def __init__(self, proc, ready):
        self.proc = proc
        self.ready = ready
        self.pid = ready["pid"]
        self.children = ready["children"]

    def kill(self):
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


class FakeGpuRoot:
    def __init__(self, path, python=sys.executable):
        self.path = str(path)
        self.python = python
        self.pids = []
        self.procs = []

    @property
    def env(self):
        env = dict(os.environ, FAKEGPU_ROOT=self.path)
        env["LD_LIBRARY_PATH"] = LIB_DIR + (":" + env["LD_LIBRARY_PATH"]
                                            if env.get("LD_LIBRARY_PATH") else "")
        return env

    def fakegpu(self, *args, check=True):
        return subprocess.run([sys.executable, FAKEGPU] + list(args), env=self.env,
                              capture_output=True, text=True, check=check, timeout=120)

    def smi(self, *args):
        return subprocess.run([sys.executable, NVIDIA_SMI] + list(args), env=self.env,
                              capture_output=True, text=True, timeout=120, check=False)

    def setup(self, *args):
        return self.fakegpu("setup", *args)

    def config(self):
        with open(os.path.join(self.path, "etc/fakegpu/config.json")) as f:
            return json.load(f)

    def hold(self, *args, prefix=(), timeout=60):
        """Starts `fakegpu hold ARGS` in the background; returns once it is ready."""
        ready_file = os.path.join(self.path, "ready-%d.json" % len(self.procs))
        cmd = list(prefix) + [sys.executable, FAKEGPU, "hold", "--ready-file", ready_file]
        proc = subprocess.Popen(cmd + list(args), env=self.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs.append(proc)
        deadline = time.monotonic() + timeout
        while not os.path.exists(ready_file):
            if proc.poll() is not None:
                raise RuntimeError("hold exited %s: %s"
                                   % (proc.returncode, proc.stderr.read().decode()))
            if time.monotonic() > deadline:
                raise RuntimeError("hold not ready after %ss" % timeout)
            time.sleep(0.02)
        with open(ready_file) as f:
            ready = json.load(f)
        self.pids += [ready["pid"]] + ready["children"]
        return Holder(proc, ready)

    def nvml(self, python=None, timeout=60):
        out = subprocess.run([python or self.python, "-c", NVML_PROBE], env=self.env,
                             capture_output=True, text=True, timeout=timeout, check=True)
        return json.loads(out.stdout)

    def wait_for(self, predicate, timeout=30):
        """Polls NVML until predicate(gpus) holds; returns the last reading."""
        deadline = time.monotonic() + timeout
        while True:
            gpus = self.nvml()
            if predicate(gpus) or time.monotonic() > deadline:
                return gpus
            time.sleep(0.05)

    def cleanup(self):
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self.procs:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()
