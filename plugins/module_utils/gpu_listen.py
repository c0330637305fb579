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
- or, for a unit that runs its server in a docker or podman container (`container`: the runtime
  and the container's full ID, which the unit's own `docker run --cidfile` wrote in root's /run),
  it is in that container's cgroup, as the runtime confirms it: its inspect gives the init PID,
  and the kernel puts that PID in the cgroup of that very container (gpu_trust.confirm) (code
  UNIT_CONTAINER). A docker container's processes live in docker's scope, never in the unit's
  cgroup; a container's name is never the proof (anyone who may run it may give one).

Observation through gpu_observe (the LISTEN sockets from /proc/net/tcp{,6}, their holders from
/proc/PID/fd, the unit's ControlGroup, the runtime's inspect); `verdict` is pure.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever, gpu_observe, gpu_owner, gpu_trust
# gpu_owner reads a cgroup with the families' recognisers, which gpu_families hands it on import.
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_families  # noqa: F401 pylint: disable=unused-import
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text

# Why a listener is the unit's (codes), or why not.
IN_UNIT = 'in_unit'                  # in the unit's ControlGroup or below it
UNIT_CONTAINER = 'unit_container'    # in the unit's own container, as its runtime confirms
NO_UNIT = 'no_unit'                  # no unit was named, or systemd gave it no control group
OUTSIDE = 'outside'                  # elsewhere: not the unit's
# Runtimes whose containers a unit may run its server in (the role's inference_service_runtime).
CONTAINER_RUNTIMES = ('docker', 'podman')
CMDLINE_CHARS = 160
# The owner's fields a listener carries (port_owner's RETURN `owners[].owner`): scalars, read off the record.
OWNER_FIELDS = ('kind', 'runtime', 'id', 'unit', 'controlled_by', 'uid')


def verdict(path, group, container_group=None):
    """Pure: the code saying whether a listener whose systemd cgroup is `path` is the unit's,
    given the unit's ControlGroup `group` and its confirmed container's cgroup (or None)."""
    if gpu_owner.within(path, group):
        return IN_UNIT
    if gpu_owner.within(path, container_group):
        return UNIT_CONTAINER
    return OUTSIDE if group or container_group else NO_UNIT


def unit_container(runtime, container_id, unified, timeout=10):
    """The unit's own container as its runtime confirms it: {id, pid, cgroup}, or {id, error}
    naming what did not confirm it (the runtime's inspect did not answer, it does not run, its
    init runs in another cgroup)."""
    owner = gpu_owner.new_owner(gpu_owner.CONTAINER, runtime=runtime, id=container_id)
    details = gpu_observe.runtime_details(owner, timeout=timeout)
    argv = ' '.join(gpu_lever.runtime_argv(runtime, 'inspect', owner) or [runtime])
    if not details or details.get('cli_error'):
        return {'id': container_id,
                'error': '`%s` gave nothing (no such container, or the CLI missing, failing or not answering '
                         'within %ss)' % (argv, timeout)}
    pid = details.get('pid')
    if not pid:
        return {'id': container_id, 'error': '`%s`: it does not run (no init PID)' % argv}
    init = details.get('init_cgroup')
    if not init:
        return {'id': container_id, 'pid': pid, 'error': 'its init PID %d is gone or unreadable' % pid}
    if not gpu_trust.confirm(owner, runtimes={(runtime, container_id): details}):
        return {'id': container_id, 'pid': pid,
                'error': 'its init PID %d runs in %s, not in that container' % (
                    pid, escape_text(gpu_owner.systemd_path(init, unified)))}
    return {'id': container_id, 'pid': pid, 'cgroup': gpu_owner.systemd_path(init, unified)}


def label(entry):
    """'PID 4242 (uid 1000, python3 squat.py, cgroup /user.slice/...)', users' text escaped."""
    return 'PID %d (uid %s, %s, cgroup %s)' % (
        entry['pid'], entry['uid'], escape_text(entry['cmdline'][:CMDLINE_CHARS]), escape_text(entry['cgroup']))


def listeners(port, host, unit=None, container=None, proc='/proc', timeout=10):
    """What listens on host:port: {port, host, listening, owners: [...], unit, unit_cgroup,
    container, unreadable}. `container`: (runtime, full container ID) of the unit's own
    container, or None. `listening` with no owners: a socket this host cannot tie to a process
    it sees (another PID namespace, or /proc/PID/fd it may not read: see `unreadable`)."""
    inodes = gpu_observe.tcp_listeners(port, host, proc)
    group = gpu_observe.unit_restart_policy(unit, timeout).control_group if unit else None
    unified = gpu_observe.unified_cgroup()
    own = unit_container(container[0], container[1], unified, timeout) if container else None
    procs, unreadable = gpu_observe.scan_processes(sorted(inodes), proc=proc) if inodes else ({}, [])
    owners = []
    for pid in sorted(procs):
        info = procs[pid]
        path = gpu_owner.systemd_path(info.cgroup, unified)
        uids = None
        for hierarchy in (('', 'name=systemd') if unified else ('name=systemd', '')):
            uids = (info.cgroup_uids or {}).get((hierarchy, path))
            if uids is not None:
                break
        owned = gpu_owner.owner_from_cgroup(info.cgroup, info.cgroup_uids)
        code = verdict(path, group, (own or {}).get('cgroup'))
        entry = {'pid': pid, 'start_time': info.start_time, 'uid': info.uid, 'user': info.user,
                 'name': info.name, 'cmdline': info.cmdline or info.name,
                 'unit': gpu_owner.root_named_unit(path, uids), 'cgroup': path,
                 'in_unit': code == IN_UNIT, 'in_container': code == UNIT_CONTAINER, 'reason_code': code,
                 'owner': dict((key, getattr(owned, key)) for key in OWNER_FIELDS)}
        entry['label'] = label(entry)
        owners.append(entry)
    return {'port': port, 'host': host, 'listening': bool(inodes), 'owners': owners, 'unit': unit,
            'unit_cgroup': group, 'container': own,
            'unreadable': ['PID %s: %s %s' % item for item in unreadable]}
