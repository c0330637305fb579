# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The guest family (gpu_family): an LXC, Proxmox or systemd-nspawn guest, a whole operating
system with its own init and services.

- recognise: gpu_owner (lxc.payload.NAME, lxc/NAME, machine-NAME.scope, payload);
- facts: the runtime's own CLI where it has one (`pct config`; gpu_observe.runtime_details);
- lever: none from here: a person stops the unit inside the guest, or the guest
  (gpu_lever.by_hand: STOP_GUEST_UNIT, STOP_BY_HAND); the ladder signals its holders;
- comeback: the guest's own systemd (WATCH_GUEST): after a kill the GPUs are polled for the
  unit's comeback (`key`; gpu_flow.Ladder watches it, gpu_respawn.Comebacks.guest_units).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family as family
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner


class Guest(family.Family):

    name = 'guest'
    kinds = (gpu_owner.GUEST,)
    store = 'runtimes'

    def facts_key(self, owner):
        return (owner['runtime'], owner['id']) if self.owns(owner) and owner.get('id') else None

    @staticmethod
    def facts(owner, timeout):
        return observe.runtime_details(owner, timeout)

    def lever(self, holder, context):
        return lever.by_hand(holder) or lever.lever(lever.STOP_BY_HAND, refusal=lever.NO_STOP)

    @staticmethod
    def key(holder):
        """(guest cgroup, unit) of a holder a guest's own systemd service runs, or None."""
        return lever.guest_unit(holder)


FAMILY = Guest()
