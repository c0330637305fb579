# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Owner: what owns a process (a unit, a container, a Kubernetes pod, a guest), from the text
of /proc/PID/cgroup, and how each container runtime is reached from the command line.

The trust boundary starts here: a cgroup's name is chosen by whoever may write its parent
directory. A name in a user's delegated subtree (below user@UID.service, Delegate=yes, owned by
the user in the v2 and name=systemd hierarchies) or below any directory root does not own is
the user's text: it never makes a pod, a container, a guest or a system unit. Such a process
is the kind 'user' (`controlled_by` 'user', or 'unknown' where the owners could not be read),
and its innermost unit name is a candidate for that user's own manager only. gpu_trust
decides which levers an owner allows.

Pure: parsing only. What is here is generic: systemd's units, scopes, slices and users'
subtrees, the owner record (`Owner`, made by new_owner) and the trust rule. A container runtime's, a guest's
and a pod's cgroup layout is its family's (gpu_family_container, _guest, _pod: `recognise`),
handed to RECOGNISERS by gpu_families, so a new runtime touches its family module, not this
one. Which command reaches a runtime (inspect, stop) is a row of gpu_lever's table; running it
is observation (gpu_observe.runtime_details) or action (a family's pull, through gpu_act).

Where each cgroup layout comes from is cited beside a real path in the tests: systemd's and the
walk's in tests/unit/plugins/module_utils/test_gpu_owner.py, each runtime's, guest's and pod's in
its family's test_gpu_family_container.py, _guest.py, _pod.py.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import json
import re

from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text

# Kinds of owner, from the outside in: a Kubernetes pod is never touched; a container can be
# stopped through its runtime; a guest (LXC, Proxmox, nspawn) has its own init and services;
# a service, session or other scope is a systemd unit of this host.
# 'user': a cgroup a local user controls (see the module doc): never a root lever.
POD, CONTAINER, GUEST, USER, SERVICE, SESSION, SCOPE, NONE = (
    'pod', 'container', 'guest', 'user', 'service', 'session', 'scope', 'none')
# A process supervisor's program (gpu_supervisor): never read from a cgroup, only from the
# holder's ancestry (gpu_family_supervisor.Supervisor.recognise_all); it ranks after container
# and guest, before service.
SUPERVISOR = 'supervisor'
# Why an owner's CLI (a runtime's, a supervisor's) gave no answer: `cli_error` {'code', 'text'}.
CLI_MISSING, CLI_TIMEOUT, CLI_FAILED = 'cli_missing', 'cli_timeout', 'cli_failed'
# Who chose the names of an owner's cgroup: root alone, a user (`uid`), or unknown (a
# directory that could not be read, a path outside this cgroup namespace).
ROOT, BY_USER, UNKNOWN = 'root', 'user', 'unknown'
# Whose systemd manager a unit belongs to.
SYSTEM_MANAGER, USER_MANAGER = 'system', 'user'

_SESSION_SCOPE = re.compile(r'^session-[^/]+\.scope$')
_USER_MANAGER = re.compile(r'^user@(\d+)\.service$')
# systemd's unit-name grammar (unit_name_is_valid, src/basic/unit-name.c) for the two unit types
# that own processes: [A-Za-z0-9:_.\-] in the prefix, one optional non-empty @instance, at most
# 255 characters. Nothing else, no glob character (`*?[]`), ever reaches systemctl.
_VALID_UNIT = re.compile(r'^[A-Za-z0-9:_.\\-]+(?:@[A-Za-z0-9:_.\\-]+)?\.(?:service|scope)$')
UNIT_NAME_MAX = 255

# The owner families' recognisers (gpu_family.Family.recognise: a container runtime's, a
# guest's, a pod's layout), handed over by gpu_families, in its ladder order: each (parts root
# named, index, path) -> an owner (new_owner) or None, asked at each part root named, outermost
# first. What is left here is generic: systemd's units, scopes, slices and users' subtrees.
RECOGNISERS = []


# The fields of an owner, in the order a result's `owner` has them (as_result; gpu_holders' and
# gpu_reclaim's RETURN document each):
# kind (POD, CONTAINER, GUEST, USER, SUPERVISOR, SERVICE, SESSION, SCOPE, NONE);
# runtime (the container runtime, guest manager or supervisor row; 'systemd' for a unit);
# id (a container's or guest's id, a supervised program's), name (its readable name),
# namespace (containerd's); unit (the innermost service or scope), guest_unit (the unit inside
# a guest); pod ({namespace, name, uid} of a Kubernetes pod); restart_policy (a container's);
# cgroup (the path it was read from); controlled_by (ROOT, BY_USER, UNKNOWN) and uid: who
# chose the cgroup's names; manager: whose systemd manager `unit` is (SYSTEM_MANAGER,
# USER_MANAGER, None); confirmed: whether that manager or the container's runtime confirmed
# that it owns this cgroup (gpu_trust.confirm; None until asked); supervisor: a process
# supervisor's facts (kind SUPERVISOR, gpu_supervisor: pid, start_time, program_pid, service,
# conf, home, uid); cli_error: {'code': CLI_MISSING, CLI_TIMEOUT or CLI_FAILED, 'text'} when
# the owner's CLI was asked and gave no answer.
FIELDS = ('kind', 'runtime', 'id', 'name', 'namespace', 'unit', 'guest_unit', 'pod', 'restart_policy',
          'cgroup', 'controlled_by', 'uid', 'manager', 'confirmed', 'supervisor', 'cli_error')
# Where a new owner's fields start: its kind and cgroup are new_owner's arguments.
_DEFAULTS = dict((field, None) for field in FIELDS)
_DEFAULTS['controlled_by'] = ROOT


class Owner(collections.namedtuple('Owner', FIELDS)):
    """What owns a process, a typed record (a namedtuple, like gpu_holder.Holder): FIELDS says
    what each field is. No field can be set: a changed owner is a new record (`_replace`), so
    an owner a built holder carries is never changed under it."""

    __slots__ = ()

    def as_result(self):
        """The dict a module result carries (gpu_holders' and gpu_reclaim's RETURN
        `holders[].owner`), every field, in FIELDS order; `pod`, `supervisor` and `cli_error`
        stay dicts (copies: a result changed later never reaches the record)."""
        return dict((field, dict(value) if isinstance(value, dict) else value)
                    for field, value in zip(FIELDS, self))


def new_owner(kind, cgroup=None, **fields):
    """An Owner with every field present: `fields` as given, the others None
    (`controlled_by` ROOT). A name outside FIELDS is a TypeError naming it."""
    values = dict(_DEFAULTS, kind=kind, cgroup=cgroup)
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise TypeError('new_owner: no owner field %s (the fields: %s)' % (', '.join(unknown), ', '.join(FIELDS)))
    values.update(fields)
    return Owner(**values)


def valid_unit_name(name):
    """True when `name` is a service or scope name by systemd's grammar (no glob characters)."""
    return bool(name) and len(name) <= UNIT_NAME_MAX and bool(_VALID_UNIT.match(name))


def cgroup_entries(text):
    """(hierarchy, path) of each line of /proc/PID/cgroup: hierarchy '' for cgroup v2,
    'name=systemd', or the v1 controllers ('cpu,cpuacct'); '/' and empty paths left out, the
    v2 one first, then name=systemd, then the controllers."""
    unified, named, controllers = [], [], []
    for line in (text or '').splitlines():
        parts = line.split(':', 2)
        if len(parts) != 3 or parts[2] in ('', '/'):
            continue
        if parts[0] == '0' and parts[1] == '':
            unified.append(('', parts[2]))
        elif parts[1] == 'name=systemd':
            named.append((parts[1], parts[2]))
        else:
            controllers.append((parts[1], parts[2]))
    return unified + named + controllers


def path_parts(path):
    return [p for p in path.split('/') if p]


def named_by_root(parts, uids=None):
    """(n, uid): the first n components of a cgroup path were named by root; the one after is
    named by user `uid` (None: unknown). A component's name is chosen by whoever may write its
    parent directory: a user's manager (user@UID.service) and any directory root does not own
    hand their children's names to that user.

    `uids` lists the owner of the hierarchy's root directory and of each component's directory
    (None where it could not be read), as gpu_observe.cgroup_dir_uids reads them; without it
    only the user@UID.service rule applies (a pure parse, e.g. of an ancestor's cgroup).
    """
    for index, part in enumerate(parts):
        if part in ('.', '..'):
            return index, None   # outside this cgroup namespace: nothing here names it
        if index > 0:
            found = _USER_MANAGER.match(parts[index - 1])
            if found:
                return index, int(found.group(1))
        if uids is not None:
            parent = uids[index] if index < len(uids) else None
            if parent != 0:
                return index, parent
    return len(parts), None


def cgroup_paths(text):
    """The paths of /proc/PID/cgroup, the cgroup v2 one first, then name=systemd, then the v1
    controllers; '/' and duplicates left out."""
    seen, paths = set(), []
    for _hierarchy, path in cgroup_entries(text):
        if path not in seen:
            seen.add(path)
            paths.append(path)
    return paths


def systemd_path(text, unified):
    """The cgroup path systemd keeps a process in, from its /proc/PID/cgroup text: the v2 line
    on a `unified` host (cgroup2 mounted at /sys/fs/cgroup, gpu_observe.unified_cgroup), else
    the name=systemd line (a hybrid host), else the v2 one; None when neither is there.

    A node booted with its own v2 tree under systemd-nspawn on a hybrid host reads
    'N:name=systemd:/' for every process (the outer host's hierarchy): there that line says
    nothing about where this node's systemd keeps it (measured on a lab container node)."""
    paths = {}
    for line in (text or '').splitlines():
        parts = line.split(':', 2)
        if len(parts) == 3 and parts[1] in ('', 'name=systemd'):
            paths.setdefault(parts[1], parts[2])
    first, second = ('', 'name=systemd') if unified else ('name=systemd', '')
    return paths.get(first, paths.get(second))


def root_named_unit(path, uids=None):
    """The innermost service or scope among the components of a cgroup path that root named
    (named_by_root), or None: inside a user's delegated subtree that is her user@UID.service,
    never a name she chose below it (`sglang.service` included)."""
    parts = path_parts(path or '')
    trusted = named_by_root(parts, uids)[0]
    for part in reversed(parts[:trusted]):
        if part.endswith(('.service', '.scope')):
            return part if valid_unit_name(part) else None
    return None


def within(path, group):
    """True when cgroup `path` is `group` or below it (a unit's ControlGroup)."""
    return bool(group and path) and (path == group or path.startswith(group.rstrip('/') + '/'))


def _unit_in(parts):
    """(kind, unit) of the innermost systemd unit among path components."""
    for index in range(len(parts) - 1, -1, -1):
        part = parts[index]
        if part.endswith('.service'):
            # A unit under user@UID.service is the user's manager's, not the system's.
            managed_by_user = any(_USER_MANAGER.match(p) for p in parts[:index])
            return (SCOPE if managed_by_user else SERVICE), part
        if part.endswith('.scope'):
            return (SESSION if _SESSION_SCOPE.match(part) else SCOPE), part
    return NONE, None


def inner_unit(parts):
    """The innermost systemd unit among path components (a guest's or a container's own), or None."""
    return _unit_in(parts)[1]


def owner_from_path(path, uids=None):
    """The owner that a single cgroup path names, outermost first: a pod, a container or a
    guest found in the part of the path root named owns everything below it (a docker
    container inside an LXC guest belongs to the guest, as far as this host can reach it).
    Below where a user names the cgroups (named_by_root), the owner is that user's."""
    parts = path_parts(path)
    trusted, uid = named_by_root(parts, uids)
    if not RECOGNISERS:
        # Without the families' layouts a container's scope would read as a plain scope here.
        raise RuntimeError('no owner family recognisers: gpu_families was not imported')
    for index in range(trusted):
        for recognise in RECOGNISERS:
            owner = recognise(parts[:trusted], index, path)
            if owner:
                return owner
    if trusted < len(parts):
        return _user_owner(parts[trusted:], uid, path)
    kind, unit = _unit_in(parts)
    if unit and not valid_unit_name(unit):
        kind, unit = NONE, None
    return new_owner(kind, path, unit=unit, runtime='systemd' if unit else None,
                     manager=SYSTEM_MANAGER if unit else None)


def _user_owner(user_parts, uid, path):
    """A cgroup a user named: its innermost service or scope that passes systemd's grammar is a
    candidate unit of that user's manager (when the user is known), nothing more."""
    unit = None
    for part in reversed(user_parts):
        if part.endswith(('.service', '.scope')):
            unit = part if valid_unit_name(part) else None
            break
    known = uid is not None
    return new_owner(USER, path, unit=unit if known else None, uid=uid,
                     controlled_by=BY_USER if known else UNKNOWN,
                     manager=USER_MANAGER if known and unit else None)


_RANK = {POD: 0, CONTAINER: 1, GUEST: 2, USER: 3, SUPERVISOR: 4, SERVICE: 4, SESSION: 5, SCOPE: 6, NONE: 7}


def owner_from_cgroup(text, dir_uids=None):
    """The owner of a process from the text of its /proc/PID/cgroup (v1, v2 or hybrid).

    Every path is read: on a cgroup v1 host the container may show in the controllers' paths
    only, and a pod anywhere root named makes the process the kubelet's. A path a user named
    in any hierarchy ranks before every unit: the user's text never makes a system unit.

    `dir_uids` maps (hierarchy, path) to the owners of its directories
    (gpu_observe.cgroup_dir_uids); a path without an entry is judged by the user@UID rule alone.
    """
    dir_uids = dir_uids or {}
    owners, seen = [], set()
    for hierarchy, path in cgroup_entries(text):
        uids = dir_uids.get((hierarchy, path))
        key = (path, tuple(uids) if uids is not None else None)
        if key not in seen:
            seen.add(key)
            owners.append(owner_from_path(path, uids))
    if not owners:
        return new_owner(NONE)
    # A path a user named, in any hierarchy, makes the process hers whatever the others say;
    # a path whose names could not be read ranks with her kind, after pods, containers, guests.
    return sorted(owners, key=lambda o: (o.controlled_by != BY_USER, _RANK[o.kind]))[0]


# ---------------------------------------------------------------------------------------------
# The runtimes' CLIs: argv from the table, and their output read into named fields
# ---------------------------------------------------------------------------------------------

def parse_inspect(style, text):
    """Details from a runtime's inspect output: name, restart_policy and, for a container of a
    Kubernetes pod, pod {namespace, name, uid}. Empty dict when the output is not understood."""
    try:
        if style == 'docker':
            return _parse_docker(json.loads(text))
        if style == 'crictl':
            return _parse_crictl(json.loads(text))
    except (ValueError, TypeError, AttributeError, IndexError, KeyError):
        return {}
    if style == 'pct':
        return _parse_pct(text)
    return {}


def _pod_from_labels(labels):
    labels = labels or {}
    if 'io.kubernetes.pod.name' not in labels:
        return None
    return {'namespace': labels.get('io.kubernetes.pod.namespace'),
            'name': labels.get('io.kubernetes.pod.name'),
            'uid': labels.get('io.kubernetes.pod.uid')}


def _parse_docker(data):
    # docker, podman and nerdctl print a list with one object per container asked for.
    entry = data[0] if isinstance(data, list) else data
    policy = ((entry.get('HostConfig') or {}).get('RestartPolicy') or {}).get('Name') or None
    details = {'name': (entry.get('Name') or '').lstrip('/') or None, 'restart_policy': policy}
    pid = (entry.get('State') or {}).get('Pid')
    if isinstance(pid, int) and pid > 0:
        details['pid'] = pid      # the container's init, as the host sees it
    pod = _pod_from_labels((entry.get('Config') or {}).get('Labels'))
    if pod:
        details['pod'] = pod
    return details


def _parse_crictl(data):
    status = data.get('status') or {}
    details = {'name': (status.get('metadata') or {}).get('name')}
    pid = (data.get('info') or {}).get('pid')
    if isinstance(pid, int) and pid > 0:
        details['pid'] = pid
    pod = _pod_from_labels(status.get('labels'))
    if pod:
        details['pod'] = pod
    return details


def _parse_pct(text):
    for line in text.splitlines():
        key, _sep, value = line.partition(':')
        if key.strip() == 'hostname' and value.strip():
            return {'name': value.strip()}
    return {}


def describe(owner):
    """A short phrase naming the owner (an Owner), for messages: 'podman container sglang
    (3f2a1b0c4d5e)'. Names that users or runtimes chose are escaped (gpu_text.escape_text)."""
    kind = owner.kind
    if kind == SUPERVISOR:
        # 'supervisord program worker (supervisor PID 40, supervisor.service)'
        sup = owner.supervisor or {}
        what = escape_text(owner.name) or 'with PID %s' % sup.get('program_pid')
        unit = ', %s' % escape_text(owner.unit) if owner.unit else ''
        return '%s program %s (supervisor PID %s%s)' % (owner.runtime, what, sup.get('pid'), unit)
    short = escape_text((owner.id or '')[:12])
    name = escape_text(owner.name)
    if kind == POD:
        pod = owner.pod or {}
        if pod.get('name'):
            return 'Kubernetes pod %s/%s (uid %s)' % (
                escape_text(pod.get('namespace')), escape_text(pod['name']), escape_text(pod.get('uid')))
        return 'Kubernetes pod uid %s' % (escape_text(pod.get('uid')) or 'unknown')
    if kind == CONTAINER:
        named = '%s (%s)' % (name, short) if name else short
        return '%s container %s' % (owner.runtime, named)
    if kind == GUEST:
        label = {'proxmox': 'Proxmox guest', 'lxc': 'LXC guest',
                 'systemd-nspawn': 'systemd-nspawn guest'}.get(owner.runtime, 'guest')
        if owner.runtime == 'proxmox':
            ident = escape_text(owner.id) + (' (%s)' % name if name else '')
        else:
            ident = escape_text(owner.id or owner.name) or '(unnamed, cgroup %s)' % escape_text(owner.cgroup)
        inside = ', unit %s inside it' % escape_text(owner.guest_unit) if owner.guest_unit else ''
        return '%s %s%s' % (label, ident, inside)
    if kind == USER:
        who = 'user %d' % owner.uid if owner.uid is not None else 'a user'
        unit = ' (unit %s of that user\'s manager)' % owner.unit if owner.unit else ''
        return 'a cgroup %s controls, %s%s' % (who, escape_text(owner.cgroup), unit)
    if owner.unit:
        return '%s %s' % (kind, escape_text(owner.unit))
    return 'no unit or container'
