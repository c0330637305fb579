# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An inference server's GPU memory as a progress fact (issue 30 item 1), pure.

A loading server maps its weights, then its KV pool, onto its GPUs: its ranks' memory grows while
its log may stay quiet for minutes (one large shard, a compile step). So the role keeps each
observation's reading of the ranks' memory (MiB that NVML charges to the unit's processes on the
server's GPUs, from gpu_holders) in a small root-owned file of its state dir, and the next
observation compares: memory that grew since the last reading is progress, dated by the
observation that saw it grow.

Why a kept reading and not two reads a bounded interval apart in one run: a progress fact must be
dated across runs. The seeds' stall lasted 8 hours under a timer that runs every few minutes; a
reason that says "GPU memory last grew 7 h 50 min ago" needs the reading of an earlier run, and two
reads in one run would only say "grew or not in the last few seconds" while costing every run a
second NVML survey. A reading belongs to one start of the unit's main process (its PID and
systemd's start time): after a restart the old reading says nothing.

ranks_mib: the ranks' MiB from gpu_holders' holders.
memory_progress: (the kept reading, this observation) -> the reading to keep and the fact.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def _num(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _of_unit(holder, unit, own):
    if holder.get('unit') == unit:
        return True
    owner = holder.get('owner') or {}
    return bool(own) and owner.get('kind') == 'container' and owner.get('id') == own \
        and owner.get('confirmed', True) is True


def ranks_mib(holders, gpus, unit, own=''):
    """MiB that NVML charges to the unit's processes (or its own container's) on `gpus` (str
    indices), summed: 0 while none holds a context yet (a loading server's ranks import before
    they map anything)."""
    wanted = set(str(g) for g in gpus or [])
    total = 0
    for holder in holders or []:
        if not isinstance(holder, dict) or not _of_unit(holder, unit, own):
            continue
        for gpu, mib in (holder.get('gpu_memory_mib') or {}).items():
            if str(gpu) in wanted and _num(mib) is not None:
                total += int(_num(mib))
    return total


def _main(observed):
    """The unit's main process as a reading's key: [MainPID, systemd's start of it (monotonic µs)]."""
    unit = (observed or {}).get('unit') or {}
    pid, start = unit.get('MainPID'), unit.get('ExecMainStartTimestampMonotonic')
    if not pid or not start:
        return None
    return [int(pid), int(start)]


def _now(observed):
    """The node's clock at the observation: wait_healthy.py reads start_epoch as time.time() - age_s."""
    unit = (observed or {}).get('unit') or {}
    start, age = _num(unit.get('start_epoch')), _num(unit.get('age_s'))
    return None if start is None or age is None else start + age


def memory_progress(previous, observed, mib):
    """Compare this observation's ranks' MiB with the kept reading.

    previous: the reading kept by the last observation ({main, mib, seen_epoch, grew_epoch}) or
        None. observed: wait_healthy.py's observation (its unit's MainPID, start and clock).
        mib: ranks_mib's total now, or None.
    Returns {'keep': the reading to keep (None: keep nothing), 'fact': {mib, previous_mib,
    since_s (seconds since the kept reading), grew_age_s (seconds since the memory was last seen
    growing; None when never seen growing)} or None}."""
    main, now = _main(observed), _now(observed)
    if main is None or now is None or mib is None:
        return {'keep': None, 'fact': None}
    same = isinstance(previous, dict) and previous.get('main') == main and _num(previous.get('mib')) is not None \
        and _num(previous.get('seen_epoch')) is not None
    grew_epoch = None
    if same:
        grew_epoch = _num(previous.get('grew_epoch'))
        if mib > _num(previous['mib']):
            grew_epoch = now
    keep = {'main': main, 'mib': int(mib), 'seen_epoch': round(now, 3),
            'grew_epoch': None if grew_epoch is None else round(grew_epoch, 3)}
    fact = {'mib': int(mib), 'previous_mib': int(_num(previous['mib'])) if same else None,
            'since_s': round(max(0.0, now - _num(previous['seen_epoch'])), 1) if same else None,
            'grew_age_s': None if grew_epoch is None else round(max(0.0, now - grew_epoch), 1)}
    return {'keep': keep, 'fact': fact}
