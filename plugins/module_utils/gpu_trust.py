# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Trust: which levers root may pull for an owner, from what root alone controls.

Pure. A node's users control the names of the cgroups in their delegated subtree, their
process titles and command lines, and may make PID namespaces (`unshare -Urpf`). None of that
may choose a lever root pulls (a system unit stop, a runtime stop) or a shield (a pod's, a
container init's, an infrastructure daemon's protection). What counts:

- a cgroup's names only where root named them (gpu_owner.named_by_root: `controlled_by`);
- a unit only when its manager confirms that its ControlGroup is the holder's cgroup, and a
  container only when its runtime confirms that its init runs in the holder's container
  (`confirm`, from what gpu_observe read: systemctl show, the runtime's inspect);
- an infrastructure name only for a process running as root from a root-owned executable, in
  a confirmed system unit that is never stopped, or that systemd names the main process of such
  a unit (a user's manager is user@UID.service's MainPID, running as the user).

`refusal(lever, owner, identity)` is the one decision: None when root may pull `lever` for the
holder, else a code (REFUSALS) that one place turns into a sentence.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner

# The levers and shields root may pull for an owner.
STOP_UNIT = 'stop_unit'              # `systemctl stop UNIT` on the system manager
STOP_USER_UNIT = 'stop_user_unit'    # `systemctl --user stop UNIT` as the user, on her manager
STOP_CONTAINER = 'stop_container'    # the container runtime's stop
SHIELD_POD = 'shield_pod'            # never signalled: the kubelet's
SHIELD_INIT = 'shield_init'          # never signalled: a runtime's container init, a guest's init
SHIELD_INFRASTRUCTURE = 'shield_infrastructure'   # never signalled: a GPU or cluster daemon

# Why not (codes; sentences in REFUSALS).
USER_CGROUP = 'user_cgroup'          # a user named this cgroup
UNKNOWN_CGROUP = 'unknown_cgroup'    # who named it could not be read
UNCONFIRMED = 'unconfirmed'          # the manager or runtime did not confirm it owns the cgroup
NOT_ROOT = 'not_root'                # the process does not run as root from a root-owned file
NOT_THAT_OWNER = 'not_that_owner'    # the owner is of another kind than the lever needs

REFUSALS = {
    USER_CGROUP: 'its cgroup lies where a user names the cgroups',
    UNKNOWN_CGROUP: 'who named its cgroup could not be read',
    UNCONFIRMED: 'its manager or runtime did not confirm that it owns this cgroup',
    NOT_ROOT: 'it does not run as root from a root-owned executable',
    NOT_THAT_OWNER: 'its owner is not of that kind',
}


def owned_cgroup(owner, unit):
    """The cgroup path of `unit` within the owner's cgroup path: the path up to and including
    the innermost component that is `unit`; None when the path has no such component."""
    parts = gpu_owner.path_parts(owner.cgroup or '')
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] == unit:
            return '/' + '/'.join(parts[:index + 1])
    return None


def confirm(owner, units=None, user_units=None, runtimes=None):
    """Whether the owner's manager or runtime confirms that it owns the owner's cgroup:
    True, False, or None when there is nothing to confirm.

    `units`: system unit -> (Restart, ActiveState, ControlGroup); `user_units`: (uid, unit) ->
    the same from that user's manager; `runtimes`: (runtime, id) -> the runtime's inspect
    (gpu_owner.parse_inspect) with `init_cgroup`, the /proc/PID/cgroup text of the PID it gave.
    """
    kind, unit = owner.kind, owner.unit
    if kind == gpu_owner.CONTAINER:
        details = (runtimes or {}).get((owner.runtime, owner.id)) or {}
        init = details.get('init_cgroup')
        if not init or not owner.id:
            return False
        init_owner = gpu_owner.owner_from_cgroup(init)
        return init_owner.kind == gpu_owner.CONTAINER and init_owner.id == owner.id
    if not unit or owner.manager is None:
        return None
    if owner.manager == gpu_owner.SYSTEM_MANAGER:
        facts = (units or {}).get(unit)
    else:
        facts = (user_units or {}).get((owner.uid, unit))
    control_group = facts.control_group if facts else None
    return bool(control_group) and control_group == owned_cgroup(owner, unit)


def runs_as_root(identity):
    """`identity` (uids: real, effective, saved, filesystem; exe_uid: the owner of
    /proc/PID/exe; main_of_protected_unit, see gpu_decide.identity_of) shows a root process
    started from a root-owned executable."""
    identity = identity or {}
    uids = identity.get('uids')
    return bool(uids) and all(uid == 0 for uid in uids) and identity.get('exe_uid') == 0


def _root_named(owner):
    controlled = owner.controlled_by
    if controlled == gpu_owner.BY_USER:
        return USER_CGROUP
    if controlled != gpu_owner.ROOT:
        return UNKNOWN_CGROUP
    return None


def refusal(lever, owner, identity=None, protected_unit=False):
    """None when root may pull `lever` for a holder with this owner, else the code saying why
    not. `identity` is the process's (see runs_as_root); `protected_unit` says the owner's
    unit is one never stopped (sshd, the GPU vendor's daemons), for SHIELD_INFRASTRUCTURE."""
    owner = owner or gpu_owner.new_owner(gpu_owner.NONE)
    kind = owner.kind
    if lever == SHIELD_INFRASTRUCTURE:
        if runs_as_root(identity) or (identity or {}).get('main_of_protected_unit'):
            return None
        if protected_unit and refusal(STOP_UNIT, owner) is None:
            return None
        return NOT_ROOT
    if lever == STOP_USER_UNIT:
        if owner.manager != gpu_owner.USER_MANAGER or owner.uid is None \
                or not (owner.unit or '').endswith('.service'):
            return NOT_THAT_OWNER
        return None if owner.confirmed else UNCONFIRMED
    wanted = {STOP_UNIT: (gpu_owner.SERVICE,), STOP_CONTAINER: (gpu_owner.CONTAINER,),
              SHIELD_POD: (gpu_owner.POD,),
              SHIELD_INIT: (gpu_owner.CONTAINER, gpu_owner.GUEST)}[lever]
    if kind == gpu_owner.USER:
        return _root_named(owner) or NOT_THAT_OWNER
    if kind not in wanted:
        return NOT_THAT_OWNER
    named = _root_named(owner)
    if named:
        return named
    if lever == STOP_UNIT and owner.manager != gpu_owner.SYSTEM_MANAGER:
        return NOT_THAT_OWNER
    if lever in (STOP_UNIT, STOP_CONTAINER) or (lever == SHIELD_INIT and kind == gpu_owner.CONTAINER):
        return None if owner.confirmed else UNCONFIRMED
    return None
