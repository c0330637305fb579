# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Families: the ordered list of owner families (gpu_family) the Ladder walks, and how another
family joins it.

The order is the ladder's: a container first (its init is reachable no other way, and its
restart policy brings back whatever is killed inside), then a supervisor's program (its
autorestart does the same), then, on the pass's targets right before their signals, the system
manager's units and then users' own; a guest's and a pod's levers are a person's.

The families' cgroup recognisers (a runtime's, a guest's, a pod's layout) are handed to
gpu_owner from here (its RECOGNISERS), so gpu_owner imports no family and knows only systemd's
generic layout.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family_container
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family_guest
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family_pod
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family_supervisor
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family_unit
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family_user_unit
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner

CONTAINER = gpu_family_container.FAMILY
SUPERVISOR = gpu_family_supervisor.FAMILY
SYSTEM_UNIT = gpu_family_unit.FAMILY
USER_UNIT = gpu_family_user_unit.FAMILY
GUEST = gpu_family_guest.FAMILY
POD = gpu_family_pod.FAMILY

LADDER = [CONTAINER, SUPERVISOR, SYSTEM_UNIT, USER_UNIT, GUEST, POD]


def of(owner):
    """The first family in ladder order that answers for `owner`, or None (a scope, a session,
    no owner: the signals are its lever)."""
    for family in LADDER:
        if family.owns(owner):
            return family
    return None


def _hand_recognisers():
    """gpu_owner's recognisers: each family's own (gpu_family.Family.recognise), once, in ladder
    order (their layouts do not overlap: the order only puts a registered family's first)."""
    found = []
    for family in LADDER:
        if family.recognise is not gpu_family.Family.recognise and family.recognise not in found:
            found.append(family.recognise)
    gpu_owner.RECOGNISERS[:] = found


def register(family, before):
    """Add `family` to the ladder before the family named `before`; its runtime row (if any)
    joins gpu_lever.RUNTIMES and its recogniser gpu_owner's. Undone by unregister."""
    index = [f.name for f in LADDER].index(before)
    LADDER.insert(index, family)
    if family.row:
        gpu_lever.RUNTIMES[family.runtime] = family.row
    _hand_recognisers()


def unregister(family):
    LADDER.remove(family)
    if family.row:
        gpu_lever.RUNTIMES.pop(family.runtime, None)
    _hand_recognisers()


# Every module that reads an owner from a cgroup imports this one (gpu_decide, gpu_adopt,
# gpu_listen): gpu_owner refuses to read one before the families' layouts are handed to it.
_hand_recognisers()
