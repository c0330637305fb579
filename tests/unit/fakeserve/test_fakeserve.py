"""fakeserve: the KV capacity model and its behaviour as a process (no GPU needed)."""
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

FAKESERVE = pathlib.Path(__file__).resolve().parents[2] / "fakeserve" / "fakeserve"
_loader = importlib.machinery.SourceFileLoader("fakeserve", str(FAKESERVE))
fs = importlib.util.module_from_spec(importlib.util.spec_from_loader("fakeserve", _loader))
_loader.exec_module(fs)

SEED_GPUS = [97887] * 8  # the seed hosts: 8 x RTX PRO 6000 Blackwell


def test_seed_085_gives_about_116k_tokens():
    gpu, host = fs.kv_tokens(0.85, SEED_GPUS)
    assert host == 0
    assert 112_000 <= gpu <= 120_000


def test_seed_300gb_hicache_gives_about_410k_tokens():
    gpu, host = fs.kv_tokens(0.85, SEED_GPUS, enable_hierarchical_cache=True, hicache_size_gb=300)
    assert 400_000 <= gpu + host <= 420_000


def test_more_fraction_more_tokens_and_hicache_needs_enabling():
    assert fs.kv_tokens(0.93, SEED_GPUS)[0] > fs.kv_tokens(0.85, SEED_GPUS)[0]
    assert fs.kv_tokens(0.85, SEED_GPUS, enable_hierarchical_cache=False, hicache_size_gb=300)[1] == 0


def test_hicache_ratio_applies_without_size_and_fp8_doubles():
    gpu, host = fs.kv_tokens(0.85, SEED_GPUS, enable_hierarchical_cache=True, hicache_ratio=2.0)
    assert host == 2 * gpu
    assert fs.kv_tokens(0.85, SEED_GPUS, kv_cache_dtype="fp8_e4m3")[0] == pytest.approx(2 * gpu, abs=2)


def test_fraction_below_weights_gives_no_kv():
    assert fs.kv_tokens(0.5, SEED_GPUS) == (0, 0)


def test_unknown_flag_is_rejected_like_argparse():
    res = subprocess.run([sys.executable, str(FAKESERVE), "--model-path", "m", "--no-such-flag", "1"],
                         capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 2
    assert "unrecognized arguments: --no-such-flag 1" in res.stderr


def test_bad_fraction_is_named():
    res = subprocess.run([sys.executable, str(FAKESERVE), "--model-path", "m", "--mem-fraction-static", "1.5"],
                         capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 2 and "1.5" in res.stdout


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None, b""


def _children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


@pytest.fixture
def server():
    procs = []

    def start(*extra, env=None):
        port = _free_port()
        e = dict(os.environ, CUDA_VISIBLE_DEVICES="3,5", **(env or {}))
        p = subprocess.Popen([sys.executable, str(FAKESERVE), "--model-path", "m", "--tp-size", "2",
                              "--port", str(port), "--fake-backend", "none", "--fake-gpu-total-mib", "81920",
                              "--fake-load-seconds", "1", *extra],
                             env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(p)
        return p, "http://127.0.0.1:%d" % port

    yield start
    for p in procs:
        for c in _children(p.pid):
            os.kill(c, signal.SIGKILL)
        p.kill()
        p.wait()


def _wait_status(url, want, timeout=15):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if _get(url)[0] == want:
            return True
        time.sleep(0.1)
    return False


def test_lifecycle_term_ignored_while_loading_then_honoured(server):
    p, base = server("--mem-fraction-static", "0.93", "--enable-hierarchical-cache", "--hicache-size", "4")
    # Its first log line comes once it runs (handlers installed); a fixed sleep races a loaded host.
    assert "server_args=" in p.stdout.readline()
    assert _get(base + "/health")[0] is None          # port closed while loading
    p.send_signal(signal.SIGTERM)                       # ignored: still loading
    assert _wait_status(base + "/health", 200)
    code, body = _get(base + "/get_server_info")
    info = json.loads(body)
    assert code == 200 and info["mem_fraction_static"] == 0.93 and info["tp_size"] == 2
    assert info["enable_hierarchical_cache"] is True and info["hicache_size"] == 4
    assert info["gpu_ids"] == [3, 5]
    gpu, host = fs.kv_tokens(0.93, [81920, 81920], True, 4)
    assert info["max_total_num_tokens"] == gpu + host
    kids = _children(p.pid)
    assert len(kids) == 2
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=10)[0]
    assert "SIGTERM ignored: still loading" in out
    assert "max_total_num_tokens=%d" % (gpu + host) in out
    assert "The server is fired up and ready to roll!" in out
    for k in kids:                                       # children stopped with it
        assert not pathlib.Path("/proc/%d" % k).exists() or "Z" in pathlib.Path("/proc/%d/stat" % k).read_text().split()[2]


def test_sigkill_orphans_the_ranks(server):
    p, base = server()
    assert _wait_status(base + "/health", 200)
    kids = _children(p.pid)
    p.kill()
    p.wait()
    # The kernel re-parents the ranks while their parent exits, before wait() returns; a rank
    # bound to die with its parent (PR_SET_PDEATHSIG) would have its signal pending or be
    # exiting by now. Each is alive, re-parented and has no signal pending.
    for k in kids:
        status = dict(line.split(":", 1) for line in pathlib.Path("/proc/%d/status" % k).read_text().splitlines())
        assert status["State"].split()[0] not in ("Z", "X"), "rank %d should survive its parent" % k
        assert int(status["PPid"]) != p.pid
        assert int(status["SigPnd"], 16) == 0 and int(status["ShdPnd"], 16) == 0, status
        os.kill(k, signal.SIGKILL)


def test_hang_after_load_never_opens_port(server):
    p, base = server("--fake-fault", "hang-after-load")
    assert not _wait_status(base + "/health", 200, timeout=3)
    assert p.poll() is None


def test_a_load_until_fault_loads_until_its_file_exists(server, tmp_path):
    fault, release = tmp_path / "fault", tmp_path / "release"
    fault.write_text("load-until %s\n" % release)
    p, base = server(env={"FAKESERVE_FAULT_FILE": str(fault), "FAKESERVE_PROGRESS_SECONDS": "0.2"})
    # Past its --fake-load-seconds 1, still loading: port closed, progress printed, alive.
    assert not _wait_status(base + "/health", 200, timeout=3)
    assert p.poll() is None and not fault.exists()
    release.touch()
    assert _wait_status(base + "/health", 200)
    p.send_signal(signal.SIGTERM)                       # serving: stops its ranks and exits
    out = p.communicate(timeout=10)[0]
    shards = [line for line in out.splitlines() if "Loading safetensors checkpoint shards" in line]
    assert len(shards) >= 10 and shards[-1].endswith("100% Completed | 64/64"), shards


def test_crash_exits_nonzero(server):
    p = server(env={"FAKESERVE_FAULT": "crash"})[0]
    assert p.wait(timeout=15) != 0


def test_too_many_ranks_for_visible_gpus(server):
    p = server("--tp-size", "4")[0]
    out = p.communicate(timeout=15)[0]
    assert p.returncode == 1 and "tp_size=4 but only 2 GPU(s) visible" in out


class _Completion:
    """A slow completion in a thread: (status, body, seconds) once answered, ("error", ...) on a reset."""

    def __init__(self, url, body):
        import threading
        self.result = None
        self.thread = threading.Thread(target=self._run, args=(url, body), daemon=True)
        self.thread.start()

    def _run(self, url, body):
        start = time.monotonic()
        try:
            req = urllib.request.Request(url, data=json.dumps(body).encode())
            with urllib.request.urlopen(req, timeout=30) as r:
                self.result = (r.status, json.loads(r.read()), time.monotonic() - start)
        except (OSError, ValueError) as exc:
            self.result = ("error", repr(exc), time.monotonic() - start)


def _in_flight(url, name):
    code, body = _get(url + "/metrics")
    if code != 200:
        return code
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines() if line.startswith(name + "{"))


def test_sglang_drains_its_requests_in_flight_on_sigterm_and_refuses_new_ones(server):
    p, base = server("--enable-metrics", env={"FAKESERVE_TOKEN_SECONDS": "0.1"})
    assert _wait_status(base + "/health", 200)
    slow = _Completion(base + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 30}})
    end = time.monotonic() + 5
    while _in_flight(base, "sglang:num_running_reqs") != 1 and time.monotonic() < end:
        time.sleep(0.05)
    assert _in_flight(base, "sglang:num_running_reqs") == 1
    kids = _children(p.pid)
    p.send_signal(signal.SIGTERM)
    assert _wait_status(base + "/health", 503, timeout=5)        # draining: no longer ready
    req = urllib.request.Request(base + "/generate", data=b'{"text": "y"}')
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=5)
    assert refused.value.code == 503
    out = p.communicate(timeout=20)[0]
    slow.thread.join(10)
    status, answer, took = slow.result
    assert status == 200 and answer["meta_info"]["completion_tokens"] == 30 and took >= 3.0, slow.result
    assert "draining 1 request(s) in flight" in out and "All requests drained" in out, out
    for k in kids:
        assert not pathlib.Path("/proc/%d" % k).exists() or "Z" in pathlib.Path("/proc/%d/stat" % k).read_text().split()[2]


def test_sglang_exports_metrics_only_when_enabled(server):
    _p, base = server()
    assert _wait_status(base + "/health", 200)
    assert _in_flight(base, "sglang:num_running_reqs") == 404


def test_vllm_aborts_what_outlives_its_shutdown_timeout(tmp_path):
    vllm = tmp_path / "vllm"
    vllm.symlink_to(FAKESERVE)
    port = _free_port()
    p = subprocess.Popen([sys.executable, str(vllm), "serve", "m", "--port", str(port), "--shutdown-timeout", "1",
                          "--fake-backend", "none", "--fake-gpu-total-mib", "81920", "--fake-load-seconds", "0.2"],
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES="0", FAKESERVE_TOKEN_SECONDS="0.1"),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = "http://127.0.0.1:%d" % port
    try:
        assert _wait_status(base + "/health", 200)
        slow = _Completion(base + "/v1/completions", {"prompt": "x", "max_tokens": 100})
        end = time.monotonic() + 5
        while _in_flight(base, "vllm:num_requests_running") != 1 and time.monotonic() < end:
            time.sleep(0.05)
        assert _in_flight(base, "vllm:num_requests_running") == 1
        start = time.monotonic()
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=20)[0]
        assert 1.0 <= time.monotonic() - start < 8
        slow.thread.join(10)
        assert slow.result[0] == "error" and slow.result[2] < 9, slow.result
        assert "Shutdown timeout reached; aborting 1 request(s)" in out, out
    finally:
        p.kill()
        p.wait()
