"""gpu_family_guest: each guest's cgroup layout (Proxmox, LXC, systemd-nspawn), recognised as
the guest with its own unit inside it (never this host's unit), from real /proc/PID/cgroup
texts; the names it unescapes; a guest unit that comes back keeps its GPU held and named."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import pytest

from .observations import CID, CTX, gpu, own, proc, v1, v2
from .test_gpu_flow import GUEST_UNIT, ScriptedActor, ScriptedSurveyor, free, guest_and_stuck, ladder, survey_of


def test_proxmox_guest_with_its_own_service():
    # Proxmox (pve-container) puts guest <vmid> in "lxc/<vmid>" with the guest's own tree in
    # an inner "ns" directory; a real host's line, quoted in USTC-vlab/maint-docs
    # (docs/workflow/miscellaneous.md): "0::/lxc/6666/ns/system.slice/lightdm.service".
    got = own(v2("/lxc/6666/ns/system.slice/lightdm.service"))
    assert (got.kind, got.runtime, got.id) == ("guest", "proxmox", "6666")
    # The guest's unit is the guest's, never this host's unit to stop.
    assert got.unit is None
    assert got.guest_unit == "lightdm.service"


def test_proxmox_guest_init():
    got = own(v2("/lxc/101/ns/init.scope"))
    assert (got.runtime, got.id, got.guest_unit) == ("proxmox", "101", "init.scope")


def test_lxc_4_payload_v2():
    # LXC >= 4 (lxc/lxc src/lxc/cgroups/cgroup.h DEFAULT_PAYLOAD_CGROUP_PREFIX
    # "lxc.payload.", joined with the container name in cgfsng.c); LXD/Incus use the same.
    got = own(v2("/lxc.payload.sglang-box/system.slice/sglang.service"))
    assert (got.kind, got.runtime, got.id, got.name) == ("guest", "lxc", "sglang-box", "sglang-box")
    assert got.guest_unit == "sglang.service"


def test_lxc_3_v1_layout():
    # LXC <= 3 on cgroup v1: "/lxc/<name>" in every hierarchy.
    got = own(v1("/lxc/web1"))
    assert (got.kind, got.runtime, got.id) == ("guest", "lxc", "web1")


def test_nspawn_registered_guest():
    # systemd-nspawn registered with machined: "machine-<name>.scope" (name '-' escaped as
    # \x2d), the guest's tree under "payload" (as unregistered ones show it, below).
    got = own(v2("/machine.slice/machine-gpu\\x2dbox.scope/payload/system.slice/sglang.service"))
    assert (got.kind, got.runtime, got.id) == ("guest", "systemd-nspawn", "gpu-box")
    assert got.guest_unit == "sglang.service"


def test_nspawn_unregistered_guest_as_the_lab_controller_sees_it():
    # Read on this project's controller before lab nodes had cgroups of their own: a node
    # (nspawn --register=no --keep-unit, started outside any unit) running a podman container,
    # seen from outside the node.
    got = own("9:name=systemd:/payload\n4:memory:/process_api/eb746d0e\n"
              + v2("/payload/machine.slice/libpod-%s.scope" % CID))
    assert (got.kind, got.runtime, got.id) == ("guest", "systemd-nspawn", None)
    assert got.guest_unit == "libpod-%s.scope" % CID


@pytest.mark.parametrize("outside", [
    "/user.slice/user-0.slice/session-5.scope",   # started by hand from an SSH session
    "/system.slice/gpu-box.service",              # started by a unit of its own, --keep-unit
    "/gpuops10-node1",                            # the lab: a cgroup the starter made for it
])
def test_nspawn_keep_unit_guest_below_the_cgroup_it_was_started_in(outside):
    # The guest's sglang.service is the guest's unit, never this host's: a host unit of that
    # name must not be the one stopped.
    got = own("9:name=systemd:%s/payload/system.slice/sglang.service\n" % outside
              + v2("%s/payload/system.slice/sglang.service" % outside))
    assert (got.kind, got.runtime, got.id, got.unit) == ("guest", "systemd-nspawn", None, None)
    assert got.guest_unit == "sglang.service"


def test_nspawn_supervisor_is_the_hosts_process_in_the_starters_unit():
    got = own(v2("/user.slice/user-0.slice/session-5.scope/supervisor"))
    assert (got.kind, got.unit) == ("session", "session-5.scope")


def test_unescape_systemd_never_makes_a_control_character():
    # Any user can name a cgroup machine-x\x0ay.scope in her subtree, and root can be handed
    # such a name too: only printable ASCII is unescaped.
    got = own(v2(r"/machine.slice/machine-a\x2db\x0a\x1bc.scope"))
    assert got.id == r"a-b\x0a\x1bc"
    assert got.id.isprintable()


def guest_back_without_memory():
    """The guest's systemd started sglang.service again: its new process, PID 20, has the device
    open and no context yet (a real server loads its weights first; the soak's guest trials saw
    it so 0.2 s after the kill), so NVML lists nothing and the memory reads free."""
    return survey_of([gpu(0, used=0)], [proc(20, name='exits-on-kill', fds=CTX, cgroup=GUEST_UNIT)])


def test_a_guest_unit_back_before_it_takes_memory_keeps_its_gpu_held_and_named():
    actor = ScriptedActor()
    result = ladder(ScriptedSurveyor(guest_and_stuck((10,)), free(), guest_back_without_memory()), actor).run()
    assert [c for c in actor.calls if c[0].startswith('SIG')] == [('SIGTERM', 10), ('SIGKILL', 10)]
    watch = [a for a in result['actions'] if a['step'] == 'watch_respawn']
    assert watch and watch[0]['code'] == 'guest_back' and 'PID 20' in watch[0]['result']
    assert result['free'] is False, 'the restarted unit has the GPU open: it is not free'
    assert 'sglang.service' in result['msg'] and 'PID 20' in result['msg'], result['msg']
