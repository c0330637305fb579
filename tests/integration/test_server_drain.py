"""Drain before a planned stop (issue 30 item 7), on a lab node with the real systemd unit and the stand-in
server (tests/fakeserve), through playbooks/reclaim.yml:

- a server restarted for a flag change finishes the requests in flight first: each client gets its whole
  answer, not a reset; the run's summary names how many were in flight and how long the drain and stop took;
- vLLM's drain is its own --shutdown-timeout, set from inference_service_drain_timeout: a request longer than
  it is aborted by the engine and the stop ends soon after;
- a drain timeout longer than the stop timeout is refused in preflight, naming both, the server untouched.

The stand-in's completions take --fake-token-seconds a token (FAKESERVE_TOKEN_SECONDS), so a request of N
tokens is in flight for N x that; it counts them on /metrics in each engine's own gauge names.
"""

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from . import scenarios as sc
from .test_reclaim_playbook import GOOD_SERVER, SERVER_RESET, playbook_dir, run_playbook, write_host_vars
from .test_server_state import main_pid

TOKEN_S = 0.1
VLLM_LINK = "/usr/local/bin/vllm"


@pytest.fixture
def node(lab, clean_gpus):
    name = lab.nodes[0]
    sc.cleanup(lab, name)
    lab.exec(name, SERVER_RESET)
    yield name
    lab.exec(name, SERVER_RESET + "; rm -f " + VLLM_LINK)
    sc.cleanup(lab, name)


def sglang_vars(**flags):
    return dict(GOOD_SERVER, inference_service_stop_timeout=40, inference_service_drain_timeout=30,
                inference_service_env=dict(GOOD_SERVER["inference_service_env"], FAKESERVE_TOKEN_SECONDS=str(TOKEN_S)),
                # SGLang exports its gauges only with --enable-metrics.
                inference_service_flags=dict(GOOD_SERVER["inference_service_flags"], enable_metrics=True, **flags))


def vllm_vars(drain, **flags):
    return dict(GOOD_SERVER, inference_service_engine="vllm", inference_service_command=[VLLM_LINK, "serve"],
                inference_service_stop_timeout=15, inference_service_drain_timeout=drain,
                inference_service_env=dict(GOOD_SERVER["inference_service_env"], FAKESERVE_TOKEN_SECONDS=str(TOKEN_S)),
                inference_service_flags=dict({"model": "/models/m", "tensor_parallel_size": 1,
                                              "gpu_memory_utilization": 0.8}, **flags))


class Client(threading.Thread):
    """One completion of `tokens` tokens from the controller, as a user of the server sends it."""

    def __init__(self, url, body):
        super().__init__(daemon=True)
        self.url, self.body, self.result = url, body, None

    def run(self):
        start = time.monotonic()
        try:
            request = urllib.request.Request(self.url, data=json.dumps(self.body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as answer:
                self.result = (answer.status, json.loads(answer.read()), time.monotonic() - start)
        except (OSError, ValueError, urllib.error.HTTPError) as exc:
            self.result = ("error", repr(exc), time.monotonic() - start)


def play_sending_requests_at_restart(lab, node, tmp, make_clients):
    """Run the play; at preflight's last tasks (a second or two before the stop, whatever the runtime's
    preflight takes), start the clients. Returns (returncode, output, the summary's server, clients)."""
    clients = []

    def send():
        clients.extend(make_clients())
        for client in clients:
            client.start()

    run, summary = run_playbook(tmp, [node], at=[
        ("inference_service : Say which hand-started container would be stopped", send)])
    for client in clients:
        client.join(120)
    return run.returncode, run.stdout + run.stderr, summary["hosts"][node]["server"], clients


def test_a_flag_change_lets_the_requests_in_flight_finish_and_reports_the_drain(lab, node):
    tmp = playbook_dir(lab, {node: sglang_vars()})
    run, _summary = run_playbook(tmp, [node])
    assert run.returncode == 0, run.stdout + run.stderr
    old = main_pid(lab, node)
    write_host_vars(tmp, node, sglang_vars(mem_fraction_static=0.7))
    url = "http://%s:%d/generate" % (lab.status()[node]["ip"], GOOD_SERVER["inference_service_port"])
    tokens = 150  # 15 s each: in flight when the stop begins, a second or two later

    def clients():
        return [Client(url, {"text": "hello %d" % i, "sampling_params": {"max_new_tokens": tokens}}) for i in range(2)]

    rc, out, server, sent = play_sending_requests_at_restart(lab, node, tmp, clients)
    assert rc == 0, out
    for client in sent:
        status, answer, _took = client.result
        assert status == 200 and answer["meta_info"]["completion_tokens"] == tokens, (client.result, out)
    assert server["restart_reasons"] == ["flags or unit changed"], server
    state = server["state"]
    assert (state["state"], state["code"]) == ("serving", "restarted"), state
    drain = state["drain"]
    # Both requests were in flight when the stop began; the stop waited for them (each needs 15 s from its
    # start, the play reaches the stop a few seconds in) and ended well inside the drain timeout.
    assert drain["in_flight"] == 2 and drain["in_flight_error"] is None, drain
    assert 1.0 < drain["seconds"] < 30 and drain["timeout"] == 30 and drain["killed"] is False, drain
    assert "stopped with 2 requests in flight; drained and stopped in %s s" % drain["seconds"] in out, out
    assert main_pid(lab, node) != old
    journal = lab.exec(node, "journalctl -o cat _SYSTEMD_UNIT=sglang.service _PID=%d" % old).stdout
    assert "draining 2 request(s) in flight" in journal and "All requests drained" in journal, journal
    assert "KillMode=mixed" in lab.exec(node, "cat /etc/systemd/system/sglang.service").stdout


def test_vllm_drains_up_to_its_shutdown_timeout_and_a_drain_past_the_stop_timeout_is_refused(lab, node):
    lab.exec(node, "ln -sf /usr/local/bin/fakeserve " + VLLM_LINK)
    tmp = playbook_dir(lab, {node: vllm_vars(3)})
    run, _summary = run_playbook(tmp, [node])
    assert run.returncode == 0, run.stdout + run.stderr
    old = main_pid(lab, node)
    # Bad input: a drain the stop timeout (15 s) would cut. Refused in preflight, the server untouched.
    write_host_vars(tmp, node, vllm_vars(50, gpu_memory_utilization=0.7))
    run, summary = run_playbook(tmp, [node])
    msg = summary["hosts"][node]["failure"]["msg"]
    assert run.returncode == 2 and ("inference_service_drain_timeout=50 is longer than "
                                    "inference_service_stop_timeout=15") in msg, msg
    assert "Nothing was changed" in msg and main_pid(lab, node) == old
    unit = lab.exec(node, "cat /etc/systemd/system/sglang.service").stdout
    assert "--gpu-memory-utilization 0.8" in unit and "--shutdown-timeout 3" in unit, unit
    # A request longer than vLLM's drain (30 s against 3 s): the engine aborts it at its shutdown timeout.
    write_host_vars(tmp, node, vllm_vars(3, gpu_memory_utilization=0.7))
    url = "http://%s:%d/v1/completions" % (lab.status()[node]["ip"], GOOD_SERVER["inference_service_port"])

    def clients():
        return [Client(url, {"model": "/models/m", "prompt": "hello", "max_tokens": 300})]

    rc, out, server, [client] = play_sending_requests_at_restart(lab, node, tmp, clients)
    assert rc == 0, out
    assert client.result[0] == "error" and client.result[2] < 30, client.result
    drain = server["state"]["drain"]
    assert drain["in_flight"] == 1 and 3 <= drain["seconds"] < 10 and drain["killed"] is False, drain
    journal = lab.exec(node, "journalctl -o cat _SYSTEMD_UNIT=sglang.service _PID=%d" % old).stdout
    assert "Shutdown timeout reached; aborting 1 request(s)" in journal, journal
