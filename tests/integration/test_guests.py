"""The modules run on a host around a guest: the controller around a lab node.

A lab node is a real guest of the controller (systemd-nspawn with its own systemd, PID
namespace and cgroup tree), as an LXC guest is of its Proxmox host. The module runs on the
controller (Ansible's local connection) and sees the node's processes from outside. The one
thing the controller lacks is the GPUs: the stand-in driver's state and device files live in
the node, so the controller's NVML reads them through the node's root
(FAKEGPU_ROOT=/proc/<node's PID 1>/root), as a host's driver is the guest's driver. Like the
real driver seen from a parent namespace, it then counts the node's contexts as used memory;
unlike it, it lists no PID for them, so the holders are found by their mappings.
"""

import json
import os
import subprocess
import tempfile

import pytest

from . import scenarios as sc
from .conftest import REPO, VENV_BIN, ansible_env

FAST = {"term_timeout": 1.5, "release_timeout": 3, "nvml_timeout": 5}
# Services of the node's own systemd; named so that scenarios.cleanup() ends them.
NAMED_UNIT = sc.SCOPE_PREFIX + "guest-named"
RESPAWN_UNIT = sc.SCOPE_PREFIX + "guest-respawn"


def record_of(node):
    run_dir = os.environ.get("LAB_RUN", "/run/gpuops-lab")
    with open(os.path.join(run_dir, "nodes", "%s.json" % node)) as f:
        return json.load(f)


def on_the_host(node, fqcn, args):
    """Run one module on the controller, around `node`; return its result (failures too)."""
    leader = record_of(node)["leader_pid"]
    with tempfile.TemporaryDirectory(prefix="lab-host-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        play = [{
            "hosts": "localhost", "gather_facts": False, "connection": "local",
            "vars": {"ansible_python_interpreter": os.path.join(VENV_BIN, "python")},
            "environment": {"LD_LIBRARY_PATH": os.path.join(REPO, "tests", "fakegpu", "build"),
                            "FAKEGPU_ROOT": "/proc/%d/root" % leader},
            "tasks": [
                {"name": "module under test", fqcn: args, "register": "host_result", "ignore_errors": True},
                {"ansible.builtin.copy": {"content": "{{ host_result | to_json }}", "dest": result_path}},
            ],
        }]
        playbook = os.path.join(tmp, "play.json")
        with open(playbook, "w") as f:
            json.dump(play, f)
        run = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", "localhost,", playbook],
                             env=ansible_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=300, check=False)
        if not os.path.exists(result_path):
            raise AssertionError("no result from %s on the controller (rc %d):\n%s\n%s"
                                 % (fqcn, run.returncode, run.stdout, run.stderr))
        with open(result_path) as f:
            return json.load(f)


def host_pid(node, node_pid):
    """The controller's PID of a node process (NSpid's first field)."""
    ns = record_of(node)["pid_ns"]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink("/proc/%s/ns/pid" % entry) != ns:
                continue
            with open("/proc/%s/status" % entry) as f:
                nspid = [line.split()[1:] for line in f if line.startswith("NSpid:")][0]
        except (OSError, IndexError):
            continue
        if int(nspid[-1]) == node_pid:
            return int(entry)
    raise AssertionError("node %s PID %d not found from the controller" % (node, node_pid))


@pytest.fixture
def guest(lab, node):
    if os.geteuid() != 0:
        pytest.skip("reading a node's processes from the controller needs root")
    return node


def test_guest_processes_are_named_with_their_guest_and_its_init_protected(lab, guest):
    rec = sc.start_unit(lab, guest, "--gpu", "6:700", restart="always", unit=NAMED_UNIT)
    outer = host_pid(guest, rec["pid"])

    result = on_the_host(guest, "gpuops.reclaim.gpu_holders", {"gpus": ["6"], "nvml_timeout": 5})

    assert not result.get("failed"), result.get("msg", result)
    holder = [h for h in result["holders"] if h["pid"] == outer][0]
    owner = holder["owner"]
    assert (owner["kind"], owner["runtime"]) == ("guest", "systemd-nspawn")
    assert owner["guest_unit"] == "%s.service" % NAMED_UNIT
    assert holder["unit"] is None, "a guest's unit is never this host's unit"
    assert holder["other_pid_namespace"] is True and not holder["protected"]
    said = [d for d in result["diagnosis"] if "PID %d" % outer in d]
    assert said and "systemd-nspawn guest" in said[0] and "%s.service inside it" % NAMED_UNIT in said[0]
    # The node's own init, seen from the host: PID 1 of its namespace, protected.
    leader = record_of(guest)["leader_pid"]
    init = on_the_host(guest, "gpuops.reclaim.gpu_holders", {"nvml_timeout": 5})
    assert all(h["pid"] != leader or h["protected"] for h in init["holders"] + init["clients"])


def test_a_guests_systemd_restarting_what_the_host_killed_is_detected_and_explained(lab, guest):
    rec = sc.start_unit(lab, guest, "--gpu", "6:700", restart="always", unit=RESPAWN_UNIT)
    outer = host_pid(guest, rec["pid"])

    result = on_the_host(guest, "gpuops.reclaim.gpu_reclaim", dict(FAST, gpus=["6"]))

    assert result.get("failed") is True, result
    # The host killed the holder once; the guest's systemd started it again; the rescan saw
    # it, and the ladder does not fight the guest's service manager.
    killed = [a for a in result["actions"] if a.get("pid") == outer and a["changed"]]
    assert killed, result["actions"]
    watch = [a for a in result["actions"] if a["step"] == "watch_respawn"]
    assert watch and watch[0]["code"] == "guest_back", result["actions"]
    assert "%s.service inside it" % RESPAWN_UNIT in result["msg"]
    assert "systemctl" in result["msg"] and "stop %s.service" % RESPAWN_UNIT in result["msg"], result["msg"]
    assert not stopped_on_the_host(result), "the host never stops a guest's unit"
    # The unit in the guest restarted it: a new holder, alive.
    assert sc.unit_state(lab, guest, unit=RESPAWN_UNIT) == "active"


def stopped_on_the_host(result):
    return [a for a in result["actions"] if a["step"] == "stop_unit"]
