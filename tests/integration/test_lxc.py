"""A holder in a real LXC guest (Debian's lxc 5.0, `lxc-start` inside a lab node booted with
LAB_RUNTIMES=1; lxc_guest.py boots it), seen from the host around it (the node, where the
guest's processes sit under /lxc.payload.NAME) and from inside, where the modules run over SSH
as in the seeds.

For its in-guest test the guest's sshd is unmasked and told to listen on the lab's own base
address only, 127.0.0.LAB_ADDR_BASE, which no node of any lab takes (unmasked as it comes, it
listens on [::]:22 of the controller's network).
"""

import os
import re

import pytest

from . import lxc_guest as lg
from . import scenarios as sc
from .conftest import Lab

FAST = {"term_timeout": 1.5, "release_timeout": 5, "nvml_timeout": 5}
GUEST = "gpuops-t-lxc"
UNIT = "sglang-lxc.service"
DIR = lg.guest_dir(GUEST)


# The lab's base address: nodes are base + 1..20, so no node of this or another lab (bases at
# least 20 apart) listens there.
GUEST_IP = "127.0.0.%d" % int(os.environ.get("LAB_ADDR_BASE", "10"))


def in_guest(cmd):
    return lg.in_guest(GUEST, cmd)


@pytest.fixture(scope="module")
def guest_node(lab):
    """(node): the last lab node with the guest booted (its systemd up) for the whole module."""
    name = lab.nodes[-1]
    lg.require_lxc(lab, name)
    lg.boot(lab, name, GUEST)
    yield name
    lg.remove(lab, name, GUEST)


@pytest.fixture
def gnode(lab, guest_node):
    end_unit(lab, guest_node)
    sc.cleanup(lab, guest_node)
    yield guest_node
    end_unit(lab, guest_node)
    sc.cleanup(lab, guest_node)


def end_unit(lab, node):
    lg.end_unit(lab, node, GUEST, UNIT)


def start_guest_unit(lab, node, gpu, mib):
    """A Restart=always unit in the guest whose process holds `mib` on `gpu`; its node PID."""
    return lg.start_unit(lab, node, GUEST, UNIT, gpu, mib, "sglang-guest")


def test_holders_from_the_host_name_the_lxc_guest_and_its_unit(lab, gnode):
    pid = start_guest_unit(lab, gnode, 7, 900)
    assert lab.exec(gnode, "cat /proc/%d/cgroup" % pid).stdout.strip().endswith(
        "::/lxc.payload.%s/system.slice/%s" % (GUEST, UNIT))

    result = lab.module(gnode, "gpuops.reclaim.gpu_holders", {"gpus": ["7"]})

    holder = [h for h in result["holders"] if h["pid"] == pid][0]
    owner = holder["owner"]
    assert (owner["kind"], owner["runtime"], owner["id"], owner["guest_unit"]) == ("guest", "lxc", GUEST, UNIT)
    said = [d for d in result["diagnosis"] if "PID %d" % pid in d and "LXC guest %s" % GUEST in d]
    assert said and "`lxc-attach -n %s -- systemctl stop %s`" % (GUEST, UNIT) in said[0], result["diagnosis"]


def test_a_restarting_guest_unit_is_named_with_the_command_that_stops_it(lab, gnode):
    """From the host, killing the guest unit's process only has the guest's systemd start it
    again: the run fails naming `lxc-attach -n GUEST -- systemctl stop UNIT`, and that very
    command, run as written, frees the GPU with the guest still running."""
    start_guest_unit(lab, gnode, 7, 900)

    result = lab.module(gnode, "gpuops.reclaim.gpu_reclaim", dict(FAST, gpus=["7"]))

    assert result.get("failed") is True and result["free"] is False
    watched = [a for a in result["actions"] if a["step"] == "watch_respawn"]
    assert watched and watched[0]["code"] == "guest_back", result["actions"]
    commands = re.findall(r"`(lxc-attach -n \S+ -- systemctl stop \S+)`", result["msg"])
    assert commands == ["lxc-attach -n %s -- systemctl stop %s" % (GUEST, UNIT)], result["msg"]
    assert lab.exec(gnode, in_guest("systemctl is-active %s" % UNIT)).stdout.strip() == "active"

    lab.exec(gnode, commands[0])

    sc.wait_until(lab, gnode, "[ -z \"$(pgrep -x sglang-guest)\" ]", "the guest unit's holder gone")
    again = lab.module(gnode, "gpuops.reclaim.gpu_holders", {"gpus": ["7"]})
    assert again["free"] is True and again["holders"] == []
    assert "RUNNING" in lab.exec(gnode, "lxc-info -n %s -s" % GUEST).stdout


@pytest.fixture(scope="module")
def guest_over_ssh(lab, guest_node, tmp_path_factory):
    """A Lab handle whose one host is the guest itself, reached over SSH at GUEST_IP with the
    lab's key: the seeds' layout, the modules running inside the guest."""
    if lab.exec(guest_node, "ss -Hltn 'sport = :22' | grep -qF ' %s:22 '" % GUEST_IP, check=False).returncode == 0:
        pytest.skip("something already listens on %s:22; the guest's sshd needs that address" % GUEST_IP)
    lab.exec(guest_node, "set -e; r=%s/rootfs; mkdir -p $r/etc/ssh/sshd_config.d $r/root/.ssh; "
                         "echo 'ListenAddress %s' > $r/etc/ssh/sshd_config.d/20-gpuops-lab-listen.conf; "
                         "install -m 600 /root/.ssh/authorized_keys $r/root/.ssh/authorized_keys; "
                         "%s; %s" % (DIR, GUEST_IP, in_guest("systemctl unmask --quiet ssh.service"),
                                     in_guest("systemctl start ssh.service")), timeout=120)
    with open(lab.inventory) as f:
        text = f.read()
    inventory = tmp_path_factory.mktemp("guest") / "inventory.ini"
    inventory.write_text(text.replace("[gpu_nodes]\n", "[gpu_nodes]\n%s ansible_host=%s\n" % (GUEST, GUEST_IP), 1))
    yield Lab([GUEST], str(inventory), lab.gpus)
    lab.exec(guest_node, in_guest("sh -c 'systemctl stop ssh.service; systemctl mask --quiet ssh.service'"),
             timeout=120)


def test_the_modules_inside_the_guest_free_a_holder_there(lab, gnode, guest_over_ssh):
    """The seeds' layout: gpu_reclaim run inside the guest over SSH stops the guest's own
    Restart=always unit (a unit of the host it runs on) and frees the GPU, the guest running on."""
    pid = start_guest_unit(lab, gnode, 6, 700)

    result = guest_over_ssh.module(GUEST, "gpuops.reclaim.gpu_reclaim", dict(FAST, gpus=["6"]))

    assert not result.get("failed"), result.get("msg", result)
    assert [(a["unit"], a["changed"]) for a in result["actions"] if a["step"] == "stop_unit"] == [(UNIT, True)], \
        result["actions"]
    assert result["free"] is True
    assert lab.exec(gnode, in_guest("systemctl is-active %s || true" % UNIT)).stdout.strip() in ("inactive", "failed")
    assert not sc.identity(lab, gnode, pid)
    again = lab.module(gnode, "gpuops.reclaim.gpu_holders", {"gpus": ["6"]})
    assert again["free"] is True and again["holders"] == []
    assert "RUNNING" in lab.exec(gnode, "lxc-info -n %s -s" % GUEST).stdout


def test_the_memory_of_a_restarting_guest_unit_is_not_waited_for(lab, gnode):
    start_guest_unit(lab, gnode, 7, 900)

    result = lab.module(gnode, "gpuops.reclaim.gpu_reclaim", dict(FAST, gpus=["7"]))

    assert result.get("failed") is True
    assert [a["code"] for a in result["actions"] if a["step"] == "watch_respawn"][0] == "guest_back"
    waits = [a for a in result["actions"] if a["step"] == "wait_release"]
    assert waits and all(a["waited_s"] == 0 for a in waits), waits
    # Said at once, with the command that stops the unit.
    assert "`lxc-attach -n %s -- systemctl stop %s`" % (GUEST, UNIT) in waits[0]["result"], waits
