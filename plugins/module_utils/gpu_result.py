# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The result gpu_reclaim returns from a Ladder's run (gpu_flow): the actions with their codes,
the GPUs before and after, and every holder left with its reason code (gpu_say writes the
sentences)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say


def changed(ladder):
    """Something was stopped, signalled or reset (in check mode: would be)."""
    return any(a.changed for a in ladder.actions)


def _common(ladder, first):
    return {
        'changed': changed(ladder),
        'actions': [a.as_result() for a in ladder.actions],
        'before': first.rows,
        'elapsed_s': round(ladder.clock() - ladder.started, 3),
        'holders': [h.as_result() for h in first.holders_of_selected()],
        'backend': first.snapshot.backend,
    }


def interrupted(ladder, first, exc):
    """The result of a run the driver cut short after the ladder acted: what was done so far."""
    result = _common(ladder, first)
    result.update({
        'after': [],
        'free': False,
        'spared': [h.as_result() for h in first.spared],
        'remaining': [],
        'diagnosis': first.diagnosis,
        'msg': say.interrupted(exc, len(ladder.actions)),
    })
    return result


def result(ladder, first, last):
    """gpu_reclaim's result of a run from its `first` survey to its `last`."""
    result = _common(ladder, first)
    remaining = []
    if not last.free:
        targets, left = decide.plan_targets(last.holders, last.selected, ladder.match, last.spared_pids,
                                            ladder.peers)
        remaining = left + [t.left(decide.SURVIVED, say.remaining(decide.SURVIVED)) for t in targets]
        held = set(row['index'] for row in last.rows if not row['free'])
        seen = set(h.pid for h in remaining) | last.spared_pids
        # Handles on a GPU still held block its reset; name them, never signal them. A peer
        # mapper is named with what holds the memory and the lever (peers: true).
        for h in last.holders:
            if h.pid in seen or not set(h.gpus) & held:
                continue
            peer_held = sorted(held & set(h.peer_gpus))
            if peer_held:
                remaining.append(h.left(decide.PEER_MEMORY, say.remaining(decide.PEER_MEMORY, peer_held),
                                        lever=say.peer_lever(h, peer_held[0])))
            else:
                remaining.append(h.left(decide.DEVICE_OPEN, say.remaining(decide.DEVICE_OPEN)))
    remaining += ladder.watch.respawners
    result.update({
        'after': last.rows,
        'free': last.free and not ladder.watch.respawners,
        'spared': [h.as_result() for h in last.spared],
        'remaining': [entry.as_result() for entry in remaining],
        'diagnosis': last.diagnosis,
    })
    if not result['free'] and not ladder.actor.recording:
        result['msg'] = say.failure_message(last.rows, remaining, result['elapsed_s'], ladder.allow_reset,
                                            ladder.watch.respawners, say.blind(ladder.surveyor.access))
    return result
