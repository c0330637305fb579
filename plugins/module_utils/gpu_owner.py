# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Owner: what owns a process (a unit, a container, a Kubernetes pod, a guest), from the text
of /proc/PID/cgroup, and how each container runtime is reached from the command line.

Pure: parsing and the runtime table only. Running a runtime's CLI is observation
(gpu_observe.runtime_details) or action (gpu_act); both take their argv from RUNTIMES.

Where each cgroup layout comes from is cited in tests/unit/plugins/module_utils/test_gpu_owner.py
beside a real path.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re

# Kinds of owner, from the outside in: a Kubernetes pod is never touched; a container can be
# stopped through its runtime; a guest (LXC, Proxmox, nspawn) has its own init and services;
# a service, session or other scope is a systemd unit of this host.
POD, CONTAINER, GUEST, SERVICE, SESSION, SCOPE, NONE = (
    'pod', 'container', 'guest', 'service', 'session', 'scope', 'none')

_HEX64 = r'[0-9a-f]{64}'
# <runtime prefix>-<id>.scope: the systemd cgroup driver's name for a container's scope.
_CONTAINER_SCOPE = re.compile(r'^(docker|libpod|cri-containerd|crio|nerdctl)-(%s)\.scope$' % _HEX64)
_SCOPE_RUNTIME = {'docker': 'docker', 'libpod': 'podman', 'cri-containerd': 'cri-containerd',
                  'crio': 'cri-o', 'nerdctl': 'containerd'}
# Runtimes' own helper scopes (conmon): they hold no GPU, and they are not the container.
_MONITOR_SCOPE = re.compile(r'^(?:libpod|crio)-conmon-%s\.scope$' % _HEX64)
_PODMAN_CGROUPFS = re.compile(r'^libpod-(%s)$' % _HEX64)
_BARE_ID = re.compile(r'^(%s)$' % _HEX64)
# kubelet: kubepods[-QOS]-pod<UID with _ for ->.slice (systemd driver), pod<UID> (cgroupfs).
_POD_SLICE = re.compile(r'^kubepods(?:-[a-z]+)?-pod([0-9a-f_]+)\.slice$')
_POD_DIR = re.compile(r'^pod([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$')
_LXC_PAYLOAD = re.compile(r'^lxc\.payload[.-](.+)$')
_NSPAWN_SCOPE = re.compile(r'^machine-(.+)\.scope$')
_NSPAWN_SERVICE = re.compile(r'^systemd-nspawn@(.+)\.service$')
_SESSION_SCOPE = re.compile(r'^session-[^/]+\.scope$')
_USER_MANAGER = re.compile(r'^user@\d+\.service$')

# One row per runtime: the program that reaches it, how to read a container's details
# (`{id}` and `{namespace}` are filled in), how its output is read, and how to stop one.
# `stop` None: this module never stops what the runtime owns (a pod is the kubelet's;
# a guest is a whole operating system).
RUNTIMES = {
    'docker': {
        'cli': 'docker',
        'inspect': ['docker', 'inspect', '--type', 'container', '--', '{id}'],
        'parse': 'docker',
        'stop': ['docker', 'stop', '-t', '{grace}', '--', '{id}'],
    },
    'podman': {
        'cli': 'podman',
        'inspect': ['podman', 'container', 'inspect', '--', '{id}'],
        'parse': 'docker',
        'stop': ['podman', 'stop', '-t', '{grace}', '--', '{id}'],
    },
    'containerd': {
        'cli': 'nerdctl',
        'inspect': ['nerdctl', '--namespace', '{namespace}', 'container', 'inspect', '--', '{id}'],
        'parse': 'docker',
        'stop': ['nerdctl', '--namespace', '{namespace}', 'stop', '-t', '{grace}', '--', '{id}'],
    },
    'cri-containerd': {
        'cli': 'crictl',
        'inspect': ['crictl', 'inspect', '-o', 'json', '{id}'],
        'parse': 'crictl',
        'stop': None,
    },
    'cri-o': {
        'cli': 'crictl',
        'inspect': ['crictl', 'inspect', '-o', 'json', '{id}'],
        'parse': 'crictl',
        'stop': None,
    },
    'proxmox': {
        'cli': 'pct',
        'inspect': ['pct', 'config', '{id}'],
        'parse': 'pct',
        'stop': None,
    },
    'lxc': {'cli': None, 'inspect': None, 'parse': None, 'stop': None},
    'systemd-nspawn': {'cli': None, 'inspect': None, 'parse': None, 'stop': None},
}


def new_owner(kind, cgroup=None, **fields):
    """An owner record with every key present (the RETURN documents them all)."""
    owner = {'kind': kind, 'runtime': None, 'id': None, 'name': None, 'namespace': None,
             'unit': None, 'guest_unit': None, 'pod': None, 'restart_policy': None,
             'cgroup': cgroup}
    owner.update(fields)
    return owner


def cgroup_paths(text):
    """The paths of /proc/PID/cgroup, the cgroup v2 one first, then name=systemd, then the v1
    controllers; '/' and duplicates left out."""
    unified, named, controllers = [], [], []
    for line in (text or '').splitlines():
        parts = line.split(':', 2)
        if len(parts) != 3 or parts[2] in ('', '/'):
            continue
        if parts[0] == '0' and parts[1] == '':
            unified.append(parts[2])
        elif parts[1] == 'name=systemd':
            named.append(parts[2])
        else:
            controllers.append(parts[2])
    seen, paths = set(), []
    for path in unified + named + controllers:
        if path not in seen:
            seen.add(path)
            paths.append(path)
    return paths


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


def _inner_unit(parts):
    return _unit_in(parts)[1]


def _unescape_systemd(text):
    """machine-<name>.scope escapes '-' in the name as \\x2d."""
    return re.sub(r'\\x([0-9a-f]{2})', lambda m: chr(int(m.group(1), 16)), text)


def owner_from_path(path):
    """The owner that a single cgroup path names, outermost first: a pod, a container or a
    guest found in the path owns everything below it (a docker container inside an LXC guest
    belongs to the guest, as far as this host can reach it)."""
    parts = [p for p in path.split('/') if p]
    for index, part in enumerate(parts):
        rest = parts[index + 1:]
        if part == 'kubepods' or part.startswith('kubepods'):
            return _pod_owner(parts, index, path)
        found = _CONTAINER_SCOPE.match(part)
        if found:
            runtime = _SCOPE_RUNTIME[found.group(1)]
            return new_owner(CONTAINER, path, runtime=runtime, id=found.group(2), unit=part,
                             namespace='default' if runtime == 'containerd' else None,
                             guest_unit=_inner_unit(rest))
        if _MONITOR_SCOPE.match(part):
            return new_owner(SCOPE, path, unit=part)
        found = _PODMAN_CGROUPFS.match(part)
        if found:
            return new_owner(CONTAINER, path, runtime='podman', id=found.group(1))
        found = _BARE_ID.match(part)
        if found and index > 0:
            return _cgroupfs_container(parts[index - 1], found.group(1), path)
        guest = _guest_owner(parts, index, path)
        if guest:
            return guest
    kind, unit = _unit_in(parts)
    return new_owner(kind, path, unit=unit, runtime='systemd' if unit else None)


def _cgroupfs_container(parent, container_id, path):
    """A container id directly under its runtime's cgroupfs parent directory."""
    if parent == 'docker':
        return new_owner(CONTAINER, path, runtime='docker', id=container_id)
    if parent == 'libpod_parent':
        return new_owner(CONTAINER, path, runtime='podman', id=container_id)
    # containerd (ctr, nerdctl with the cgroupfs driver) names the parent after its namespace.
    return new_owner(CONTAINER, path, runtime='containerd', id=container_id, namespace=parent)


def _guest_owner(parts, index, path):
    part = parts[index]
    rest = parts[index + 1:]
    found = _LXC_PAYLOAD.match(part)
    if found:
        name = found.group(1)
        return _lxc_guest(name, rest, path)
    if part in ('lxc', 'lxc.payload') and rest:
        return _lxc_guest(rest[0], rest[1:], path)
    found = _NSPAWN_SCOPE.match(part) or _NSPAWN_SERVICE.match(part)
    if found and not part.startswith('machine-qemu'):
        inner = rest[1:] if rest[:1] == ['payload'] else rest
        return new_owner(GUEST, path, runtime='systemd-nspawn', id=_unescape_systemd(found.group(1)),
                         unit=part, guest_unit=_inner_unit(inner))
    if part == 'payload':
        # systemd-nspawn --keep-unit splits the cgroup it was started in into "payload" (the
        # guest's tree) and "supervisor" (itself): below the root when started outside any
        # unit, below a session scope or a service on a systemd host, below whatever cgroup
        # its starter made for it. A guest without a name this host could look up; the units
        # above it are this host's, the ones below it the guest's (never stopped from here).
        return new_owner(GUEST, path, runtime='systemd-nspawn', guest_unit=_inner_unit(rest))
    return None


def _lxc_guest(name, rest, path):
    # Proxmox names a guest by its numeric VMID and puts the guest's own tree in "ns"
    # (lxc.cgroup.dir.container.inner); plain LXC and LXD/Incus use the container name.
    inner = rest[1:] if rest[:1] == ['ns'] else rest
    runtime = 'proxmox' if name.isdigit() else 'lxc'
    return new_owner(GUEST, path, runtime=runtime, id=name, name=None if name.isdigit() else name,
                     guest_unit=_inner_unit(inner))


def _pod_owner(parts, index, path):
    uid, container_id, runtime = None, None, None
    for part in parts[index:]:
        found = _POD_SLICE.match(part)
        if found:
            uid = found.group(1).replace('_', '-')
            continue
        found = _POD_DIR.match(part)
        if found:
            uid = found.group(1)
            continue
        found = _CONTAINER_SCOPE.match(part)
        if found:
            runtime, container_id = _SCOPE_RUNTIME[found.group(1)], found.group(2)
            continue
        found = _BARE_ID.match(part)
        if found:
            container_id = found.group(1)
    return new_owner(POD, path, runtime=runtime, id=container_id,
                     pod={'namespace': None, 'name': None, 'uid': uid})


_RANK = {POD: 0, CONTAINER: 1, GUEST: 2, SERVICE: 3, SESSION: 4, SCOPE: 5, NONE: 6}


def owner_from_cgroup(text):
    """The owner of a process from the text of its /proc/PID/cgroup (v1, v2 or hybrid).

    Every path is read: on a cgroup v1 host the container may show in the controllers' paths
    only, and a pod anywhere makes the process the kubelet's.
    """
    owners = [owner_from_path(path) for path in cgroup_paths(text)]
    if not owners:
        return new_owner(NONE)
    return sorted(owners, key=lambda o: _RANK[o['kind']])[0]


# ---------------------------------------------------------------------------------------------
# The runtimes' CLIs: argv from the table, and their output read into named fields
# ---------------------------------------------------------------------------------------------

def runtime_argv(runtime, action, owner, grace=None):
    """The argv for `action` ('inspect' or 'stop') of `owner` through its runtime, or None when
    the runtime has no such command (a pod is never stopped from here)."""
    row = RUNTIMES.get(runtime)
    template = row.get(action) if row else None
    if not template:
        return None
    values = {'{id}': owner['id'] or '', '{namespace}': owner.get('namespace') or 'default',
              '{grace}': '%d' % max(0, int(round(grace or 0)))}
    return [values.get(arg, arg) for arg in template]


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
    pod = _pod_from_labels((entry.get('Config') or {}).get('Labels'))
    if pod:
        details['pod'] = pod
    return details


def _parse_crictl(data):
    status = data.get('status') or {}
    details = {'name': (status.get('metadata') or {}).get('name')}
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
    """A short phrase naming the owner, for messages: 'podman container sglang (3f2a1b0c4d5e)'."""
    kind = owner['kind']
    short = (owner['id'] or '')[:12]
    if kind == POD:
        pod = owner['pod'] or {}
        if pod.get('name'):
            return 'Kubernetes pod %s/%s (uid %s)' % (pod.get('namespace'), pod['name'], pod.get('uid'))
        return 'Kubernetes pod uid %s' % (pod.get('uid') or 'unknown')
    if kind == CONTAINER:
        named = '%s (%s)' % (owner['name'], short) if owner['name'] else short
        return '%s container %s' % (owner['runtime'], named)
    if kind == GUEST:
        label = {'proxmox': 'Proxmox guest', 'lxc': 'LXC guest',
                 'systemd-nspawn': 'systemd-nspawn guest'}.get(owner['runtime'], 'guest')
        if owner['runtime'] == 'proxmox':
            ident = owner['id'] + (' (%s)' % owner['name'] if owner['name'] else '')
        else:
            ident = owner['id'] or owner['name'] or '(unnamed, cgroup %s)' % owner['cgroup']
        inside = ', unit %s inside it' % owner['guest_unit'] if owner['guest_unit'] else ''
        return '%s %s%s' % (label, ident, inside)
    if owner['unit']:
        return '%s %s' % (kind, owner['unit'])
    return 'no unit or container'
