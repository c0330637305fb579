# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The system unit family (gpu_family): a service of the system's systemd manager.

- recognise: gpu_owner's generic systemd layout (the innermost service root named);
- facts: `systemctl show` (gpu_observe.unit_restart_policy: Restart=, ActiveState, ControlGroup),
  read anew at every survey (a stopped unit must show as stopped);
- lever: `systemctl stop` (gpu_lever.unit_lever), only where root named the cgroup and systemd
  confirmed the unit (gpu_trust.STOP_UNIT), never a protected unit;
- pull: the Lever's `systemctl stop --no-block` through the actor, then is-active polled through
  the actor's wait, bounded by the grace (gpu_family.stop_unit);
- comeback: a stopped unit's Restart= brings nothing back; it is remembered
  (gpu_respawn.Comebacks.units).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family as family
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner


class SystemUnit(family.UnitOwned):

    name = 'system_unit'
    kinds = (gpu_owner.SERVICE,)
    store = 'units'
    manager = gpu_owner.SYSTEM_MANAGER

    def owns(self, owner):
        return owner.manager == gpu_owner.SYSTEM_MANAGER and (owner.unit or '').endswith('.service')

    def facts_key(self, owner):
        return owner.unit if self.owns(owner) else None

    @staticmethod
    def facts(owner, timeout):
        return observe.unit_restart_policy(owner.unit)

    def lever(self, holder, context):
        return lever.unit_lever(holder, context.protected_units, context.vendor_units,
                                is_protected=context.is_protected)

    def pull(self, chosen, owned, ladder):
        return family.stop_unit(ladder.actor, chosen.argv, self.manager, chosen.key, ladder.grace())

    def phrase(self, chosen):
        return 'stop_unit', chosen.key, {'unit': chosen.key}


FAMILY = SystemUnit()
