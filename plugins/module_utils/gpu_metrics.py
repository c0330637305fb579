# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one run of playbooks/reclaim.yml did on a node, as Prometheus metric families (issue 33).

The run_metrics module hands in the run's results (each gpu_reclaim result, the server's state
fact, the failure recorded) and the samples of the file the last run left (prom_text.parse);
`families` returns what to write. Counters go on from the last file, so they never go back
while the file lives; a file that cannot be read back starts them again at zero (a counter
reset, which Prometheus' rate() and increase() handle), and `Carried.code` says which.

Labels come from closed sets only (a GPU index, a lever, a result, a state, a code shaped as
the modules' codes are): never a PID, a command line or a name a node's user chose.

Levers are read from codes (gpu_lever's step codes, each action's `code`), and only where an
action carries none, from its `step`: never from a `result` sentence.

Pure, stdlib only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import re

from ansible_collections.gpuops.reclaim.plugins.module_utils.prom_text import Family

HEADER = 'gpuops.reclaim run metrics (gpuops.reclaim.run_metrics writes this file at every run; do not edit)'
MIB = 1024 * 1024

LEVERS = ('unit', 'runtime', 'supervisor', 'signal')
# The step code (gpu_lever) that says a step ended what it acted on, and the lever it pulled.
ENDED_CODES = {'unit_stopped': 'unit', 'container_stopped': 'runtime', 'supervised_stopped': 'supervisor',
               'exited': 'signal'}
# Without a code (results from before actions carried one): the lever of a step that changed the host.
STEP_LEVERS = {'stop_unit': 'unit', 'stop_user_unit': 'unit', 'stop_container': 'runtime',
               'stop_supervised': 'supervisor', 'sigterm': 'signal', 'sigkill': 'signal'}
SIGNAL_STEPS = ('sigterm', 'sigkill')

RESULTS = ('ok', 'reclaim_failed', 'restart_failed', 'failed')
# The inference_service role's server states (its inference_service_server fact); anything
# else is `unknown`.
SERVER_STATES = ('loading', 'serving', 'stalled', 'restarting', 'stopped', 'failed', 'unknown')
# A code as the modules write them; anything else becomes `other`, so that no label takes
# values without bound.
CODE = re.compile(r'^[a-z][a-z0-9_]{0,47}$')

# How a run found the last file (Carried.code).
CARRIED = 'carried'    # counters go on from the last file
NO_FILE = 'no_file'    # no last file: counters start at 0
CORRUPT = 'corrupt'    # a last file of ours that does not read back: counters start again at 0

COUNTERS = ('gpuops_reclaim_runs_total', 'gpuops_reclaim_ended_total', 'gpuops_reclaim_gpus_freed_total')
STREAK = 'gpuops_gpu_memory_unexplained_runs'


class Carried(object):
    """The last file's samples this run goes on from, and how they were found (`code`, and the
    reason for CORRUPT)."""

    def __init__(self, code, samples=None, why=None):
        self.code = code
        self.samples = samples or {}
        self.why = why


def carried(samples, types):
    """Carried from prom_text.parse's output: CORRUPT when a counter of ours is not a finite
    number at least 0, or is not typed counter (what a run adds to must be a count)."""
    for (name, labels), value in samples.items():
        if name in COUNTERS or name == STREAK:
            if math.isnan(value) or math.isinf(value) or value < 0:
                return Carried(CORRUPT, why='%s%s is %r' % (name, dict(labels), value))
            if name in COUNTERS and types.get(name) != 'counter':
                return Carried(CORRUPT, why='%s is typed %r, not counter' % (name, types.get(name)))
    return Carried(CARRIED, samples)


def code_label(code):
    return code if isinstance(code, str) and CODE.match(code) else 'other'


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) or math.isinf(value) else value


def _results(reclaims):
    return [r for r in reclaims or [] if isinstance(r, dict) and isinstance(r.get('actions'), list)]


def ended(reclaim):
    """{lever: how many processes or owners this gpu_reclaim result ended}.

    A signal step counts its process once (SIGTERM then SIGKILL is one process). A unit,
    container or supervised program stopped counts the holders the first survey found in it
    that are not left (`remaining`) and were not signalled (those count under signal); at
    least 1, the owner itself, where the survey found none in it (a holder respawned there)."""
    counts = dict((lever, 0) for lever in LEVERS)
    actions = [a for a in reclaim.get('actions') or [] if isinstance(a, dict)]
    signalled = set()
    owners = []
    for action in actions:
        step = action.get('step')
        lever = STEP_LEVERS.get(step)
        if lever is None:
            continue
        if 'code' in action:
            if ENDED_CODES.get(action.get('code')) != lever:
                continue
        elif not action.get('changed'):
            continue
        if lever == 'signal':
            if action.get('pid') not in signalled:
                signalled.add(action.get('pid'))
                counts['signal'] += 1
        else:
            owners.append((lever, action))
    left = set(h.get('pid') for h in reclaim.get('remaining') or [] if isinstance(h, dict))
    holders = [h for h in reclaim.get('holders') or [] if isinstance(h, dict)]
    for lever, action in owners:
        inside = set(h.get('pid') for h in holders if _owned_by(h, lever, action))
        counts[lever] += max(1, len(inside - left - signalled))
    return counts


def _owned_by(holder, lever, action):
    owner = holder.get('owner') or {}
    if lever == 'unit':
        return bool(action.get('unit')) and action.get('unit') in (owner.get('unit'), holder.get('unit'))
    if lever == 'runtime':
        return bool(action.get('container')) and owner.get('id') == action.get('container')
    return (owner.get('kind') == 'supervisor' and bool(action.get('program'))
            and owner.get('name') == action.get('program') and owner.get('unit') == action.get('unit'))


def freed(reclaims):
    """Indices of the GPUs some reclaim of the run found held and left free."""
    found = set()
    for reclaim in reclaims:
        before = dict((row.get('index'), row) for row in reclaim.get('before') or [] if isinstance(row, dict))
        for row in reclaim.get('after') or []:
            if isinstance(row, dict) and row.get('free') is True and before.get(row.get('index'), {}).get('free') is False:
                found.add(row.get('index'))
    return found


def gpu_rows(reclaims):
    """{index: (row, the reclaim it is from)}: each GPU's row in the last reclaim that read it."""
    rows = {}
    for reclaim in reclaims:
        for row in reclaim.get('after') or []:
            if isinstance(row, dict) and isinstance(row.get('index'), int) and not isinstance(row.get('index'), bool):
                rows[row['index']] = (row, reclaim)
    return rows


def unexplained_mib(row, reclaim):
    """MiB in use on the GPU that no process explains: all of it where nothing holds a context
    on it and nothing maps it as peer memory; else what NVML charges the GPU beyond its
    holders' charges (as the run's first survey read them), and 0 where a holder's charge is
    unknown (no alarm on what a live process may explain)."""
    used = _number(row.get('memory_used_mib')) or 0
    if row.get('peers'):
        return 0
    pids = row.get('holders') or []
    if not pids:
        return max(0, used)
    charges = {}
    for holder in reclaim.get('holders') or []:
        if isinstance(holder, dict):
            memory = holder.get('gpu_memory_mib') or {}
            charge = memory.get(str(row['index']), memory.get(row['index']))
            charges[holder.get('pid')] = _number(charge)
    known = [charges.get(pid) for pid in pids]
    if any(charge is None for charge in known):
        return 0
    return max(0, used - sum(known))


def families(run, last):
    """The metric families of one run.

    `run`: {'started': epoch seconds, 'duration_s', 'failure': the recorded failure or None,
    'reclaims': gpu_reclaim results in the order they ran, 'server': the
    inference_service_server fact or None, 'free_threshold_mib', 'interval_s': the longest
    time between runs the reclaim timer keeps, or None}. `last`: a Carried."""
    reclaims = _results(run.get('reclaims'))
    failure = run.get('failure')
    if not failure:
        result = 'ok'
    else:
        stage = failure.get('stage') if isinstance(failure, dict) else None
        result = '%s_failed' % stage if stage in ('reclaim', 'restart') else 'failed'
    levers = dict((lever, 0) for lever in LEVERS)
    for reclaim in reclaims:
        for lever, count in ended(reclaim).items():
            levers[lever] += count
    gpus_freed = len(freed(reclaims))
    previous = last.samples

    def total(name, add, **labels):
        return previous.get((name, tuple(sorted(labels.items()))), 0) + add

    out = [
        Family('gpuops_reclaim_last_run_start_timestamp_seconds', 'gauge',
               'When the last run of playbooks/reclaim.yml on this node started (Unix time, the controller\'s clock).'
               ).add(run['started']),
        Family('gpuops_reclaim_last_run_duration_seconds', 'gauge',
               'How long the last run took, from its start until its metrics were written.').add(run['duration_s']),
        Family('gpuops_reclaim_last_run_success', 'gauge',
               'Whether the last run left this node converged (1) or failed on it (0).').add(result == 'ok'),
        Family('gpuops_reclaim_last_run_result', 'gauge',
               'The last run\'s result: 1 for the one it had (ok, reclaim_failed: the GPUs were not freed, '
               'restart_failed: the inference server did not converge).',
               [({'result': name}, name == result) for name in RESULTS]),
        Family('gpuops_reclaim_runs_total', 'counter', 'Runs of playbooks/reclaim.yml on this node, by result.',
               [({'result': name}, total('gpuops_reclaim_runs_total', name == result, result=name)) for name in RESULTS]),
        Family('gpuops_reclaim_last_run_ended', 'gauge',
               'What the last run ended, by lever: holders of units stopped (unit), of containers stopped (runtime), '
               'of programs stopped through their supervisor (supervisor), processes that exited after a signal (signal).',
               [({'lever': lever}, levers[lever]) for lever in LEVERS]),
        Family('gpuops_reclaim_ended_total', 'counter',
               'What reclaims on this node ended, by lever (as gpuops_reclaim_last_run_ended counts it).',
               [({'lever': lever}, total('gpuops_reclaim_ended_total', levers[lever], lever=lever)) for lever in LEVERS]),
        Family('gpuops_reclaim_last_run_gpus_freed', 'gauge', 'GPUs the last run found held and left free.').add(gpus_freed),
        Family('gpuops_reclaim_gpus_freed_total', 'counter', 'GPUs reclaims on this node found held and left free.'
               ).add(total('gpuops_reclaim_gpus_freed_total', gpus_freed)),
    ]
    if _number(run.get('interval_s')) is not None:
        out.append(Family('gpuops_reclaim_timer_interval_seconds', 'gauge',
                          'The longest time the reclaim timer leaves between the end of a run and the start of the next '
                          '(its interval plus its randomized delay).').add(run['interval_s']))
    out.extend(_gpu_families(reclaims, run.get('free_threshold_mib'), previous))
    out.extend(_server_families(run.get('server')))
    return out


def _gpu_families(reclaims, threshold_mib, previous):
    rows = gpu_rows(reclaims)
    if not rows:
        return []
    threshold = _number(threshold_mib)
    threshold = 0 if threshold is None else threshold
    free = Family('gpuops_gpu_free', 'gauge', 'Whether the GPU was free at the end of the last run (1) or held (0).')
    used = Family('gpuops_gpu_memory_used_bytes', 'gauge', 'GPU memory in use at the end of the last run.')
    unexplained = Family('gpuops_gpu_memory_unexplained_bytes', 'gauge',
                         'GPU memory in use at the end of the last run that no process explains (held by no live context '
                         'and mapped by no peer: a dead process\'s memory, or a process this run could not see).')
    streak = Family(STREAK, 'gauge',
                    'Runs in a row, up to the last, that ended with more GPU memory no process explains than the free '
                    'threshold (gpus_free_free_threshold_mib); 0 when the last did not.')
    healthy = Family('gpuops_gpu_healthy', 'gauge', 'Whether the GPU health read said ok (1) or a fault (0).')
    health = Family('gpuops_gpu_health_code', 'gauge', 'The GPU health read\'s code (ok or a fault code), always 1.')
    for index in sorted(rows):
        row, reclaim = rows[index]
        gpu = str(index)
        free.add(row.get('free') is True, gpu=gpu)
        mib = _number(row.get('memory_used_mib'))
        if mib is not None:
            used.add(mib * MIB, gpu=gpu)
        lost = unexplained_mib(row, reclaim)
        unexplained.add(lost * MIB, gpu=gpu)
        before = previous.get((STREAK, (('gpu', gpu),)), 0)
        streak.add(before + 1 if lost > threshold else 0, gpu=gpu)
        read = row.get('health')
        if isinstance(read, dict) and 'code' in read:
            code = code_label(read.get('code'))
            healthy.add(code == 'ok', gpu=gpu)
            health.add(1, gpu=gpu, code=code)
    return [f for f in (free, used, unexplained, streak, healthy, health) if f.samples]


def _server_families(server):
    if not isinstance(server, dict):
        return []
    state = server.get('state') if server.get('state') in SERVER_STATES else 'unknown'
    out = [Family('gpuops_inference_server_state', 'gauge',
                  'The inference server\'s state as the last run read it: 1 for the one it was in.',
                  [({'state': name}, name == state) for name in SERVER_STATES])]
    if 'code' in server:
        out.append(Family('gpuops_inference_server_code', 'gauge',
                          'The code the inference_service role gave the server\'s state, always 1.'
                          ).add(1, code=code_label(server.get('code'))))
    figures = (('age_s', 'gpuops_inference_server_state_age_seconds', 'How long the server had been in its state.'),
               ('time_to_serve_s', 'gpuops_inference_server_time_to_serve_seconds',
                'The server\'s last time to serve: from its start until it answered.'),
               ('ttft_s', 'gpuops_inference_server_ttft_seconds', 'The server\'s last time to a first token.'))
    for key, name, text in figures:
        value = _number(server.get(key))
        if value is not None:
            out.append(Family(name, 'gauge', text).add(value))
    return out


# systemd.time(7)'s units, in seconds; a number without a unit is seconds.
_SPAN_UNITS = {
    'usec': 1e-6, 'us': 1e-6, 'msec': 1e-3, 'ms': 1e-3,
    'seconds': 1, 'second': 1, 'sec': 1, 's': 1, '': 1,
    'minutes': 60, 'minute': 60, 'min': 60, 'm': 60,
    'hours': 3600, 'hour': 3600, 'hr': 3600, 'h': 3600,
    'days': 86400, 'day': 86400, 'd': 86400,
    'weeks': 604800, 'week': 604800, 'w': 604800,
    'months': 2629800, 'month': 2629800, 'M': 2629800,
    'years': 31557600, 'year': 31557600, 'y': 31557600,
}
_SPAN_PART = re.compile(r'\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)')


def timespan_s(text):
    """Seconds in a systemd time span ('5min', '5min 60s', '1h 30m', '90'); ValueError naming
    the text when it is not one. Parts add up, as systemd reads them."""
    rest, total, parts = str(text).strip(), 0.0, 0
    while rest:
        match = _SPAN_PART.match(rest)
        if not match or match.group(2) not in _SPAN_UNITS:
            raise ValueError('%r is not a systemd time span (such as 5min, or 5min 60s)' % (text,))
        total += float(match.group(1)) * _SPAN_UNITS[match.group(2)]
        rest = rest[match.end():].strip()
        parts += 1
    if not parts:
        raise ValueError('%r is not a systemd time span (such as 5min, or 5min 60s)' % (text,))
    return total
