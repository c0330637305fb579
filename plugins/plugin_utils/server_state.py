# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The inference_service role's judgement of its server from facts (issue 30), pure.

server_state: from what the node showed (the unit, a window of /health probes, one completion,
    the server's last log line, who holds its GPUs) -> the server's state, a reason code, and
    whether the role waits for it (loading), leaves it (serving) or restarts it.
server_say: the one place those codes become sentences.
server_inputs: the role's inputs that cannot work together, as codes naming the variable.

A server is judged by facts root controls: systemd's start time of the unit's main process,
inference_service_health_timeout, the server's own log and its ranks' GPU contexts. One /health
answer is not one of them: a probe fails on a busy server, and a loading server answers nothing
for many minutes (issue 30: real large models load for 10-60 minutes).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError

STATES = ('loading', 'serving', 'stalled', 'restarting', 'stopped', 'failed')

# Codes of the observed server (the state each goes with is in server_state below).
HEALTHY = 'healthy'                  # /health 200, one completion, every rank holds its GPU
LOADING = 'loading'                  # no /health 200 yet, younger than the health timeout
STALLED = 'stalled'                  # no /health 200, older than the health timeout
GENERATE_HUNG = 'generate_hung'      # /health 200, the completion did not answer in time
GENERATE_FAILED = 'generate_failed'  # /health 200, the completion answered an error
RANK_MISSING = 'rank_missing'        # /health 200, a GPU of the server has no context of its unit
UNIT_MISSING = 'unit_missing'
UNIT_INACTIVE = 'unit_inactive'
UNIT_FAILED = 'unit_failed'
UNIT_RESTARTING = 'unit_restarting'
# Codes of the end of a run.
LOADED = 'loaded'                    # was loading, the run waited, it serves
RESTARTED = 'restarted'              # this run (re)started it and it serves
ROLLED_BACK = 'rolled_back'          # the new start failed, the last good unit serves again
RESTART_FAILED = 'restart_failed'    # the new start failed and nothing serves
# Why a restart: the unit's own wanted text differs (flags, image, env, stop timeout).
UNIT_CHANGED = 'unit_changed'

_STATE_OF = {HEALTHY: 'serving', LOADED: 'serving', RESTARTED: 'serving', LOADING: 'loading',
             STALLED: 'stalled', GENERATE_HUNG: 'stalled', GENERATE_FAILED: 'failed', RANK_MISSING: 'failed',
             UNIT_MISSING: 'stopped', UNIT_INACTIVE: 'stopped', UNIT_FAILED: 'failed',
             UNIT_RESTARTING: 'restarting', ROLLED_BACK: 'serving', RESTART_FAILED: 'failed'}


def _num(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _holds(holder, unit, own):
    if holder.get('unit') == unit:
        return True
    owner = holder.get('owner') or {}
    # docker: the server's processes are in docker's cgroup, in the unit's own container.
    return bool(own) and owner.get('kind') == 'container' and owner.get('id') == own \
        and owner.get('confirmed', True) is True


def missing_ranks(holders, gpus, unit, own=''):
    """GPUs (as str) of `gpus` on which no process of the unit (or its own container) holds a context."""
    held = set()
    for holder in holders or []:
        if _holds(holder, unit, own):
            held.update(str(g) for g in (holder.get('context_gpus') or holder.get('gpus') or []))
    return [gpu for gpu in gpus if gpu not in held]


def server_state(observed, holders, unit, gpus, health_timeout, unit_changed=False, own='', memory=None):
    """The server's state from what the node showed.

    observed: wait_healthy.py's observation: {unit: {ActiveState, SubState, MainPID, age_s, LoadState},
        probe: {healthy, statuses, seconds}, generate: {ok, hung, status, ttft_s, error} or null,
        last_line: {line, age_s} or null}. holders: gpu_holders' holders. gpus: the GPUs its ranks
        run on (the first tp x dp of inference_service_gpus). health_timeout: inference_service_health_timeout, the budget of a load.
        memory: server_progress's fact of its ranks' GPU memory ({mib, grew_age_s, ...}) or None.
    Returns {state, code, age_s, last_progress, ttft_s, restart (bool), wait_s (how long a loading
    server may still load), missing_gpus, reasons (codes: why a restart)}.
    """
    if not isinstance(observed, dict):
        raise AnsibleFilterError('server_state: expected the observation (a dict), got %s' % type(observed).__name__)
    budget = _num(health_timeout)
    if budget is None or budget <= 0:
        raise AnsibleFilterError('server_state: health_timeout must be a positive number of seconds, got %r'
                                 % (health_timeout,))
    unit_facts = observed.get('unit') or {}
    probe = observed.get('probe') or {}
    gen = observed.get('generate')
    age = _num(unit_facts.get('age_s'))
    active, sub = unit_facts.get('ActiveState', ''), unit_facts.get('SubState', '')
    missing, ttft, wait_s = [], None, 0
    if unit_facts.get('LoadState') == 'not-found' or not active:
        code = UNIT_MISSING
    elif active == 'failed':
        code = UNIT_FAILED
    elif active in ('activating', 'deactivating', 'reloading') or sub == 'auto-restart':
        code = UNIT_RESTARTING
    elif active != 'active':
        code = UNIT_INACTIVE
    elif probe.get('healthy'):
        missing = missing_ranks(holders, gpus, unit, own)
        if missing:
            code = RANK_MISSING
        elif gen is not None and not gen.get('ok'):
            code = GENERATE_HUNG if gen.get('hung') else GENERATE_FAILED
        else:
            code = HEALTHY
            ttft = gen.get('ttft_s') if gen else None
    elif age is None or age < budget:
        # An unknown age proves no stall: the run gives it the whole budget.
        code, wait_s = LOADING, round(budget - (age or 0.0), 1)
    else:
        code = STALLED
    reasons = ([UNIT_CHANGED] if unit_changed else []) + ([code] if code not in (HEALTHY, LOADING) else [])
    return {'state': _STATE_OF[code], 'code': code, 'age_s': None if age is None else round(age, 1),
            'last_progress': _progress(observed.get('last_line'), memory), 'ttft_s': ttft,
            'restart': bool(reasons), 'wait_s': wait_s, 'missing_gpus': missing, 'reasons': reasons}


def _progress(last, memory=None):
    """The server's latest progress: its last log line, or its ranks' GPU memory seen growing
    (issue 30 item 1), whichever is more recent: {kind: 'log' | 'gpu_memory', age_s (of that
    progress), line (the last log line, or null), line_age_s, gpu_memory_mib (the ranks' MiB, when
    read)}, or None."""
    log = None
    if isinstance(last, dict) and last.get('line'):
        log = {'kind': 'log', 'line': str(last['line'])[:300],
               'age_s': None if _num(last.get('age_s')) is None else round(_num(last['age_s']), 1)}
        log['line_age_s'] = log['age_s']
    mib = _num((memory or {}).get('mib')) if isinstance(memory, dict) else None
    grew = _num(memory.get('grew_age_s')) if mib is not None else None
    if grew is not None and (log is None or log['age_s'] is None or grew < log['age_s']):
        return {'kind': 'gpu_memory', 'age_s': round(grew, 1), 'gpu_memory_mib': int(mib),
                'line': log['line'] if log else None, 'line_age_s': log['age_s'] if log else None}
    if log is not None and mib is not None:
        log['gpu_memory_mib'] = int(mib)
    return log


def server_after(before, waited=None, restarted=False, unit_age_s=None, rolled_back=None):
    """The server's state at the end of a run: `before` (server_state's), then the result of the
    wait for a loading server (wait_healthy.py's), or the restart's (restarted: this run started it
    and it came up; rolled_back: true when its start failed and the last good unit serves again,
    false when nothing serves). Returns the published fact: {state, code, age_s, last_progress,
    time_to_serve_s, ttft_s}."""
    fact = {key: before.get(key) for key in ('state', 'code', 'age_s', 'last_progress', 'ttft_s')}
    fact['time_to_serve_s'] = None
    if rolled_back is not None:
        code = ROLLED_BACK if rolled_back else RESTART_FAILED
        fact.update(state=_STATE_OF[code], code=code, age_s=_round(unit_age_s),
                    ttft_s=_round((waited or {}).get('ttft_s')) if rolled_back else None,
                    last_progress=_progress((waited or {}).get('last_line')))
    elif restarted and waited:
        fact.update(state='serving', code=RESTARTED, age_s=_round(unit_age_s),
                    time_to_serve_s=_round(waited.get('time_to_serve_s')), ttft_s=_round(waited.get('ttft_s')),
                    last_progress=_progress(waited.get('last_line')) or fact['last_progress'])
    elif waited is not None:
        if waited.get('healthy'):
            fact.update(state='serving', code=LOADED, ttft_s=_round(waited.get('ttft_s')),
                        age_s=_round(unit_age_s) if unit_age_s is not None else fact['age_s'])
        fact['last_progress'] = _progress(waited.get('last_line')) or fact['last_progress']
    return fact


def _round(value):
    value = _num(value)
    return None if value is None else round(value, 2)


def _duration(seconds):
    """'8 h 3 min', '4 min 10 s', '12 s'."""
    seconds = int(round(_num(seconds) or 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return '%d h %d min' % (hours, minutes)
    if minutes:
        return '%d min %d s' % (minutes, secs)
    return '%d s' % secs


def _last(progress):
    if not progress:
        return 'no log line since its start'
    if progress.get('kind') == 'gpu_memory':
        return 'its ranks\' GPU memory last grew %s ago, to %s MiB; %s' % (
            _duration(progress.get('age_s')), progress.get('gpu_memory_mib'),
            _last({'line': progress['line'], 'age_s': progress.get('line_age_s')}) if progress.get('line')
            else 'no log line since its start')
    return 'last log line %s ago: %s' % (_duration(progress.get('age_s')), progress.get('line'))


def server_say(state, health_timeout=None):
    """Sentences for server_state's result: {'state': one line, 'reasons': one per restart reason}."""
    code, age, progress = state.get('code'), state.get('age_s'), state.get('last_progress')
    missing = ', '.join(state.get('missing_gpus') or [])
    said = {
        HEALTHY: 'serving for %s (/health 200, one completion%s)' % (
            _duration(age), '' if state.get('ttft_s') is None else ' in %s s' % state['ttft_s']),
        LOADED: 'loaded and serving after %s' % _duration(age),
        RESTARTED: 'restarted and serving %s s after its start' % state.get('time_to_serve_s'),
        LOADING: 'loading for %s of its %s s health timeout; %s' % (_duration(age), health_timeout, _last(progress)),
        STALLED: 'no /health 200 in %s since its start; %s' % (_duration(age), _last(progress)),
        GENERATE_HUNG: '/health answers 200 but one completion did not answer in time: its engine hangs',
        GENERATE_FAILED: '/health answers 200 but one completion failed: its engine does not serve',
        RANK_MISSING: '/health answers 200 but no process of the unit holds GPU %s: a rank died' % missing,
        UNIT_MISSING: 'unit is missing',
        UNIT_INACTIVE: 'unit is inactive',
        UNIT_FAILED: 'unit is failed',
        UNIT_RESTARTING: 'unit is being restarted by systemd',
        ROLLED_BACK: 'the new start failed; the last good unit serves again',
        RESTART_FAILED: 'the new start failed and no last good unit serves',
        # Kept word for word: run summaries and drift checks read it (tests/integration).
        UNIT_CHANGED: 'flags or unit changed',
    }
    return {'state': '%s: %s' % (state.get('state'), said.get(code, code)),
            'reasons': [said.get(reason, reason) for reason in state.get('reasons') or []]}


def server_inputs(health_timeout, probe_period, probe_failures, engine, engine_name):
    """The role's inputs that cannot work together: [{code, variable, ...}], empty when they fit.

    A health timeout shorter than the probe window would call a loading server stalled before one
    window of probes could show it healthy; an engine without a generation endpoint cannot prove
    it serves."""
    problems = []
    timeout, period, failures = _num(health_timeout), _num(probe_period), _num(probe_failures)
    if None in (timeout, period, failures) or period <= 0 or failures < 1:
        problems.append({'code': 'probe_bad', 'variable': 'inference_service_probe_period / _probe_failures',
                         'value': [probe_period, probe_failures]})
    elif timeout < period * failures:
        problems.append({'code': 'health_timeout_short', 'variable': 'inference_service_health_timeout',
                         'value': health_timeout, 'window': period * failures})
    if not isinstance(engine, dict) or not engine.get('generate_path'):
        problems.append({'code': 'no_generate_endpoint',
                         'variable': 'inference_service__engines.%s.generate_path' % engine_name, 'value': None})
    return problems


def server_inputs_say(problems):
    """One sentence per server_inputs problem."""
    said = []
    for p in problems or []:
        if p['code'] == 'health_timeout_short':
            said.append('%s=%s is shorter than the probe window (inference_service_probe_failures x '
                        'inference_service_probe_period = %s s): a loading server would be judged before one '
                        'window of probes; raise it' % (p['variable'], p['value'], p['window']))
        elif p['code'] == 'no_generate_endpoint':
            said.append('%s is not set: the role cannot prove the server generates; name the engine\'s '
                        'completion endpoint in the engine table (vars/main.yml)' % p['variable'])
        else:
            said.append('%s=%s must be a positive period and at least 1 failure' % (p['variable'], p['value']))
    return said


def server_inputs_checked(health_timeout, probe_period, probe_failures, engine, engine_name):
    """server_inputs with each problem's sentence (server_inputs_say) as `msg`."""
    problems = server_inputs(health_timeout, probe_period, probe_failures, engine, engine_name)
    return [dict(p, msg=msg) for p, msg in zip(problems, server_inputs_say(problems))]
