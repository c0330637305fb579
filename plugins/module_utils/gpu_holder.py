# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Holder: one process as the survey classified it, a typed record built once (issue 32 item 2).

gpu_decide.holder_of builds it, with its final owner (the Surveyor resolves owners before
classifying) and its peer GPUs; nothing changes it afterwards (a namedtuple: no field can be
set). What the Ladder learns about a process while it runs (what it froze, what respawned,
what it ended) is the Ladder's, keyed by (pid, start_time), never the holder's.

Clients (processes with only shared nodes open) and the respawners the Ladder describes are
the same record, `kind` 'client' or 'respawner', with `peer_gpus` None: they were never
sorted among the GPUs, and their result has no `peer_gpus` key.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections

# The fields, in the order a result's entry has them (as_result):
# pid, start_time (jiffies since boot: with pid, its identity), name (comm), cmdline, user,
# state (gpu_observe's word: running, sleeping, disk-sleep, stopped, tracing-stop, zombie,
# zombie-leader), wchan, ppid, parent_name;
# unit, unit_restart, unit_active: its system manager's unit (None for any other owner) and
# that unit's Restart= and ActiveState (a user's unit's when its manager is hers);
# gpus (every GPU it holds a node of), context_gpus (those it holds a context on),
# gpu_memory_mib ({str(index): MiB NVML charges to it} or None), evidence (nvml, fd, mmap),
# kind ('context', 'handle', 'client', 'respawner'), other_pid_namespace;
# owner (a gpu_owner.Owner, new_owner's record, final: confirmed, named by its runtime, a
# supervisor's program where one runs it; its result is the record's as_result());
# ignores_sigterm, sigterm_dropped (PID 1 of its own namespace without a SIGTERM handler),
# tracer_pid, tracer_name;
# protected, protected_reason (gpu_say's sentence), protected_code (gpu_lever's code);
# peer_gpus: GPUs it maps peer memory on (gpu_peers), None when it was not classified.
FIELDS = (
    'pid', 'start_time', 'name', 'cmdline', 'user', 'state', 'wchan', 'ppid', 'parent_name',
    'unit', 'unit_restart', 'unit_active', 'gpus', 'context_gpus', 'gpu_memory_mib', 'evidence',
    'kind', 'other_pid_namespace', 'owner', 'ignores_sigterm', 'sigterm_dropped', 'tracer_pid',
    'tracer_name', 'protected', 'protected_reason', 'protected_code', 'peer_gpus',
)


class Holder(collections.namedtuple('Holder', FIELDS)):
    """One process holding a GPU (or a client, or a respawner); FIELDS says what each field is."""

    __slots__ = ()

    # A holder the Ladder leaves has these too (Left); a plain holder has none of them.
    reason = reason_code = lever = respawned = None

    @property
    def key(self):
        """(pid, start_time): the process's identity, what the Ladder keys its own state by."""
        return (self.pid, self.start_time)

    def as_result(self):
        """The dict a module result carries (gpu_holders' RETURN `holders`, gpu_reclaim's
        `holders`, `remaining`, `spared`), its keys in FIELDS order; no `peer_gpus` for a
        process that was not classified."""
        result = dict(zip(FIELDS, self))
        if self.owner is not None:
            result['owner'] = self.owner.as_result()   # the record's one crossing into a result
        if self.peer_gpus is None:
            del result['peer_gpus']
        return result

    def left(self, reason_code, reason, lever=None, respawned=None):
        """This holder as one the Ladder leaves on its GPU (Left), a new record."""
        return Left(*(tuple(self) + (reason, lever, reason_code, respawned)))


# Why a holder is left (gpu_reclaim's RETURN `remaining`): reason (gpu_say's sentence), lever
# (what to do about peer memory, gpu_peers; None otherwise), reason_code (gpu_lever's code; None
# where none is given), respawned (for a respawning ancestor: what it brought back, for the
# failure message; never in a result).
LEFT_FIELDS = ('reason', 'lever', 'reason_code', 'respawned')


class Left(collections.namedtuple('Left', FIELDS + LEFT_FIELDS)):
    """A holder left on its GPU, with why: every Holder field, then LEFT_FIELDS."""

    __slots__ = ()

    key = Holder.key

    def holder(self):
        """The Holder this entry leaves."""
        return Holder(*self[:len(FIELDS)])

    def as_result(self):
        """The `remaining` entry: the holder's result, then `reason`, `lever` (only where
        given) and `reason_code`."""
        result = self.holder().as_result()
        result['reason'] = self.reason
        if self.lever is not None:
            result['lever'] = self.lever
        result['reason_code'] = self.reason_code
        return result
