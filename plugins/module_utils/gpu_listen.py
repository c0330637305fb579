# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Listen: who listens on a server's port, and whether each listener is the unit's own server.

A free port is anyone's: while a server loads, any local user may bind its port and answer
200 on /health (issue 22; tests/integration/test_security.py's squatter). So an answer counts
only when every listener is the unit's, and a cgroup name counts only where root named it: a
process in a user's delegated subtree (user@UID.service) has that user@UID.service as its unit,
never a name she chose below it, `sglang.service` included (gpu_owner.root_named_unit). A
listener is the unit's when:

- its cgroup, where systemd keeps it (gpu_owner.systemd_path), is the unit's ControlGroup as
  systemd reports it, or below it (code IN_UNIT);
- or, for a unit that runs its server in a container (`container`: its name), the listener's
  cgroup is a docker or podman container's that the runtime confirms (its inspect gives an init
  PID whose cgroup is that very container: gpu_trust.confirm) and names `container`
  (code UNIT_CONTAINER). A docker container's processes live in docker's scope, never in the
  unit's cgroup.

Observation through gpu_observe (the LISTEN sockets from /proc/net/tcp{,6}, their holders from
/proc/PID/fd, the unit's ControlGroup, the runtime's inspect); `verdict` is pure.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe, gpu_owner, gpu_trust
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text

# Why a listener is the unit's (codes), or why not.
IN_UNIT = 'in_unit'                  # in the unit's ControlGroup or below it
UNIT_CONTAINER = 'unit_container'    # in the unit's container, as its runtime confirms
NO_UNIT = 'no_unit'                  # no unit was named, or systemd gave it no control group
OUTSIDE = 'outside'                  # elsewhere: not the unit's
# Runtimes whose containers a unit may run its server in (the role's inference_service_runtime).
CONTAINER_RUNTIMES = ('docker', 'podman')
CMDLINE_CHARS = 160


def verdict(path, group, owner, container=None):
    """Pure: the code saying whether a listener whose systemd cgroup is `path` and whose owner
    (gpu_owner record, with `confirmed` and `name` from its runtime) is the unit's, given the
    unit's ControlGroup `group` and the name of its container (`container`, or None)."""
    if gpu_owner.within(path, group):
        return IN_UNIT
    if container and owner.get('kind') == gpu_owner.CONTAINER and owner.get('runtime') in CONTAINER_RUNTIMES \
            and gpu_trust.refusal(gpu_trust.STOP_CONTAINER, owner) is None and owner.get('name') == container:
        return UNIT_CONTAINER
    return OUTSIDE if group else NO_UNIT


def label(entry):
    """'PID 4242 (uid 1000, python3 squat.py, cgroup /user.slice/...)', users' text escaped."""
    return 'PID %d (uid %s, %s, cgroup %s)' % (entry['pid'], entry['uid'], escape_text(entry['cmdline'][:CMDLINE_CHARS]),
                                              escape_text(entry['cgroup']))


def _confirmed(owner, timeout):
    """The owner with `name` and `confirmed` from its runtime's inspect (containers only)."""
    if owner['kind'] != gpu_owner.CONTAINER or owner.get('runtime') not in CONTAINER_RUNTIMES:
        return owner
    details = gpu_observe.runtime_details(owner, timeout=timeout)
    owner = dict(owner, name=details.get('name') or owner.get('name'))
    owner['confirmed'] = gpu_trust.confirm(owner, runtimes={(owner['runtime'], owner['id']): details})
    return owner


def listeners(port, host, unit=None, container=None, proc='/proc', timeout=10):
    """What listens on host:port: {port, host, listening, owners: [...], unit, unit_cgroup,
    unreadable}. `listening` with no owners: a socket this host cannot tie to a process it sees
    (another PID namespace, or /proc/PID/fd it may not read: see `unreadable`)."""
    inodes = gpu_observe.tcp_listeners(port, host, proc)
    group = gpu_observe.unit_restart_policy(unit, timeout)[2] if unit else None
    procs, unreadable = gpu_observe.scan_processes(sorted(inodes), proc=proc) if inodes else ({}, [])
    unified = gpu_observe.unified_cgroup()
    owners = []
    for pid in sorted(procs):
        info = procs[pid]
        path = gpu_owner.systemd_path(info.cgroup, unified)
        uids = None
        for hierarchy in (('', 'name=systemd') if unified else ('name=systemd', '')):
            uids = (info.cgroup_uids or {}).get((hierarchy, path))
            if uids is not None:
                break
        owner = _confirmed(gpu_owner.owner_from_cgroup(info.cgroup, info.cgroup_uids), timeout)
        code = verdict(path, group, owner, container)
        entry = {'pid': pid, 'start_time': info.start_time, 'uid': info.uid, 'user': info.user,
                 'name': info.name, 'cmdline': info.cmdline or info.name,
                 'unit': gpu_owner.root_named_unit(path, uids), 'cgroup': path,
                 'in_unit': code in (IN_UNIT, UNIT_CONTAINER), 'reason_code': code,
                 'owner': dict((key, owner.get(key)) for key in
                               ('kind', 'runtime', 'id', 'name', 'unit', 'controlled_by', 'uid', 'confirmed'))}
        entry['label'] = label(entry)
        owners.append(entry)
    return {'port': port, 'host': host, 'listening': bool(inodes), 'owners': owners, 'unit': unit,
            'unit_cgroup': group, 'unreadable': ['PID %s: %s %s' % item for item in unreadable]}
