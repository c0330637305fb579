"""GPU health before any start (issue 30 item 6), on a lab node with the stand-in driver.

gpu_holders reads each fault `fakegpu fault` sets (and an Xid line `fakegpu xid` writes to the
node's kernel log stand-in, /var/log/fakegpu/kernel.log: a lab node cannot write the real
kernel ring buffer) and names it with NVIDIA's lever; the inference_service role refuses a start
on such a GPU before it stops anything: the running server keeps its PID and its unit, and a
server not yet installed is never started.
"""

import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from .conftest import VENV_BIN, ansible_env

FQCN = "gpuops.reclaim.gpu_holders"
XID_LOG = "/var/log/fakegpu/kernel.log"


def health_of(lab, node, gpus=("0", "1"), **args):
    result = lab.module(node, FQCN, dict({"gpus": list(gpus), "health": True, "xid_log": XID_LOG,
                                          "handles": False}, **args))
    assert not result.get("failed"), result.get("msg", result)
    return {g["index"]: g["health"] for g in result["gpus"]}


def test_a_healthy_node_reads_healthy_and_cheaply(lab, node):
    health = health_of(lab, node, gpus=[str(i) for i in range(lab.gpus)])
    assert [h["code"] for h in health.values()] == ["healthy"] * lab.gpus
    facts = health[0]["facts"]
    assert facts["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": 0, "failed": 0}
    assert facts["ecc_volatile_uncorrected"] == 0 and facts["recovery_action"] == 0
    assert facts["retired_pages_pending"] is None and facts["unsupported"] == ["retired_pages_pending"]
    nvml_ms = sum(ms for h in health.values() for read, ms in h["facts"]["took_ms"].items() if read != "xid")
    print("health read of %d stand-in GPUs: NVML %.1f ms, Xid log %.1f ms"
          % (lab.gpus, nvml_ms, facts["took_ms"]["xid"]))


@pytest.mark.parametrize("fault, code, lever, words", [
    ("lost", "lost", "reboot", 'NVML answers "GPU is lost"'),
    ("row-remap-pending", "row_remap_pending", "reset", "a row remapping is pending"),
    ("row-remap-failed", "row_remap_failed", "service", "a row remapping failed"),
    ("ecc 3", "ecc_uncorrected", "reset", "3 volatile uncorrectable ECC errors"),
    ("retired-pending", "retired_pages_pending", "reset", "retired pages are pending"),
    ("recovery-action 2", "recovery_action", "reboot", "recovery action field reads 2 (node reboot)"),
    ("recovery-action 4", "recovery_action", "drain_reset", "recovery action field reads 4 (drain and reset)"),
])
def test_gpu_holders_names_each_fault_on_its_gpu_with_nvidias_lever(lab, node, fault, code, lever, words):
    lab.exec(node, "fakegpu fault --gpu 1 %s" % fault)
    health = health_of(lab, node)
    assert health[0]["code"] == "healthy"
    assert (health[1]["code"], health[1]["lever"]) == (code, lever), health[1]
    assert health[1]["message"].startswith("GPU 1 is unhealthy: ") and words in health[1]["message"]


def test_a_critical_xid_counts_from_xid_since_and_lands_on_its_gpu(lab, node):
    now = time.time()
    lab.exec(node, "fakegpu xid --gpu 1 79 --at %f && fakegpu xid --gpu 0 13 --at %f" % (now - 600, now))
    health = health_of(lab, node)
    assert (health[1]["code"], health[1]["lever"], health[1]["facts"]["critical_xids"]) == ("critical_xid", "reboot", [79])
    assert health[0]["code"] == "healthy" and [x["xid"] for x in health[0]["facts"]["xids"]] == [13]
    # The Xid 79 is older than the last good start: it no longer counts.
    health = health_of(lab, node, xid_since=now - 60)
    assert health[1]["code"] == "healthy" and health[1]["facts"]["xids"] == []


def test_a_hung_health_read_is_named_within_its_bound(lab, node):
    lab.exec(node, "fakegpu fault --gpu 0 hang-health 120")
    started = time.monotonic()
    health = health_of(lab, node, nvml_timeout=2)
    took = time.monotonic() - started
    assert health[0]["code"] == "unread" and health[0]["facts"]["unread"]["remapped_rows"]["code"] == "hung"
    assert "nvml_timeout=2.0s" in health[0]["message"]
    assert health[1]["code"] == "unread"       # not read: the driver hung on GPU 0
    assert took < 30, took


def test_an_xid_log_a_user_may_write_is_not_read(lab, node):
    lab.exec(node, "fakegpu xid --gpu 1 79 && chmod 666 %s" % XID_LOG)
    health = health_of(lab, node)
    assert health[1]["code"] == "unread" and "only root" in health[1]["facts"]["unread"]["xid"]["text"]


# ---- the role --------------------------------------------------------------------------------

SERVER = {"inference_service_name": "sglang", "inference_service_command": ["/usr/local/bin/fakeserve"],
          "inference_service_gpus": ["0", "1"], "inference_service_host": "{{ ansible_host }}",
          "inference_service_port": 30000, "inference_service_env": {"FAKESERVE_LOAD_SECONDS": "1"},
          "inference_service_stop_timeout": 15, "inference_service_health_timeout": 60,
          "inference_service_health_delay": 1, "inference_service_gpu_health_xid_log": XID_LOG,
          "inference_service_flags": {"model_path": "/models/m", "tp_size": 2, "mem_fraction_static": 0.8},
          "gpus_free_term_timeout": 2}
SERVER_RESET = ("systemctl stop sglang 2>/dev/null; rm -f /etc/systemd/system/sglang.service /etc/gpuops/*; "
                "systemctl daemon-reload; true")


@pytest.fixture
def play(lab, node):
    lab.exec(node, SERVER_RESET)
    tmp = tempfile.mkdtemp(prefix="gpu-health-")
    shutil.copy(lab.inventory, os.path.join(tmp, "inventory.ini"))

    def run(**overrides):
        with open(os.path.join(tmp, "play.json"), "w") as f:
            json.dump([{"hosts": node, "gather_facts": False, "roles": [
                {"role": "gpuops.reclaim.inference_service", "vars": dict(SERVER, **overrides)}]}], f)
        return subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", os.path.join(tmp, "inventory.ini"),
                               os.path.join(tmp, "play.json")], env=ansible_env(), capture_output=True, text=True,
                              timeout=600, check=False)
    yield run
    lab.exec(node, SERVER_RESET)
    shutil.rmtree(tmp, ignore_errors=True)


def server_state(lab, node):
    out = lab.exec(node, "systemctl show -p MainPID -p ActiveState -p NRestarts sglang; "
                         "cat /etc/systemd/system/sglang.service 2>/dev/null | md5sum").stdout
    return out


def test_the_role_refuses_a_start_on_an_unhealthy_gpu_and_leaves_the_server_as_it_was(lab, node, play):
    first = play()
    assert first.returncode == 0, first.stdout + first.stderr
    started = float(lab.exec(node, "stat -c %Y /etc/gpuops/sglang.last-good.started").stdout)
    before = server_state(lab, node)
    assert "ActiveState=active" in before and "MainPID=0" not in before

    # New flags would restart it; GPU 1 has a pending row remap and 2 uncorrectable errors,
    # and the server holds it.
    lab.exec(node, "fakegpu fault --gpu 1 row-remap-pending && fakegpu fault --gpu 1 ecc 2")
    changed = dict(SERVER["inference_service_flags"], mem_fraction_static=0.7)
    refused = play(inference_service_flags=changed)
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0, out
    assert "sglang is not started on %s: GPU 1 is unhealthy: a row remapping is pending" % node in out, out
    assert "2 volatile uncorrectable ECC errors" in out and "reset the GPU once nothing holds it (held by PID" in out
    assert "`nvidia-smi --gpu-reset -i 1`" in out and "Nothing was stopped or started." in out
    assert "GPU 0 is unhealthy" not in out
    assert server_state(lab, node) == before          # same PID, same unit text, no restart

    # The fault cleared, an Xid older than the last good start no longer refuses, one after it does.
    lab.exec(node, "fakegpu fault --clear && fakegpu xid --gpu 0 79 --at %f && fakegpu xid --gpu 0 48" % (started - 5))
    refused = play(inference_service_flags=changed)
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "GPU 0 is unhealthy: critical Xid 48" in out, out
    assert "NVIDIA prescribes: reset the GPU" in out and "Xids count since the last good start" in out
    assert server_state(lab, node) == before
    # After the reset, the operator lets older Xids go: the restart goes ahead.
    ok = play(inference_service_flags=changed, inference_service_gpu_health_xid_since=time.time())
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert server_state(lab, node) != before


def test_a_lost_gpu_refuses_the_first_start_and_nothing_is_installed(lab, node, play):
    lab.exec(node, "fakegpu fault --gpu 0 lost")
    refused = play()
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0, out
    assert 'GPU 0 is unhealthy: NVML answers "GPU is lost" (it fell off the bus). NVIDIA prescribes: reboot the node.' in out
    assert lab.exec(node, "test -e /etc/systemd/system/sglang.service", check=False).returncode != 0
    assert "ActiveState=inactive" in server_state(lab, node)


def test_a_rollback_reads_the_gpus_health_first_and_refuses_on_a_gpu_the_failed_start_left_unhealthy(lab, node, play):
    first = play()
    assert first.returncode == 0, first.stdout + first.stderr
    # The new flags' start dies of a fatal GPU error: the driver logs a critical Xid 48 for GPU 0
    # (the stand-in's crash-xid fault) after preflight read every GPU healthy.
    changed = dict(SERVER["inference_service_flags"], mem_fraction_static=0.7)
    env = dict(SERVER["inference_service_env"], FAKESERVE_FAULT="crash-xid")
    refused = play(inference_service_flags=changed, inference_service_env=env)
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0, out
    assert "sglang is not rolled back on %s: GPU 0 is unhealthy: critical Xid 48" % node in out, out
    assert "the last good unit was not started: nothing runs on them" in out, out
    assert "GPU 1 is unhealthy" not in out
    # Nothing was started on the GPUs: the unit is down and neither GPU is held.
    assert "ActiveState=active" not in server_state(lab, node)
    held = lab.module(node, FQCN, {"gpus": ["0", "1"]})
    assert held["holders"] == [], held["holders"]
