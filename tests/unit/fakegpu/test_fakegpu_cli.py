"""Bad input to every `fakegpu` subcommand: a clear error naming the value, config unchanged."""
import json
import os
import subprocess
import sys
import time

import pytest

from fakegpulib.testing import FAKEGPU, FakeGpuRoot

pytestmark = pytest.mark.usefixtures("stand_in_lib")


@pytest.fixture
def root(tmp_path):
    r = FakeGpuRoot(tmp_path / "root")
    r.setup("--gpus", "2")
    yield r
    r.cleanup()


BAD = [
    (["setup", "--gpus", "0"], "--gpus 0:"),
    (["setup", "--gpus", "65"], "--gpus 65:"),
    (["setup", "--gpus", "eight"], "'eight'"),
    (["setup", "--memory-mib", "-5"], "--memory-mib -5:"),
    (["setup", "--reserved-mib", "200000"], "--reserved-mib 200000:"),
    (["setup", "--gpus", "2", "--minors", "0,0"], "--minors '0,0'"),
    (["setup", "--gpus", "2", "--minors", "1,x"], "--minors '1,x'"),
    (["setup", "--gpus", "2", "--minors", "0,1,2"], "--minors '0,1,2'"),
    (["setup", "--name", ""], "--name ''"),
    (["setup", "--release-lag-ms", "-1"], "--release-lag-ms -1:"),
    (["hold", "--gpu", "7:100"], "GPU index 7 "),
    (["hold", "--gpu", "0:-3"], "--gpu '0:-3'"),
    (["hold", "--gpu", "zero"], "--gpu 'zero'"),
    (["hold", "--gpu", "0:999999"], "asked 999999 MiB"),
    (["hold", "--child", "1:abc"], "--child '1:abc'"),
    (["hold", "--peer", "0:100"], "--peer needs a context of our own"),
    (["hold", "--gpu", "0:10", "--peer", "0:100"], "--peer 0: peer memory lives on another GPU"),
    (["hold", "--gpu", "0:10", "--peer", "9:100"], "GPU index 9 "),
    (["hold", "--gpu", "0:1", "--title", ""], "--title ''"),
    (["hold", "--gpu", "0:1", "--load-s", "-1"], "--load-s -1.0"),
    (["hold", "--gpu", "0:1", "--load-s", "nan"], "--load-s nan"),
    (["hold", "--gpu", "0:1", "--load-s", "soon"], "'soon'"),
    (["hold", "--gpu", "0:1", "--load-until", "loaded"], "--load-until 'loaded'"),
    (["hold", "--gpu", "0:1", "--import-s", "7200"], "--import-s 7200.0"),
    (["leak", "--gpu", "5", "--mib", "10"], "GPU index 5 "),
    (["leak", "--gpu", "0", "--mib", "-1"], "--mib -1:"),
    (["leak", "--gpu", "0", "--mib", "99999999"], "--mib 99999999:"),
    (["leak", "--gpu", "0"], "--mib"),
    (["setup", "--context-uncharged-mib", "-1"], "--context-uncharged-mib -1:"),
    (["setup", "--context-uncharged-mib", "2048"], "--context-uncharged-mib 2048:"),
    (["lag", "--ms", "-7"], "--ms -7:"),
    (["lag", "--ms", "soon"], "'soon'"),
    (["hang", "--calls", "nvmlFoo,rm -rf"], "'rm -rf'"),
    (["hang", "--calls", "all", "--seconds", "0"], "--seconds 0"),
    (["hang"], "--calls"),
    (["frobnicate"], "'frobnicate'"),
]


@pytest.mark.parametrize("argv,named", BAD, ids=[" ".join(a) for a, _unused in BAD])
def test_bad_input_is_refused_and_changes_nothing(root, argv, named):
    before = root.config()
    dev_before = sorted(os.listdir(os.path.join(root.path, "dev")))
    out = root.fakegpu(*argv, check=False)
    assert out.returncode != 0
    assert named in out.stderr, out.stderr
    assert root.config() == before
    assert sorted(os.listdir(os.path.join(root.path, "dev"))) == dev_before
    assert os.listdir(os.path.join(root.path, "var/lib/fakegpu/alloc")) == []


def test_setup_is_idempotent_and_keeps_uuids(root):
    first = root.config()
    root.setup("--gpus", "2")
    assert root.config() == first


def test_hold_before_setup_says_what_to_do(tmp_path):
    r = FakeGpuRoot(tmp_path / "empty")
    out = r.fakegpu("hold", "--gpu", "0:1", check=False)
    assert out.returncode == 2 and "fakegpu setup" in out.stderr


def test_status_lists_gpus_and_allocations(root):
    import json
    h = root.hold("--gpu", "1:64")
    status = json.loads(root.fakegpu("status").stdout)
    assert [g["index"] for g in status["gpus"]] == [0, 1]
    assert status["gpus"][1]["processes"] == [{"pid": h.pid, "used_mib": 64}]
    assert [a["mib"] for a in status["allocations"]] == [64]


def start_hold(root, *args):
    """A `fakegpu hold` of 64 MiB on GPU 1 titled sglang::scheduler_TP1, ended by the fixture."""
    proc = subprocess.Popen([sys.executable, FAKEGPU, "hold", "--gpu", "1:64", "--title", "sglang::scheduler_TP1"]
                            + list(args), env=root.env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root.pids.append(proc.pid)
    root.procs.append(proc)
    return proc


def comm(proc):
    with open("/proc/%d/comm" % proc.pid) as f:
        return f.read().strip()


def wait_titled(proc):
    deadline = time.monotonic() + 30
    while comm(proc) != "sglang::schedul" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert comm(proc) == "sglang::schedul"


def test_hold_with_load_s_takes_its_title_first_and_the_memory_only_after_loading(root):
    """A restarted server re-titles itself at once and takes the GPU seconds later."""
    proc = start_hold(root, "--import-s", "0.5", "--load-s", "1.5")
    try:
        def cmdline():
            with open("/proc/%d/cmdline" % proc.pid, "rb") as f:
                return f.read()
        deadline = time.monotonic() + 30
        while b"hold" not in cmdline() and time.monotonic() < deadline:
            time.sleep(0.02)
        # importing: its own command line, no title yet
        assert b"--import-s" in cmdline()
        wait_titled(proc)
        with open("/proc/%d/cmdline" % proc.pid, "rb") as f:
            assert f.read().split(b"\0")[0] == b"sglang::scheduler_TP1"
        # titled, still loading: nothing mapped, nothing used
        status = json.loads(root.fakegpu("status").stdout)
        assert status["allocations"] == [] and status["gpus"][1]["processes"] == []
        gpus = root.wait_for(lambda g: g[1]["used_mib"] >= 64)
        assert gpus[1]["used_mib"] >= 64 and proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_hold_with_load_until_maps_its_memory_only_once_the_file_exists(root, tmp_path):
    """A load a test ends: titled at once, the memory mapped only after the file appears."""
    loaded = tmp_path / "loaded"
    proc = start_hold(root, "--load-until", str(loaded))
    try:
        wait_titled(proc)
        time.sleep(1.0)   # titled a second ago and still nothing mapped: it waits for the file
        assert proc.poll() is None and root.nvml()[1]["used_mib"] == 0
        loaded.touch()
        gpus = root.wait_for(lambda g: g[1]["used_mib"] >= 64)
        assert gpus[1]["used_mib"] >= 64 and proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=30)
