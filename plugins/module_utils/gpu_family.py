# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Family: what the collection knows about one kind of owner, behind one small interface
(issue 32 item 1).

A family (a system unit, a user's unit, a container runtime, a process supervisor, a guest, a
pod) answers six questions:

- recognise: which owner a process has, from its cgroup path's parts (`recognise`: gpu_families
  hands each family's to gpu_owner.owner_from_path, which knows only systemd's generic layout)
  or from its ancestry (`recognise_all`, after the cgroups and before any holder is built: a
  supervisor);
- facts: what the owner's manager or CLI says about it, read bounded (`facts_key`, `facts`);
- lever: the holder's gpu_lever.Lever, or its refusal code (through gpu_trust);
- pull: the lever pulled through the actor (gpu_act), the outcome judged;
- comeback: what the ladder remembers after the pull, so nothing comes back unseen;
- phrase: the action's step, target and details (the sentence is gpu_say's, by code).

gpu_families holds the ordered list the Ladder walks. A new runtime is a family module of its
own, registered in gpu_families, plus its tests (docs/DEVELOPING.md, "A new runtime").
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act as act
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say

# When the Ladder pulls a family's lever (Family.stage).
OWNERS = 'owners'      # each pass, before the targets are planned; a new survey follows
UNITS = 'units'        # on the pass's targets, right before their signals
BY_HAND = 'by_hand'    # never from here: the lever is a person's (gpu_lever.by_hand)

# What a family's lever is planned with, for one pass: `match` (gpu_patterns), the units and
# containers never stopped, the vendor's units (gpu_backend), the stop's grace in seconds, and
# the rule naming a unit never stopped (gpu_decide.protected_unit, given by the Ladder).
Context = collections.namedtuple('Context', 'match protected_units protected_ids vendor_units grace is_protected')
Context.__new__.__defaults__ = (None,)
# Every command this module runs is bounded; systemctl answers in milliseconds when healthy.
SYSTEMCTL_TIMEOUT_S = 30


class Family(object):
    """One kind of owner. The defaults are a family that recognises nothing of its own, reads
    nothing and has no lever the Ladder pulls."""

    name = None          # a plain name, for messages and registration (gpu_families.register)
    kinds = ()           # the gpu_owner kinds it answers for (owns())
    stage = BY_HAND
    option = None        # the gpu_reclaim option that allows its lever (stop_units, ...)
    ends_holders = False  # a changed pull ends the holders it owns (their GPUs count as ended)
    store = None         # where its facts are kept (Surveyor: 'units', 'user_units', 'runtimes')
    runtime = None       # a runtime family's runtime name (gpu_owner's `runtime`) ...
    row = None           # ... and its gpu_lever.RUNTIMES row, added when registered

    def owns(self, owner):
        """Whether this family answers for `owner` (a gpu_owner record)."""
        return owner.kind in self.kinds

    @staticmethod
    def recognise(parts, index, path):
        """The owner a cgroup path names at its component `index` (gpu_owner.new_owner), or
        None; `parts` are the components root named. Pure."""
        return None

    @staticmethod
    def facts_key(owner):
        """The key of `owner`'s facts in the family's store, or None when there are none."""
        return None

    @staticmethod
    def facts(owner, timeout):
        """What the owner's manager or CLI says about it, bounded by `timeout` seconds."""
        return None

    def lever(self, holder, context):
        """The holder's lever (gpu_lever.Lever): `refusal` None when the Ladder may pull it."""
        return lever.lever(lever.NO_LEVER, refusal=lever.NO_STOP)

    @staticmethod
    def candidate(holder, selected):
        """Whether the Ladder plans this holder's lever: it holds a context on a selected GPU."""
        return bool(set(holder.context_gpus) & selected)

    @staticmethod
    def seen(chosen, watch):
        """Whether the lever was pulled earlier this run and is not pulled again (a container or
        a program is stopped once a run; a unit may be stopped again)."""
        return False

    @staticmethod
    def owned(chosen, planned):
        """The holders the pull of `chosen` ends, of `planned` ((holder, its lever))."""
        return [h for h, one in planned if one.refusal is None and one.key == chosen.key]

    def pull(self, chosen, owned, ladder):
        """Pull `chosen` through ladder.actor: (result, changed), `result` a gpu_say.Said."""
        raise NotImplementedError(self.name)

    @staticmethod
    def comeback(chosen, changed, watch):
        """Remember in `watch` (gpu_respawn.Comebacks) what can bring the owner's holders back."""
        return None

    def phrase(self, chosen):
        """(step, target, details) of the action that records the pull (gpu_act.Action)."""
        return chosen.kind, str(chosen.key), {}


class RuntimeOwned(Family):
    """A family whose owners a runtime knows by ID (a container, a guest, a pod): its facts are
    the runtime's inspect (gpu_observe.runtime_details), asked once per owner and run."""

    store = 'runtimes'

    def facts_key(self, owner):
        return (owner.runtime, owner.id) if self.owns(owner) and owner.id else None

    @staticmethod
    def facts(owner, timeout):
        return observe.runtime_details(owner, timeout)


def unit_down(rc, state):
    """Whether `systemctl is-active`'s (rc, output) says the unit is down: inactive, failed or
    unknown, or any answer but (de)activating or active from a failed call."""
    return state in ('inactive', 'failed', 'unknown') or (rc != 0 and state not in ('deactivating', 'active'))


def stop_unit(actor, argv, manager, unit, timeout, keywords=None, **facts):
    """(result, changed) of a unit's stop on `manager` (gpu_owner.SYSTEM_MANAGER or
    USER_MANAGER): `argv` (the Lever's: `systemctl stop --no-block` queues the stop) run through
    `actor`, then the unit's is-active polled through the actor's wait, bounded by `timeout`,
    instead of blocking for the unit's own TimeoutStopSec (90 s by default). `keywords` run both
    as a user (gpu_observe.user_manager_call's); `facts` (uid) go into the result. The unit
    families' pull, and the stop of gpu_adopt's scope."""
    result, changed = actor.run(argv, SYSTEMCTL_TIMEOUT_S, as_user=keywords)
    if actor.recording:
        return say.step(lever.WOULD_STOP_UNIT, timeout=timeout, **facts), True
    if not changed:
        return say.step(lever.STOP_FAILED, output=result.facts.get('output')), False
    is_active = lever.unit_argv(manager, 'is_active', unit)
    done, waited = actor.wait_until(lambda: unit_down(*observe.unit_state(is_active, SYSTEMCTL_TIMEOUT_S, keywords)),
                                    timeout, max_interval=act.COMMAND_POLL_S)
    if done:
        return say.step(lever.UNIT_STOPPED, waited=waited, **facts), True
    return say.step(lever.UNIT_STOPPING, timeout=timeout), True


class UnitOwned(Family):
    """A family whose owner is a service of a systemd manager (`manager`: the system's, or a
    user's own): its lever is the manager's stop, pulled on the pass's targets right before their
    signals (stop_unit); a stopped unit is remembered (gpu_respawn.Comebacks.units)."""

    manager = None       # gpu_owner.SYSTEM_MANAGER or USER_MANAGER: its gpu_lever.UNITS row
    stage = UNITS
    option = 'stop_units'
    ends_holders = True

    @staticmethod
    def candidate(holder, selected):
        return True    # planned over the pass's targets, which are on the selected GPUs

    @staticmethod
    def comeback(chosen, changed, watch):
        if changed:
            watch.units.add(chosen.key)
