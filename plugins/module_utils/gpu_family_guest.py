# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guest family (gpu_family): an LXC, Proxmox or systemd-nspawn guest, a whole operating
system with its own init and services.

- recognise: its cgroup layouts (`recognise`: lxc.payload.NAME, lxc/NAME, machine-NAME.scope,
  systemd-nspawn@NAME.service, payload);
- facts: the runtime's own CLI where it has one (`pct config`; gpu_observe.runtime_details);
- lever: none from here: a person stops the unit inside the guest, or the guest
  (gpu_lever.by_hand: STOP_GUEST_UNIT, STOP_BY_HAND); the ladder signals its holders;
- comeback: the guest's own systemd (WATCH_GUEST): after a kill the GPUs are polled for the
  unit's comeback (watch_comeback; gpu_respawn.Comebacks.guest_units), and a GPU such a unit's
  holder has open reads as not free (claimed).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act as act
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family as family
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say

_LXC_PAYLOAD = re.compile(r'^lxc\.payload[.-](.+)$')
_NSPAWN_SCOPE = re.compile(r'^machine-(.+)\.scope$')
_NSPAWN_SERVICE = re.compile(r'^systemd-nspawn@(.+)\.service$')

# How long the ladder watches for a guest's systemd to restart what it killed from the host:
# systemd's default RestartSec is 100 ms; the rest covers a slow start of the new process.
GUEST_RESPAWN_WATCH_S = 5.0


class Guest(family.RuntimeOwned):

    name = 'guest'
    kinds = (gpu_owner.GUEST,)

    @staticmethod
    def recognise(parts, index, path):
        part = parts[index]
        # What lies below the guest's cgroup is the guest's own (its root names it): read in full.
        rest = gpu_owner.path_parts(path)[index + 1:]
        found = _LXC_PAYLOAD.match(part)
        if found:
            return _lxc_guest(found.group(1), rest, path)
        if part in ('lxc', 'lxc.payload') and rest:
            return _lxc_guest(rest[0], rest[1:], path)
        found = _NSPAWN_SCOPE.match(part) or _NSPAWN_SERVICE.match(part)
        if found and not part.startswith('machine-qemu'):
            inner = rest[1:] if rest[:1] == ['payload'] else rest
            return gpu_owner.new_owner(gpu_owner.GUEST, path, runtime='systemd-nspawn',
                                       id=_unescape_systemd(found.group(1)), unit=part,
                                       manager=gpu_owner.SYSTEM_MANAGER, guest_unit=gpu_owner.inner_unit(inner))
        if part == 'payload':
            # systemd-nspawn --keep-unit splits the cgroup it was started in into "payload" (the
            # guest's tree) and "supervisor" (itself): below the root when started outside any
            # unit, below a session scope or a service on a systemd host, below whatever cgroup
            # its starter made for it. A guest without a name this host could look up; the units
            # above it are this host's, the ones below it the guest's (never stopped from here).
            return gpu_owner.new_owner(gpu_owner.GUEST, path, runtime='systemd-nspawn',
                                       guest_unit=gpu_owner.inner_unit(rest))
        return None

    def lever(self, holder, context):
        return lever.by_hand(holder) or lever.lever(lever.STOP_BY_HAND, refusal=lever.NO_STOP)

    @staticmethod
    def key(holder):
        """(guest cgroup, unit) of a holder a guest's own systemd service runs, or None."""
        return lever.guest_unit(holder)


FAMILY = Guest()


def _lxc_guest(name, rest, path):
    # Proxmox names a guest by its numeric VMID and puts the guest's own tree in "ns"
    # (lxc.cgroup.dir.container.inner); plain LXC and LXD/Incus use the container name.
    inner = rest[1:] if rest[:1] == ['ns'] else rest
    runtime = 'proxmox' if name.isdigit() else 'lxc'
    return gpu_owner.new_owner(gpu_owner.GUEST, path, runtime=runtime, id=name, name=None if name.isdigit() else name,
                               guest_unit=gpu_owner.inner_unit(inner))


def _unescape_systemd(text):
    """machine-<name>.scope escapes '-' in the name as \\x2d. Only printable ASCII is
    unescaped: \\x0a or \\x1b stays as written, never a control character."""
    def unescape(found):
        code = int(found.group(1), 16)
        return chr(code) if 0x20 < code < 0x7f else found.group(0)
    return re.sub(r'\\x([0-9a-f]{2})', unescape, text)


def claimed(survey, units):
    """The survey, with every selected GPU that a holder of a guest unit seen restarting
    (`units`) has open read as not free, whatever its memory reads at that instant: the
    restarted server opens the device before it takes its memory (a real one loads its weights
    first). The soak's guest trials (seed 3005: 6, 43, 78) saw the comeback 0.2 s after the kill
    with its GPU still reading free, and the failure named only another GPU's protected holder."""
    if not units:
        return survey
    held = set(g for h in survey.holders_of_selected() if lever.guest_unit(h) in units for g in h.gpus)
    for row in survey.rows:
        if row['index'] in held:
            row['free'] = False
    return survey


def watch_comeback(ladder, survey):
    """After the ladder killed processes of a guest's service from its host, watch for the
    guest's own systemd to start them again (this host can neither see nor stop that unit):
    poll the GPUs for up to GUEST_RESPAWN_WATCH_S for a holder of one of those units, and return
    the survey that shows the comeback, or the last one."""
    watch = ladder.watch
    units, watch.guest_pending = watch.guest_pending, set()
    if not units or ladder.actor.recording:
        return survey
    seen = {'survey': survey}

    def came_back():
        seen['survey'] = ladder.look()
        return any(lever.guest_unit(h) in units for h in seen['survey'].holders_of_selected())

    since = ladder.clock()
    back, waited = ladder.actor.wait_until(came_back, GUEST_RESPAWN_WATCH_S)
    watched = sorted(u[1] for u in units)
    if not back:
        ladder.record(act.Action('watch_respawn', ', '.join(watched), say.step(lever.GUEST_NOT_BACK, waited=waited),
                                 False, guest_units=watched), since)
        return seen['survey']
    again = [h for h in seen['survey'].holders_of_selected() if lever.guest_unit(h) in units]
    watch.guest_units |= set(lever.guest_unit(h) for h in again)
    claimed(seen['survey'], watch.guest_units)
    ladder.record(act.Action('watch_respawn', ', '.join(watched),
                             say.step(lever.GUEST_BACK, waited=waited, holders=again),
                             False, guest_units=watched), since)
    return seen['survey']
