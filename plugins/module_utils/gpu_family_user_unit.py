# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The user unit family (gpu_family): a service of a user's own systemd manager.

- recognise: gpu_owner's generic layout (the innermost valid service below user@UID.service,
  the user's text);
- facts: `systemctl --user show` as that user (gpu_observe.user_unit_facts);
- lever: `systemctl --user stop` as the user (gpu_lever.user_unit_lever, gpu_trust.STOP_USER_UNIT):
  it can stop nothing she could not stop herself;
- pull: the Lever's `systemctl --user stop --no-block` through the actor as her, through her
  manager's private socket (gpu_observe.user_manager_call), polled like a unit
  (gpu_family.stop_unit);
- comeback: as a system unit's (gpu_respawn.Comebacks.units, keyed (uid, unit)).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family as family
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say


class UserUnit(family.UnitOwned):

    name = 'user_unit'
    kinds = (gpu_owner.USER,)
    store = 'user_units'
    manager = gpu_owner.USER_MANAGER

    @staticmethod
    def owns(owner):
        return owner.manager == gpu_owner.USER_MANAGER

    def facts_key(self, owner):
        if self.owns(owner) and (owner.unit or '').endswith('.service'):
            return owner.uid, owner.unit
        return None

    @staticmethod
    def facts(owner, timeout):
        return observe.user_unit_facts(owner.uid, owner.unit)

    def lever(self, holder, context):
        return lever.user_unit_lever(holder)

    def pull(self, chosen, owned, ladder):
        uid, unit = chosen.key
        call = observe.user_manager_call(uid)
        # Check mode plans the stop whether or not her manager runs now (as it always has).
        if call is None and not ladder.actor.recording:
            return say.step(lever.MANAGER_NOT_RUNNING, uid=uid), False
        return family.stop_unit(ladder.actor, chosen.argv, self.manager, unit, ladder.grace(), call and call[1], uid=uid)

    def phrase(self, chosen):
        uid, unit = chosen.key
        return 'stop_user_unit', unit, {'unit': unit, 'uid': uid}


FAMILY = UserUnit()
