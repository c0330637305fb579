"""The stand-in's health reads and their fault knobs (issue 30 item 6), through the real pynvml."""
import json
import os
import subprocess
import time

import pytest

from fakegpulib.testing import FakeGpuRoot

pytestmark = pytest.mark.usefixtures("stand_in_lib")

# Each read as nvidia-ml-py 13.580 makes it; an NVMLError becomes its name and value.
HEALTH_PROBE = r"""
import json, sys, time, pynvml as n
n.nvmlInit()
out = []
def read(fn):
    started = time.monotonic()
    try:
        value = fn()
    except n.NVMLError as exc:
        value = {"error": str(exc), "value": exc.value}
    return value
for i in range(n.nvmlDeviceGetCount()):
    try:
        h = n.nvmlDeviceGetHandleByIndex(i)
    except n.NVMLError as exc:
        out.append({"index": i, "handle": {"error": str(exc), "value": exc.value}})
        continue
    field = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, n.NVML_FI_DEV_RESET_STATUS])
    out.append({
        "index": i,
        "remapped": read(lambda: list(n.nvmlDeviceGetRemappedRows(h))),
        "ecc": read(lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)),
        "ecc_corrected": read(lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)),
        "retired": read(lambda: n.nvmlDeviceGetRetiredPagesPendingStatus(h)),
        "recovery": [field[0].nvmlReturn, field[0].valueType, field[0].value.uiVal],
        "other_field": field[1].nvmlReturn,
    })
n.nvmlShutdown()
print(json.dumps(out))
"""


@pytest.fixture
def root(tmp_path):
    r = FakeGpuRoot(tmp_path / "root")
    r.setup("--gpus", "2")
    yield r
    r.cleanup()


def health(root, timeout=60):
    out = subprocess.run([root.python, "-c", HEALTH_PROBE], env=root.env, capture_output=True,
                         text=True, timeout=timeout, check=True)
    return json.loads(out.stdout)


def test_a_healthy_gpu_answers_as_the_h100_measured(root):
    """No fault: what an H100 with driver 580.159.04 answered (issue 30): remapped rows 0,0,0,0,
    retired pages Not Supported, field 230 0; a field it does not know is Not Supported."""
    gpus = health(root)
    for g in gpus:
        assert g["remapped"] == [0, 0, 0, 0]
        assert g["ecc"] == 0 and g["ecc_corrected"] == 0
        assert g["retired"] == {"error": "Not Supported", "value": 3}
        assert g["recovery"] == [0, 1, 0]
        assert g["other_field"] == 3


@pytest.mark.parametrize("args, key, want", [
    (("row-remap-pending",), "remapped", [0, 0, 1, 0]),
    (("row-remap-failed",), "remapped", [0, 0, 0, 1]),
    (("ecc", "3"), "ecc", 3),
    (("retired-pending",), "retired", 1),
    (("recovery-action", "2"), "recovery", [0, 1, 2]),
    (("recovery-action", "4"), "recovery", [0, 1, 4]),
])
def test_each_fault_is_read_on_its_gpu_only(root, args, key, want):
    root.fakegpu("fault", "--gpu", "1", *args)
    gpus = health(root)
    assert gpus[1][key] == want
    assert health_of_clean(gpus[0])


def health_of_clean(g):
    return g["remapped"] == [0, 0, 0, 0] and g["ecc"] == 0 and g["recovery"] == [0, 1, 0]


def test_a_lost_gpu_answers_gpu_is_lost_for_its_handle(root):
    root.fakegpu("fault", "--gpu", "1", "lost")
    gpus = health(root)
    assert gpus[1]["handle"] == {"error": "GPU is lost", "value": 15}
    assert health_of_clean(gpus[0])


def test_hang_health_blocks_each_health_read_and_nothing_else(root):
    root.fakegpu("fault", "--gpu", "0", "hang-health", "1.5")
    started = time.monotonic()
    gpus = root.nvml()     # memory, processes, identity: not health reads
    assert time.monotonic() - started < 1.5 and len(gpus) == 2
    started = time.monotonic()
    health(root)
    # four reads of GPU 0 (remapped, ecc twice, retired, fields): each blocks 1.5 s first
    assert time.monotonic() - started >= 5 * 1.5


def test_clear_and_setup_keep_or_drop_faults(root):
    root.fakegpu("fault", "--gpu", "1", "ecc", "7")
    root.setup("--gpus", "2")                 # setup again keeps the faults, as the leak
    assert health(root)[1]["ecc"] == 7
    root.fakegpu("fault", "--clear")
    assert health_of_clean(health(root)[1])


@pytest.mark.parametrize("args, says", [
    (("--gpu", "1", "ecc"), "needs a value"),
    (("--gpu", "1", "ecc", "x"), "not a number"),
    (("--gpu", "1", "recovery-action", "9"), "must be 0..5"),
    (("--gpu", "1", "hang-health", "0"), "must be > 0"),
    (("--gpu", "1", "lost", "1"), "takes no value"),
    (("--gpu", "1", "melted"), "not one of"),
    (("lost",), "needs --gpu"),
    (("--gpu", "5", "lost"), "does not exist"),
    (("--gpu", "1", "lost", "--clear"), "not both"),
])
def test_bad_fault_is_refused_and_changes_nothing(root, args, says):
    before = root.config()
    out = root.fakegpu("fault", *args, check=False)
    assert out.returncode == 2 and says in out.stderr
    assert root.config() == before


def test_xid_writes_the_driver_line_journalctl_shows(root):
    log = os.path.join(root.path, "var/log/fakegpu/kernel.log")
    root.fakegpu("xid", "--gpu", "1", "79", "--at", "1765000000.5")
    root.fakegpu("xid", "--gpu", "0", "48", "--pid", "4242", "--text", "An uncorrectable double bit error")
    with open(log) as f:
        lines = f.read().splitlines()
    assert len(lines) == 2
    stamp, _host, kernel, rest = lines[0].split(" ", 3)
    assert (stamp, kernel) == ("1765000000.500000", "kernel:")
    # GPU 1's bus id is 00000000:2A:00.0: the driver names it PCI:0000:2a:00
    assert rest == "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=, GPU has fallen off the bus."
    assert "NVRM: Xid (PCI:0000:18:00): 48, pid=4242, name=python3, An uncorrectable double bit error" in lines[1]
    root.fakegpu("xid", "--clear")
    assert os.path.getsize(log) == 0
    assert root.fakegpu("xid", "--gpu", "1", "0", check=False).returncode == 2
