"""gpu_trust: which levers root may pull, from real cgroup path texts of a lab node
(Debian 12, systemd 252, hybrid layout: name=systemd and the v2 tree) where alice (uid 1000)
lingers, and the owners of their directories as `stat` showed them there."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import pytest

# gpu_owner reads a cgroup with the families' recognisers, which gpu_families hands it on import.
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_families  # noqa: F401 pylint: disable=unused-import
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_trust as trust
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import UnitFacts

CID = "9408f0bbe98e121b565cc3d4090a128d9894b03676992794f62c58c6a037b74b"
ALICE = "/user.slice/user-1000.slice/user@1000.service/app.slice"


def hybrid(path):
    """/proc/PID/cgroup of a lab node process (v1 controllers at the namespace root)."""
    return "9:name=systemd:%s\n8:pids:/\n1:cpu:/\n0::%s\n" % (path, path)


def uids_down(path, first_user_index=None, uid=1000):
    """Owners of the root and each directory of `path`: root's up to `first_user_index` (the
    component whose directory alice owns, user@1000.service's with Delegate=yes), hers after."""
    parts = gpu_owner.path_parts(path)
    out = [0]
    for index in range(len(parts)):
        out.append(uid if first_user_index is not None and index >= first_user_index else 0)
    return out


def facts_for(path, first_user_index=None):
    text = hybrid(path)
    uids = uids_down(path, first_user_index)
    return text, {("name=systemd", path): uids, ("", path): uids}


def owner_of(path, first_user_index=None, **confirm):
    text, dir_uids = facts_for(path, first_user_index)
    owner = gpu_owner.owner_from_cgroup(text, dir_uids)
    return owner._replace(confirmed=trust.confirm(owner, **confirm))


SYSTEM_VICTIM = {"victim.service": UnitFacts("no", "active", "/system.slice/victim.service")}


@pytest.mark.parametrize("inner", [
    "victim.service", "*.service", "docker-%s.scope" % CID,
    "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod74c13223_5a00_11e9_b385_42010a80018d.slice",
    "machine-evil.scope/payload/system.slice/x.service", "lxc.payload.evil/system.slice/x.service",
])
def test_a_name_in_alices_subtree_chooses_no_root_lever_and_no_shield(inner):
    path = "%s/%s" % (ALICE, inner)
    owner = owner_of(path, first_user_index=2, units=SYSTEM_VICTIM,
                     runtimes={("docker", CID): {"pid": 4242, "init_cgroup": hybrid(path)}})
    assert (owner.kind, owner.controlled_by, owner.uid) == ("user", "user", 1000)
    assert owner.id is None and owner.pod is None and owner.runtime is None
    for lever in (trust.STOP_UNIT, trust.STOP_CONTAINER, trust.SHIELD_POD, trust.SHIELD_INIT):
        assert trust.refusal(lever, owner) == trust.USER_CGROUP
    assert trust.refusal(trust.STOP_USER_UNIT, owner) in (trust.UNCONFIRMED, trust.NOT_THAT_OWNER)


def test_the_user_manager_rule_holds_without_the_directory_owners():
    # Without stat results (a pure parse), user@UID.service alone still ends root's names.
    owner = gpu_owner.owner_from_cgroup(hybrid("%s/victim.service" % ALICE))
    assert (owner.kind, owner.uid, owner.unit, owner.manager) == ("user", 1000, "victim.service", "user")
    assert trust.refusal(trust.STOP_UNIT, owner) == trust.USER_CGROUP


def test_a_glob_is_never_a_unit_of_anyone():
    owner = owner_of("%s/*.service" % ALICE, first_user_index=2)
    assert owner.unit is None and owner.manager is None
    assert not gpu_owner.valid_unit_name("*.service")
    for name in ("sshd.servic?", "[a-z]*.service", "a b.service", "x@.service", "", "a" * 252 + ".service"):
        assert not gpu_owner.valid_unit_name(name), name
    for name in ("sglang.service", "getty@tty1.service", "machine-a\\x2db.scope", "session-7.scope"):
        assert gpu_owner.valid_unit_name(name), name


def test_a_directory_root_does_not_own_hands_its_childrens_names_to_its_owner():
    # A system service run with User=alice and Delegate=yes: systemd chowns its cgroup to her.
    # The service's own name was chosen by root (its parent is root's); below it, hers.
    path = "/system.slice/job.service/docker-%s.scope" % CID
    owner = owner_of(path, first_user_index=1)
    assert (owner.kind, owner.controlled_by, owner.uid) == ("user", "user", 1000)
    assert trust.refusal(trust.STOP_CONTAINER, owner) == trust.USER_CGROUP
    top = owner_of("/system.slice/job.service", first_user_index=1,
                   units={"job.service": UnitFacts("always", "active", "/system.slice/job.service")})
    assert (top.kind, top.unit, top.controlled_by) == ("service", "job.service", "root")
    assert trust.refusal(trust.STOP_UNIT, top) is None


def test_an_unreadable_directory_or_a_path_outside_the_namespace_is_unknown():
    path = "/system.slice/docker-%s.scope" % CID
    owner = gpu_owner.owner_from_cgroup("0::%s\n" % path, {("", path): [0, None, None]})
    assert (owner.kind, owner.controlled_by) == ("user", "unknown")
    assert trust.refusal(trust.STOP_CONTAINER, owner) == trust.UNKNOWN_CGROUP
    outside = gpu_owner.owner_from_cgroup("0::/../../system.slice/x.service\n", {})
    assert outside.controlled_by == "unknown" and outside.unit is None


def test_a_path_she_named_in_any_hierarchy_makes_the_process_hers():
    # Hybrid: she may move her process in name=systemd and in the v2 tree separately.
    root_named = "/system.slice/docker-%s.scope" % CID
    hers = "%s/x.scope" % ALICE
    text = "9:name=systemd:%s\n0::%s\n" % (root_named, hers)
    owner = gpu_owner.owner_from_cgroup(text, {("name=systemd", root_named): uids_down(root_named),
                                               ("", hers): uids_down(hers, 2)})
    assert (owner.kind, owner.controlled_by) == ("user", "user")


def test_a_system_unit_counts_only_when_systemd_confirms_its_control_group():
    path = "/system.slice/sglang.service"
    assert trust.refusal(trust.STOP_UNIT, owner_of(path, units={
        "sglang.service": UnitFacts("always", "active", path)})) is None
    assert trust.refusal(trust.STOP_UNIT, owner_of(path)) == trust.UNCONFIRMED
    # A unit systemd knows elsewhere (or not loaded: ControlGroup empty) is not this cgroup's.
    for other in ("/system.slice/other/sglang.service", "", None):
        assert trust.refusal(trust.STOP_UNIT, owner_of(path, units={
            "sglang.service": UnitFacts("always", "inactive", other)})) == trust.UNCONFIRMED


def test_a_users_service_is_her_managers_unit_not_the_systems():
    path = "%s/vllm.service" % ALICE
    owner = owner_of(path, first_user_index=2,
                     user_units={(1000, "vllm.service"): UnitFacts("always", "active", path)})
    assert (owner.unit, owner.manager, owner.confirmed) == ("vllm.service", "user", True)
    assert trust.refusal(trust.STOP_UNIT, owner) == trust.USER_CGROUP
    assert trust.refusal(trust.STOP_USER_UNIT, owner) is None
    # Her manager knows no such unit there (a directory she made): nothing to stop anywhere.
    bare = owner_of(path, first_user_index=2, user_units={(1000, "vllm.service"): UnitFacts()})
    assert trust.refusal(trust.STOP_USER_UNIT, bare) == trust.UNCONFIRMED


def test_a_container_counts_only_when_its_runtime_gives_an_init_in_that_container():
    path = "/system.slice/docker-%s.scope" % CID
    mine = owner_of(path, runtimes={("docker", CID): {"pid": 77, "init_cgroup": hybrid(path)}})
    assert trust.refusal(trust.STOP_CONTAINER, mine) is None
    assert trust.refusal(trust.SHIELD_INIT, mine) is None
    elsewhere = hybrid("/system.slice/docker-%s.scope" % ("0" * 64))
    for details in ({}, {"pid": 77}, {"pid": 77, "init_cgroup": elsewhere}):
        other = owner_of(path, runtimes={("docker", CID): details})
        assert trust.refusal(trust.STOP_CONTAINER, other) == trust.UNCONFIRMED
        assert trust.refusal(trust.SHIELD_INIT, other) == trust.UNCONFIRMED


def test_a_pod_shields_only_from_the_kubelets_root_named_tree():
    path = ("/kubepods.slice/kubepods-besteffort.slice/"
            "kubepods-besteffort-pod74c13223_5a00_11e9_b385_42010a80018d.slice/cri-containerd-%s.scope" % CID)
    assert trust.refusal(trust.SHIELD_POD, owner_of(path)) is None


@pytest.mark.parametrize("uids, exe_uid, shielded", [
    ((0, 0, 0, 0), 0, True),
    ((1000, 1000, 1000, 1000), 0, False),      # alice runs /usr/sbin/sshd (root's file): no
    ((0, 0, 0, 0), 1000, False),               # root runs a file alice owns: no
    ((1000, 0, 0, 0), 0, False),               # setuid: not root all through
    (None, None, False),                       # unreadable: no
])
def test_an_infrastructure_name_shields_a_root_process_from_a_root_owned_file_only(uids, exe_uid, shielded):
    owner = owner_of("/user.slice/user-1000.slice/session-3.scope")
    got = trust.refusal(trust.SHIELD_INFRASTRUCTURE, owner, {"uids": uids, "exe_uid": exe_uid})
    assert (got is None) is shielded


def test_an_infrastructure_name_in_a_confirmed_never_stopped_unit_is_shielded():
    path = "/system.slice/nvidia-persistenced.service"
    owner = owner_of(path, units={"nvidia-persistenced.service": UnitFacts("always", "active", path)})
    alice = {"uids": (1000,) * 4, "exe_uid": 0}
    assert trust.refusal(trust.SHIELD_INFRASTRUCTURE, owner, alice, protected_unit=True) is None
    assert trust.refusal(trust.SHIELD_INFRASTRUCTURE, owner, alice, protected_unit=False) == trust.NOT_ROOT


def test_a_users_manager_is_shielded_as_the_main_process_of_user_at_uid_service_only():
    # alice's `systemd --user` (PID 132 in the lab node) runs as her, in her own subtree
    # (user@1000.service/init.scope, a directory she owns): its name and cgroup shield nothing,
    # systemd naming it user@1000.service's MainPID does.
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
    from .observations import proc
    manager = proc(132, name="systemd", cmdline="/lib/systemd/systemd --user",
                   cgroup=hybrid("/user.slice/user-1000.slice/user@1000.service/init.scope"))
    manager.uids, manager.exe_uid = (1000,) * 4, 0
    facts = {"user@1000.service": UnitFacts(None, "active", "/user.slice/user-1000.slice/user@1000.service", 132)}
    assert decide.protection_code(manager, set(), [], units=facts) == (lever.INFRASTRUCTURE, "systemd")
    assert decide.protection_code(manager, set(), [], units={}) == (None, None)
    impostor = proc(133, name="systemd", cmdline="systemd --user", cgroup=manager.cgroup)
    impostor.uids, impostor.exe_uid = (1000,) * 4, 0
    assert decide.protection_code(impostor, set(), [], units=facts) == (None, None)
