"""The stand-in GPU driver, driven through the real pynvml (nvidia-ml-py 13.580)."""
import os
import signal
import subprocess

import pytest

from fakegpulib.testing import FakeGpuRoot

pytestmark = pytest.mark.usefixtures("stand_in_lib")


@pytest.fixture
def root(tmp_path):
    r = FakeGpuRoot(tmp_path / "root")
    r.setup("--gpus", "4")
    yield r
    r.cleanup()


def gpu(gpus, index):
    return next(g for g in gpus if g["index"] == index)


def test_idle_gpu_reports_reserved_like_h200(root):
    g = gpu(root.nvml(), 0)
    assert (g["total_mib"], g["reserved_mib"], g["used_mib"], g["used_v1_mib"]) == \
        (97887, 615, 0, 615)
    assert g["name"] == "NVIDIA H200" and g["uuid"].startswith("GPU-")
    assert g["procs"] == []


def test_holder_listed_with_its_memory_on_its_gpu(root):
    before = gpu(root.nvml(), 2)["used_v1_mib"]
    h = root.hold("--gpu", "2:1024", "--title", "sglang::scheduler_TP2")
    gpus = root.nvml()
    assert gpu(gpus, 2)["procs"] == [[h.pid, 1024]]
    assert gpu(gpus, 2)["used_v1_mib"] == before + 1024
    assert all(g["procs"] == [] for g in gpus if g["index"] != 2)
    with open("/proc/%d/comm" % h.pid) as f:
        assert f.read().strip() == "sglang::schedul"          # 15-char kernel limit
    with open("/proc/%d/cmdline" % h.pid, "rb") as f:
        assert f.read() == b"sglang::scheduler_TP2\0"
    with open("/proc/%d/maps" % h.pid) as f:
        maps = [line.split() for line in f if line.rstrip().endswith("/dev/nvidia2")]
    start, end = (int(x, 16) for x in maps[0][0].split("-"))
    assert end - start == 1024 << 20


def test_memory_back_after_sigkill(root):
    h = root.hold("--gpu", "1:2048")
    h.kill()
    gpus = root.wait_for(lambda gs: gpu(gs, 1)["used_mib"] == 0)
    assert gpu(gpus, 1)["used_mib"] == 0 and gpu(gpus, 1)["procs"] == []


def test_release_lag_keeps_memory_then_frees_it(root):
    root.fakegpu("lag", "--ms", "3000")
    h = root.hold("--gpu", "0:512")
    h.kill()
    # Right after the kill the lag (3 s) keeps the dead PID's memory allocated.
    g = gpu(root.nvml(), 0)
    assert g["used_mib"] == 512 and g["procs"] == [[h.pid, 512]]
    gpus = root.wait_for(lambda gs: gpu(gs, 0)["used_mib"] == 0, timeout=60)
    assert gpu(gpus, 0)["used_mib"] == 0


def test_forked_child_keeps_dead_parents_memory(root):
    h = root.hold("--gpu", "3:4096", "--fork-inherit")
    (child,) = h.ready["forked"]
    h.kill()
    g = gpu(root.nvml(), 3)
    # NVML names the dead parent; the child really holding the memory is not listed.
    assert g["used_mib"] == 4096 and g["procs"] == [[h.pid, 4096]]
    with open("/proc/%d/maps" % child) as f:
        maps = f.read()
    assert "/dev/nvidia3" in maps and "/dev/nvidia-uvm" not in maps
    os.kill(child, signal.SIGKILL)
    gpus = root.wait_for(lambda gs: gpu(gs, 3)["used_mib"] == 0)
    assert gpu(gpus, 3)["used_mib"] == 0 and gpu(gpus, 3)["procs"] == []


def test_children_survive_parent_sigkill(root):
    h = root.hold("--gpu", "0:100", "--child", "1:200:sglang::scheduler_TP1",
                  "--child", "2:300")
    kids = h.ready["spawned"]
    h.kill()
    gpus = root.wait_for(lambda gs: gpu(gs, 0)["used_mib"] == 0)
    assert gpu(gpus, 1)["procs"] == [[kids[0], 200]]
    assert gpu(gpus, 2)["procs"] == [[kids[1], 300]]
    with open("/proc/%d/cmdline" % kids[0], "rb") as f:
        assert f.read() == b"sglang::scheduler_TP1\0"


def test_peer_memory_is_used_mapped_and_charged_to_nobody(root):
    # NCCL rank 1 after rank 0 died (2x H200): its context on GPU 1, 291 MiB left on GPU 0.
    h = root.hold("--gpu", "1:1000", "--peer", "0:291", "--title", "sglang::scheduler_TP1")
    gpus = root.nvml()
    assert gpu(gpus, 0)["used_mib"] == 291 and gpu(gpus, 0)["procs"] == []
    assert gpu(gpus, 1)["procs"] == [[h.pid, 1000]]
    with open("/proc/%d/maps" % h.pid) as f:
        mapped = {line.split()[-1] for line in f if "/dev/nvidia" in line}
    assert {os.path.join(root.path, "dev/nvidia0"), os.path.join(root.path, "dev/nvidia1")} <= mapped
    h.kill()
    gpus = root.wait_for(lambda gs: gpu(gs, 0)["used_mib"] == 0 and gpu(gs, 1)["used_mib"] == 0)
    assert gpu(gpus, 0)["used_mib"] == 0


def test_leak_is_used_memory_with_no_process(root):
    root.fakegpu("leak", "--gpu", "1", "--mib", "777")
    g = gpu(root.nvml(), 1)
    assert g["used_mib"] == 777 and g["procs"] == []
    root.fakegpu("leak", "--gpu", "1", "--clear")
    assert gpu(root.nvml(), 1)["used_mib"] == 0


def test_each_context_uses_memory_charged_to_nobody_as_an_h200_does(tmp_path):
    # A real H200 uses a few MiB per context that NVML lists for no process (141 MiB for 24 ranks).
    r = FakeGpuRoot(tmp_path / "uncharged")
    r.setup("--gpus", "2", "--context-uncharged-mib", "6")
    try:
        a = r.hold("--gpu", "0:100")
        b = r.hold("--gpu", "0:200")
        p = r.hold("--gpu", "1:50", "--peer", "0:30")   # peer memory is no context: nothing more
        g0, g1 = gpu(r.nvml(), 0), gpu(r.nvml(), 1)
        assert sorted(g0["procs"]) == sorted([[a.pid, 100], [b.pid, 200]])
        assert g0["used_mib"] == 100 + 200 + 30 + 2 * 6
        assert g1["procs"] == [[p.pid, 50]] and g1["used_mib"] == 50 + 6
        for h in (a, b, p):
            h.kill()
        gpus = r.wait_for(lambda gs: gpu(gs, 0)["used_mib"] == 0 and gpu(gs, 1)["used_mib"] == 0)
        assert gpu(gpus, 0)["used_mib"] == 0
    finally:
        r.cleanup()


def test_minor_permutation(tmp_path):
    r = FakeGpuRoot(tmp_path / "perm")
    r.setup("--gpus", "3", "--minors", "2,0,1")
    try:
        h = r.hold("--gpu", "0:64")
        gpus = r.nvml()
        assert [g["minor"] for g in gpus] == [2, 0, 1]
        assert gpu(gpus, 0)["procs"] == [[h.pid, 64]]
        with open("/proc/%d/maps" % h.pid) as f:
            maps = f.read()
        assert "/dev/nvidia2" in maps and "/dev/nvidia0\n" not in maps
    finally:
        r.cleanup()


def test_other_pid_namespace_counted_not_listed(root):
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("unshare --pid not permitted here: %s" % probe.stderr.decode().strip())
    h = root.hold("--gpu", "2:1000", prefix=["unshare", "--pid", "--fork"])
    assert h.ready["ns_pid"] == 1 and h.pid != 1
    g = gpu(root.nvml(), 2)
    assert g["used_mib"] == 1000 and g["procs"] == []


def test_hang_knob_blocks_the_named_call(root):
    root.fakegpu("hang", "--calls", "nvmlDeviceGetComputeRunningProcesses")
    with pytest.raises(subprocess.TimeoutExpired):
        root.nvml(timeout=3)
    root.fakegpu("hang", "--off")
    assert len(root.nvml()) == 4


def test_nvidia_smi_agrees_with_nvml(root):
    h = root.hold("--gpu", "1:1500", "--title", "VLLM::Worker_TP1")
    root.fakegpu("leak", "--gpu", "3", "--mib", "10")
    gpus = root.nvml()
    out = root.smi("--query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,"
                   "memory.free,memory.reserved,persistence_mode", "--format=csv,noheader")
    assert out.returncode == 0, out.stderr
    rows = [line.split(", ") for line in out.stdout.splitlines()]
    for row, g in zip(rows, gpus):
        assert row == [str(g["index"]), g["uuid"], g["name"], g["pci_bus_id"],
                       "%d MiB" % g["total_mib"], "%d MiB" % g["used_mib"],
                       "%d MiB" % g["free_mib"], "%d MiB" % g["reserved_mib"], "Disabled"]
    apps = root.smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id",
                    "--format=csv,noheader,nounits")
    assert apps.stdout.splitlines() == ["%d, VLLM::Worker_TP1, 1500, %s, %s" % (
        h.pid, gpu(gpus, 1)["uuid"], gpu(gpus, 1)["pci_bus_id"])]


def test_gpu_reset_refuses_while_held_and_clears_leak_when_free(root):
    h = root.hold("--gpu", "0:100")
    root.fakegpu("leak", "--gpu", "0", "--mib", "50")
    bus = root.nvml()[0]["pci_bus_id"]
    refused = root.smi("--gpu-reset", "-i", "0")
    assert refused.returncode == 255
    assert "GPU %s is currently in use by another process." % bus in refused.stdout
    h.kill()
    root.wait_for(lambda gs: gpu(gs, 0)["used_mib"] == 50)
    done = root.smi("--gpu-reset", "-i", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "GPU %s was successfully reset." % bus in done.stdout
    assert gpu(root.nvml(), 0)["used_mib"] == 0


def test_persistence_mode_set_and_read(root):
    out = root.smi("-pm", "1", "-i", "2")
    assert out.returncode == 0, out.stderr
    assert [g["persistence"] for g in root.nvml()] == [0, 0, 1, 0]


def test_smi_unknown_option_fails(root):
    out = root.smi("--frobnicate")
    assert out.returncode != 0 and "--frobnicate" in out.stderr
