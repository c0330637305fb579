"""inference_service knows a podman server by facts (issue 30, items 1 and 3), on a container node
(LAB_CONTAINERS=1, test_containers.py's lab) running the role's own podman unit (`podman run
--cgroups=split`, conmon its main process) with the stand-in engine image (lab-serve-image):

- a server restarted by hand and still loading when the play judges it is left alone and comes up;
- one hung after loading past its health timeout is restarted, the reason naming its age and its
  last line in the container's log (podman logs), and comes up;
- one whose rank on GPU 1 died while its front end answers /health 200 is restarted, naming GPU 1;
- one restarted for a flag change finishes its request in flight first (issue 30 item 7): the unit's
  `podman stop --time` covers the drain, and the summary names the request and the drain's time.

The one-shot fault file (tests/fakeserve, FAKESERVE_FAULT_FILE) sits in a directory bind-mounted
into the container, so the unit never changes.
"""

import time

import pytest

from . import scenarios as sc
from .test_reclaim_playbook import GOOD_SERVER, playbook_dir, run_playbook, write_host_vars
from .test_server_drain import Client, play_sending_requests_at_restart
from .test_server_state import WAITS_FOR_LOAD, end_load, healthy

FAULT_DIR = "/run/fakeserve-fault"
FAULT = FAULT_DIR + "/fault"
LOADED = FAULT_DIR + "/loaded"     # test_server_state.LOADED's file, seen in the container too
IMAGE = "localhost/gpuops-lab/sglang:1"
RESET = ("systemctl stop sglang 2>/dev/null; rm -f /etc/systemd/system/sglang.service /etc/gpuops/*; "
         "systemctl daemon-reload; podman rm -f -a -t 0 >/dev/null 2>&1; rm -rf %s; true" % FAULT_DIR)


def server_vars(**over):
    env = {"FAKESERVE_LOAD_SECONDS": "1", "FAKESERVE_FAULT_FILE": FAULT}
    env.update(over.pop("env", {}))
    flags = over.pop("inference_service_flags", dict(GOOD_SERVER["inference_service_flags"], tp_size=2))
    return dict(GOOD_SERVER, inference_service_runtime="podman", inference_service_image=IMAGE,
                inference_service_command=[], inference_service_gpus=["0", "1"],
                inference_service_flags=flags,
                inference_service_container_mounts=["%s:%s" % (FAULT_DIR, FAULT_DIR)],
                inference_service_env=env, **over)


@pytest.fixture
def pnode(lab, clean_gpus):
    name = lab.nodes[-1]
    if "podman" not in lab.status().get(name, {}).get("tools", []):
        pytest.skip("the lab nodes have no podman: run with LAB_CONTAINERS=1 after `tests/lab/lab down` "
                    "(tests/lab/README.md, 'Container nodes'; make lab-test runs it)")
    sc.cleanup(lab, name)
    lab.exec(name, RESET, timeout=120)
    # lab-serve-image keeps an image it made before: one holding an older stand-in is made again.
    lab.exec(name, "! podman image exists {0} || podman run --rm --network host {0} cat /opt/gpuops-lab/fakeserve/fakeserve "
                   "| cmp -s - /opt/gpuops-lab/fakeserve/fakeserve || podman rmi -f {0} >/dev/null; true".format(IMAGE),
             timeout=120)
    lab.exec(name, "lab-serve-image podman 1 >/dev/null && lab-cdi-spec >/dev/null && mkdir -p %s" % FAULT_DIR,
             timeout=300)
    yield name
    lab.exec(name, RESET, timeout=120)
    sc.cleanup(lab, name)


def converge(lab, name, host_vars):
    tmp = playbook_dir(lab, {name: host_vars})
    run = run_playbook(tmp, [name])[0]
    assert run.returncode == 0, run.stdout + run.stderr
    return tmp


def container_id(lab, name):
    return lab.exec(name, "podman inspect --format '{{.Id}}' sglang").stdout.strip()


def restart_by_hand(lab, name, fault=None):
    if fault:
        lab.exec(name, "echo %s > %s" % (fault, FAULT))
    lab.exec(name, "systemctl restart sglang", timeout=120)
    sc.wait_until(lab, name, "podman container exists sglang", "the unit's new container", timeout=60)
    return container_id(lab, name), time.monotonic()


def test_a_podman_server_restarted_by_hand_and_still_loading_is_left_alone_and_comes_up(lab, pnode):
    tmp = converge(lab, pnode, server_vars(inference_service_health_timeout=240))
    cid, started = restart_by_hand(lab, pnode, "load-until " + LOADED)
    run, summary = run_playbook(tmp, [pnode], at=[(WAITS_FOR_LOAD, lambda: end_load(lab, pnode, LOADED, started))])
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    server = summary["hosts"][pnode]["server"]
    assert server["restart_reasons"] == [], server
    assert container_id(lab, pnode) == cid, "the loading container was replaced"
    assert (server["state"]["state"], server["state"]["code"]) == ("serving", "loaded"), server["state"]
    assert "is loading: loading for" in out and "Loading safetensors checkpoint shards" in out, out


def test_a_podman_server_hung_past_its_health_timeout_is_restarted_naming_its_last_log_line(lab, pnode):
    tmp = converge(lab, pnode, server_vars(inference_service_health_timeout=20))
    cid, started = restart_by_hand(lab, pnode, "hang-after-load")
    sc.wait_until(lab, pnode, "podman logs sglang 2>&1 | grep -q 'Capture cuda graph begin'",
                  "the stand-in stuck in CUDA graph capture", timeout=60)
    time.sleep(max(0.0, 21 - (time.monotonic() - started)))
    run, summary = run_playbook(tmp, [pnode])
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    server = summary["hosts"][pnode]["server"]
    [reason] = server["restart_reasons"]
    assert reason.startswith("no /health 200 in ") and "since its start; last log line" in reason, reason
    assert reason.endswith("Capture cuda graph begin. This can take up to several minutes."), reason
    assert container_id(lab, pnode) != cid and healthy(lab, pnode)
    assert (server["state"]["state"], server["state"]["code"]) == ("serving", "restarted"), server["state"]


def test_a_podman_server_with_a_dead_rank_is_restarted_naming_the_gpu(lab, pnode):
    tmp = converge(lab, pnode, server_vars())
    cid, _started = restart_by_hand(lab, pnode, "rank-dies")
    sc.wait_until(lab, pnode, "podman logs sglang 2>&1 | grep -q 'TP1 on GPU 1 died'",
                  "the stand-in's rank on GPU 1 dead", timeout=60)
    assert healthy(lab, pnode), "the front end must still answer /health 200"
    run, summary = run_playbook(tmp, [pnode])
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    server = summary["hosts"][pnode]["server"]
    assert server["restart_reasons"] == [
        "/health answers 200 but no process of the unit holds GPU 1: a rank died"], server
    assert container_id(lab, pnode) != cid and healthy(lab, pnode)


def test_a_podman_server_restarted_for_new_flags_drains_its_request_in_flight_first(lab, pnode):
    flags = dict(GOOD_SERVER["inference_service_flags"], tp_size=2, enable_metrics=True)
    drain_vars = dict(inference_service_stop_timeout=40, inference_service_drain_timeout=30,
                      env={"FAKESERVE_TOKEN_SECONDS": "0.1"})
    tmp = converge(lab, pnode, server_vars(inference_service_flags=flags, **dict(drain_vars)))
    cid = container_id(lab, pnode)
    write_host_vars(tmp, pnode, server_vars(inference_service_flags=dict(flags, mem_fraction_static=0.7),
                                            **dict(drain_vars)))
    url = "http://%s:%d/generate" % (lab.status()[pnode]["ip"], GOOD_SERVER["inference_service_port"])

    def clients():
        return [Client(url, {"text": "hello", "sampling_params": {"max_new_tokens": 150}})]

    rc, out, server, [client] = play_sending_requests_at_restart(lab, pnode, tmp, clients)
    assert rc == 0, out
    status, answer, _took = client.result
    assert status == 200 and answer["meta_info"]["completion_tokens"] == 150, (client.result, out)
    drain = server["state"]["drain"]
    assert drain["in_flight"] == 1 and 1.0 < drain["seconds"] < 30 and drain["killed"] is False, drain
    assert container_id(lab, pnode) != cid and healthy(lab, pnode)
