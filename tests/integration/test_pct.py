"""playbooks/reclaim.yml reaching an LXC guest the way the seeds' operator does: SSH to the
Proxmox host, then `pct exec 129 -- ...` (seed 002: `ssh root@HOST 'pct exec 129 -- bash -c
"fuser -k /dev/nvidia*..."'`), through community.proxmox's proxmox_pct_remote connection.

The Proxmox host is a lab runtime node (LAB_RUNTIMES=1); guest 129 is a real Debian lxc guest
named `129` booted by lxc_guest.py (so its processes sit under /lxc.payload.129 as a Proxmox
guest's sit under /lxc/129), and `pct` is the lab's stand-in (tests/lab/node/lab-pct, linked as
/usr/sbin/pct for this module), which runs `pct exec VMID -- CMD` as `lxc-attach -n VMID -- CMD`
and answers `pct config VMID` with the guest's hostname. The connection plugin is the real one
(community.proxmox 1.4.0 from `make proxmox-collection`) over paramiko; the modules run inside
the guest's PID namespace, as in the seeds.
"""

import json
import os
import re
import shlex
import subprocess
import tempfile

import pytest

from . import lxc_guest as lg
from . import scenarios as sc
from .conftest import REPO, VENV_BIN, ansible_env

VMID = "129"
HOSTNAME = "sglang-ct129"
CT_HOST = "ct129"
UNIT = "sglang-pct.service"
TITLE = "sglang::scheduler_TP5"
PLAYBOOK = os.path.join(REPO, "playbooks", "reclaim.yml")
PROXMOX = os.path.join(REPO, ".build", "collections", "ansible_collections", "community", "proxmox")
FAST = {"term_timeout": 1.5, "release_timeout": 5, "nvml_timeout": 5}


def in_guest(cmd):
    return lg.in_guest(VMID, cmd)


@pytest.fixture(scope="module")
def pct_node(lab):
    """(node): the last lab node as a Proxmox host: the stand-in pct at /usr/sbin/pct and guest
    129 booted, for the whole module."""
    if not os.path.isfile(os.path.join(PROXMOX, "plugins", "connection", "proxmox_pct_remote.py")):
        pytest.skip("community.proxmox is not in .build/collections: run `make proxmox-collection`")
    try:
        import paramiko  # noqa: F401  (the connection plugin's own requirement)
    except ImportError:
        pytest.skip("paramiko is not installed in .venv (requirements-dev.txt pins it): run `make venv`")
    name = lab.nodes[-1]
    lg.require_lxc(lab, name)
    lab.exec(name, "[ ! -e /usr/sbin/pct ] || [ -L /usr/sbin/pct ]; ln -sfn /usr/local/sbin/lab-pct /usr/sbin/pct")
    lg.boot(lab, name, VMID, hostname=HOSTNAME)
    yield name
    lg.remove(lab, name, VMID)
    lab.exec(name, "rm -f /usr/sbin/pct")


@pytest.fixture
def ct(lab, pct_node):
    lg.end_unit(lab, pct_node, VMID, UNIT)
    sc.cleanup(lab, pct_node)
    yield pct_node
    lg.end_unit(lab, pct_node, VMID, UNIT)
    lab.exec(pct_node, in_guest("pkill -KILL -f '^%s' || true" % TITLE))
    sc.cleanup(lab, pct_node)


def pct_inventory(lab, node, directory, vmid=VMID):
    """The seeds' layout as an inventory: the guest as the host, reached through its Proxmox
    host (the lab node) with `pct exec VMID`."""
    with open(lab.inventory) as f:
        text = f.read()
    address = re.search(r"^%s ansible_host=(\S+)" % node, text, re.M).group(1)
    key = re.search(r"^ansible_ssh_private_key_file=(\S+)", text, re.M).group(1)
    path = os.path.join(directory, "inventory.ini")
    with open(path, "w") as f:
        f.write("[gpu_nodes]\n%s ansible_host=%s proxmox_vmid=%s\n\n"
                "[gpu_nodes:vars]\n"
                "ansible_connection=community.proxmox.proxmox_pct_remote\n"
                "ansible_user=root\n"
                "ansible_ssh_private_key_file=%s\n"
                "ansible_python_interpreter=/usr/bin/python3\n" % (CT_HOST, address, vmid, key))
    return path


def start_wedged_holder(lab, node, gpu, mib):
    """The seeds' wedged rank inside the guest: started by hand, orphaned to the guest's init,
    re-titled, ignoring SIGTERM. Its (node PID, guest PID)."""
    lab.exec(node, in_guest("setsid -f /opt/gpuops-lab/fakegpu/fakegpu hold --gpu %d:%d --ignore-term --title %s")
             % (gpu, mib, TITLE) + " </dev/null >/dev/null 2>&1")
    sc.wait_until(lab, node, "[ \"$(%s)\" = %d ]" % (used_mib_command(gpu), mib),
                  "the wedged holder holding %d MiB on GPU %d" % (mib, gpu))
    node_pids = lab.exec(node, "pgrep -f '^%s' || true" % TITLE).stdout.split()
    guest_pids = lab.exec(node, in_guest("pgrep -f '^%s'" % TITLE), check=False).stdout.split()
    assert len(node_pids) == 1 and len(guest_pids) == 1, (node_pids, guest_pids)
    return int(node_pids[0]), int(guest_pids[0])


def used_mib_command(gpu):
    return ("fakegpu status | python3 -c 'import json,sys; "
            "print([g for g in json.load(sys.stdin)[\"gpus\"] if g[\"index\"] == %d][0][\"memory_used_mib\"])'" % gpu)


def test_the_playbook_frees_a_wedged_holder_in_guest_129_through_pct_exec(lab, ct):
    node_pid, guest_pid = start_wedged_holder(lab, ct, 5, 4000)

    # From the host side, the holder is named with its guest (VMID and hostname from `pct config`).
    seen = lab.module(ct, "gpuops.reclaim.gpu_holders", {"gpus": ["5"]})
    owner = [h for h in seen["holders"] if h["pid"] == node_pid][0]["owner"]
    assert (owner["kind"], owner["runtime"], owner["id"], owner["name"]) == ("guest", "proxmox", VMID, HOSTNAME), owner

    with tempfile.TemporaryDirectory(prefix="reclaim-pct-") as tmp:
        summary_file = os.path.join(tmp, "summary.json")
        run = subprocess.run(
            [os.path.join(VENV_BIN, "ansible-playbook"), PLAYBOOK, "-i", pct_inventory(lab, ct, tmp),
             "-e", "reclaim_summary_file=" + summary_file, "-e", "gpus_free_term_timeout=2", "-vvv"],
            env=ansible_env(), capture_output=True, text=True, timeout=600, check=False)
        out = run.stdout + run.stderr
        assert run.returncode == 0, out
        with open(summary_file) as f:
            host = json.load(f)["hosts"][CT_HOST]

    # The connection ran the modules through `pct exec 129` on the Proxmox host.
    assert re.search(r"EXEC /usr/sbin/pct exec %s -- " % VMID, out), out
    assert host["status"] == "ok" and host["changed"] is True, host
    # Inside the guest: its own PID for the holder, SIGTERM ignored (its SigIgn), SIGKILL at once.
    steps = [(a["step"], a.get("pid")) for a in host["actions"]]
    assert ("sigterm", guest_pid) in steps and ("sigkill", guest_pid) in steps, host["actions"]
    assert 5 in [g["index"] for g in host["gpus_after"]] and all(g["free"] for g in host["gpus_after"]), host
    # From the host side: the holder is gone, the GPU free, the guest running on.
    assert not sc.identity(lab, ct, node_pid)
    again = lab.module(ct, "gpuops.reclaim.gpu_holders", {"gpus": ["5"]})
    assert again["free"] is True and again["holders"] == [], again
    assert "RUNNING" in lab.exec(ct, "lxc-info -n %s -s" % VMID).stdout


def test_a_restarting_unit_of_guest_129_is_named_with_pct_exec_and_not_waited_for(lab, ct):
    """From the Proxmox host, killing the guest unit's process only has the guest's systemd
    start it again: the run fails at once (no wait for memory nothing will free) naming
    `pct exec 129 -- systemctl stop UNIT`, and that command, run as written, frees the GPU."""
    lg.start_unit(lab, ct, VMID, UNIT, 6, 900, "sglang-ct")

    result = lab.module(ct, "gpuops.reclaim.gpu_reclaim", dict(FAST, gpus=["6"]))

    assert result.get("failed") is True and result["free"] is False
    assert [a["code"] for a in result["actions"] if a["step"] == "watch_respawn"][0] == "guest_back"
    waits = [a for a in result["actions"] if a["step"] == "wait_release"]
    assert waits and all(a["waited_s"] == 0 for a in waits), waits
    command = "pct exec %s -- systemctl stop %s" % (VMID, UNIT)
    assert command in waits[0]["result"], waits
    assert re.findall(r"`(pct exec \S+ -- systemctl stop \S+)`", result["msg"]) == [command], result["msg"]
    assert lab.exec(ct, in_guest("systemctl is-active %s" % UNIT)).stdout.strip() == "active"

    lab.exec(ct, " ".join(shlex.quote(w) for w in command.split()))

    sc.wait_until(lab, ct, "[ -z \"$(pgrep -x sglang-ct)\" ]", "the guest unit's holder gone")
    again = lab.module(ct, "gpuops.reclaim.gpu_holders", {"gpus": ["6"]})
    assert again["free"] is True and again["holders"] == []
    assert "RUNNING" in lab.exec(ct, "lxc-info -n %s -s" % VMID).stdout


LOOP_VMID = "130"
LOOP_TITLE = "sglang::scheduler_TP4"
# The guest's PID 1: a loop restarting a server, as `docker run IMAGE sh -c 'while :; do ...;
# done'` or a guest whose init runs the server. The server imports for 1 s, re-titles itself,
# then loads for 2 s before it takes the GPU (a real server's shape, FIELD_NOTES).
LOOP_INIT = """#!/bin/sh
while :; do
    /opt/gpuops-lab/fakegpu/fakegpu hold --gpu 4:800 --import-s 1 --load-s 2 --title %s
    sleep 0.3
done
""" % LOOP_TITLE


@pytest.fixture
def loop_guest(lab, pct_node):
    """(node, init's node PID): guest 130, whose init is LOOP_INIT, its server holding GPU 4."""
    sc.cleanup(lab, pct_node)
    lg.boot(lab, pct_node, LOOP_VMID, hostname="loop-ct130", init=LOOP_INIT)
    sc.wait_until(lab, pct_node, "[ \"$(%s)\" = 800 ]" % used_mib_command(4), "guest 130's server holding GPU 4")
    init = lab.exec(pct_node, "lxc-info -n %s -p -H" % LOOP_VMID).stdout.strip()
    yield pct_node, int(init)
    lg.remove(lab, pct_node, LOOP_VMID)
    sc.cleanup(lab, pct_node)


def test_a_guests_init_restarting_the_server_is_named_with_its_guest_and_the_command(lab, loop_guest):
    """Before: the run read free after one SIGTERM (the init was never watched, being
    protected), and the server held the GPU again 3 s later. Now the init is watched, never
    signalled, and the failure names guest 130 and `pct stop 130` (no `kill`); that command,
    run as written, frees the GPU."""
    node, init_pid = loop_guest

    result = lab.module(node, "gpuops.reclaim.gpu_reclaim", dict(FAST, gpus=["4"]))

    assert result.get("failed") is True and result["free"] is False, result
    respawns = [a for a in result["actions"] if a["step"] == "respawn"]
    assert [a["pid"] for a in respawns] == [init_pid], result["actions"]
    assert init_pid not in [a.get("pid") for a in result["actions"] if a["step"].startswith("sig")], result["actions"]
    assert [r["reason_code"] for r in result["remaining"] if r["pid"] == init_pid] == ["respawns"], result["remaining"]
    said = [s for s in result["msg"].split(". ") if "PID %d " % init_pid in s]
    # Named by its VMID (a respawner's owner is not looked up through `pct config`, as a holder's is).
    assert said and "init of Proxmox guest %s" % LOOP_VMID in said[0], result["msg"]
    assert re.findall(r"`([^`]+)`", said[0]) == ["pct stop %s" % LOOP_VMID], said[0]
    assert "RUNNING" in lab.exec(node, "lxc-info -n %s -s" % LOOP_VMID).stdout

    lab.exec(node, "pct stop %s" % LOOP_VMID)

    sc.wait_until(lab, node, "[ \"$(%s)\" = 0 ]" % used_mib_command(4), "GPU 4 free once guest 130 stopped")
    again = lab.module(node, "gpuops.reclaim.gpu_holders", {"gpus": ["4"]})
    assert again["free"] is True and again["holders"] == []


def in_guest_through_pct(lab, node, vmid, fqcn, args):
    """Run one module inside guest `vmid` through the pct connection; its result (failures too)."""
    with tempfile.TemporaryDirectory(prefix="pct-module-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        play = [{"hosts": CT_HOST, "gather_facts": False, "tasks": [
            {"name": "module under test", fqcn: args, "register": "ct_result", "ignore_errors": True, "become": True},
            {"ansible.builtin.copy": {"content": "{{ ct_result | to_json }}", "dest": result_path},
             "delegate_to": "localhost"},
        ]}]
        playbook = os.path.join(tmp, "play.json")
        with open(playbook, "w") as f:
            json.dump(play, f)
        run = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", pct_inventory(lab, node, tmp, vmid),
                              playbook], env=ansible_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=300, check=False)
        assert os.path.exists(result_path), "no result (rc %d):\n%s\n%s" % (run.returncode, run.stdout, run.stderr)
        with open(result_path) as f:
            return json.load(f)


def test_inside_the_guest_its_init_restarting_the_server_is_named_as_pid_1_not_free(lab, loop_guest):
    """The seeds' layout (the module inside the guest, through `pct exec 130`) on the same guest:
    before, the run read free after one SIGTERM and the loop held the GPU again seconds later
    (measured); now PID 1, no systemd, is watched, never signalled, and named with the command
    that stops the guest from its host."""
    node, _init_pid = loop_guest

    result = in_guest_through_pct(lab, node, LOOP_VMID, "gpuops.reclaim.gpu_reclaim", dict(FAST, gpus=["4"]))

    assert result.get("failed") is True and result["free"] is False, result
    assert [a["pid"] for a in result["actions"] if a["step"] == "respawn"] == [1], result["actions"]
    assert 1 not in [a.get("pid") for a in result["actions"] if a["step"].startswith("sig")], result["actions"]
    assert [r["reason_code"] for r in result["remaining"] if r["pid"] == 1] == ["respawns"], result["remaining"]
    said = [s for s in result["msg"].split(". ") if s.startswith("PID 1 ")]
    assert said and "`pct stop VMID`" in said[0] and "`kill" not in said[0], result["msg"]
    assert "RUNNING" in lab.exec(node, "lxc-info -n %s -s" % LOOP_VMID).stdout
