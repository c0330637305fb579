"""roles/inference_service/files/wait_healthy.py's reading of a container (pure part): what counts
as the engine crashed or restarted. The wait itself runs against real docker and podman in
tests/integration/test_container_health.py."""

import importlib.util
import os

FILES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "inference_service", "files")


def load():
    spec = importlib.util.spec_from_file_location("wait_healthy", os.path.join(FILES, "wait_healthy.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wh = load()


def state(status="running", restarts=0, exit_code="0"):
    return {"status": status, "restarts": restarts, "pid": 10, "exit_code": exit_code}


def test_nothing_is_concluded_before_the_runtime_knows_the_container():
    assert wh.container_gone("s", None, None) is None
    assert wh.container_gone("s", None, state("exited", exit_code="3")) is None


def test_a_running_container_that_did_not_restart_is_no_crash():
    assert wh.container_gone("s", state(restarts=2), state(restarts=2)) is None


def test_a_restart_by_the_runtime_ends_the_wait():
    assert "RestartCount 0 -> 1" in wh.container_gone("s", state(), state(restarts=1))
    # docker shows a container between two runs of its restart policy as restarting.
    assert wh.container_gone("s", state(), state("restarting")) is not None


def test_an_exit_or_a_removal_ends_the_wait():
    assert "exited with exit code 3" in wh.container_gone("s", state(), state("exited", exit_code="3"))
    assert "is gone" in wh.container_gone("s", state(), None)


# The observation and the completion against the stand-in server run as a real process on this
# host (no GPU backend, no unit): what a probe window and a hung completion do, in seconds.
import json as _json
import signal
import socket
import subprocess
import sys
import time

import pytest

FAKESERVE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fakeserve", "fakeserve")
SCRIPT = os.path.join(FILES, "wait_healthy.py")


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(request):
    port = _port()
    proc = subprocess.Popen([sys.executable, FAKESERVE, "--model-path", "m", "--port", str(port), "--fake-backend",
                             "none", "--fake-gpu-total-mib", "1000", "--fake-load-seconds", "0.2",
                             "--fake-fault", getattr(request, "param", "none")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = "http://127.0.0.1:%d" % port
    deadline = time.monotonic() + 30
    while wh.health(url + "/health", 1) != 200:
        assert time.monotonic() < deadline and proc.poll() is None, "the stand-in did not come up"
        time.sleep(0.05)
    yield proc, url
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run(request):
    out = subprocess.run([sys.executable, SCRIPT, _json.dumps(request)], capture_output=True, text=True, timeout=60,
                         check=True)
    return _json.loads(out.stdout)


GEN = {"body": {"text": "Hello", "sampling_params": {"max_new_tokens": 1}}, "timeout": 2}


def test_a_server_paused_within_the_probe_window_is_seen_healthy(server):
    proc, url = server
    proc.send_signal(signal.SIGSTOP)
    try:
        subprocess.Popen([sys.executable, "-c", "import os, time; time.sleep(2.5); os.kill(%d, 18)" % proc.pid])
        got = run({"mode": "observe", "url": url + "/health", "probe": {"period": 1, "failures": 5, "timeout": 1},
                   "generate": dict(GEN, url=url + "/generate")})
    finally:
        proc.send_signal(signal.SIGCONT)
    assert got["probe"]["healthy"] and got["probe"]["statuses"][0] == -1, got
    assert got["generate"]["ok"] and got["generate"]["ttft_s"] < 2, got


def test_a_pause_longer_than_the_window_is_seen_unhealthy(server):
    proc, url = server
    proc.send_signal(signal.SIGSTOP)
    try:
        got = run({"mode": "observe", "url": url + "/health", "probe": {"period": 0.5, "failures": 3, "timeout": 0.5}})
    finally:
        proc.send_signal(signal.SIGCONT)
    assert not got["probe"]["healthy"] and got["probe"]["statuses"] == [-1, -1, -1], got


@pytest.mark.parametrize("server", ["generate-hang"], indirect=True)
def test_health_200_with_a_hung_completion_is_no_start(server):
    url = server[1]
    got = run({"url": url + "/health", "timeout": 10, "delay": 0.5, "generate": dict(GEN, url=url + "/generate")})
    assert not got["healthy"] and got["cause"] == "generate" and got["status"] == 200, got
    assert got["generate"]["hung"] and "no answer within 2 s" in got["reason"], got


def test_a_start_is_ready_once_it_generated_with_its_time_to_first_token(server):
    url = server[1]
    got = run({"url": url + "/health", "timeout": 10, "delay": 0.5, "generate": dict(GEN, url=url + "/generate")})
    assert got["healthy"] and got["generate"]["ok"] and got["ttft_s"] is not None and got["ready_mono"], got


def test_log_stamps_of_both_runtimes_are_read():
    epoch, line = wh._stamped("2026-12-07T02:30:00.123456789Z Capture cuda graph begin.")
    assert line == "Capture cuda graph begin." and abs(epoch - 1796610600.123456) < 1e-3
    epoch2 = wh._stamped("2026-12-07T03:30:00.5+01:00 x")[0]
    assert abs(epoch2 - 1796610600.5) < 1e-3
    assert wh._stamped("no stamp here") is None


def test_a_port_where_something_not_http_answers_reads_as_no_health():
    """The port taken by sshd (Molecule fresh_deploy's 'port taken'): its banner is no HTTP status
    line. The probe reads it as no health, as a closed port, so the role's preflight can name the
    listener; the observation once died on it with a traceback (http.client.BadStatusLine)."""
    import socket  # pylint: disable=import-outside-toplevel
    import threading  # pylint: disable=import-outside-toplevel
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def banner():
        for _attempt in range(2):
            conn, _addr = listener.accept()
            conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n")
            conn.close()
    server = threading.Thread(target=banner, daemon=True)
    server.start()
    port = listener.getsockname()[1]
    try:
        wait = load()
        assert wait.health("http://127.0.0.1:%d/health" % port, 5) == -1
        answer = wait.generate({"url": "http://127.0.0.1:%d/generate" % port, "timeout": 5, "body": {}})
        assert answer["ok"] is False and answer["hung"] is False, answer
    finally:
        server.join(10)
        listener.close()
