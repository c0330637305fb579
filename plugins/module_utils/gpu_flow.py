# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The two flows the modules run: survey (observe + decide) and reclaim (the escalation ladder).

observe -> decide -> act -> verify -> report, one way. The ladder never sleeps a guessed time:
each wait polls the kernel or the driver and ends as soon as the answer is known.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import signal
import time

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act as act
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner


# The options every surveying module takes; their documentation is the gpu_survey doc fragment.
SURVEY_ARGUMENT_SPEC = dict(
    gpus=dict(type='list', elements='str', default=[]),
    exclude=dict(type='list', elements='str', default=[]),
    nvml_timeout=dict(type='float', default=10.0),
    protect=dict(type='list', elements='str', default=[]),
    free_threshold_mib=dict(type='int', default=128),
)


def survey_param_error(params):
    """What is wrong with the survey options (ranges argument_spec cannot express), or None."""
    if params['nvml_timeout'] <= 0:
        return 'nvml_timeout must be greater than 0, got %s' % params['nvml_timeout']
    if params['free_threshold_mib'] < 0:
        return 'free_threshold_mib must be 0 or more, got %s' % params['free_threshold_mib']
    if observe.backend_name() is None:
        return ('neither nvidia-ml-py (python module pynvml) nor nvidia-smi is available on this '
                'host: install nvidia-ml-py for the Python that runs Ansible modules')
    return None


def surveyor_from_params(params, spare_units=None):
    return Surveyor(gpus=params['gpus'], exclude=params['exclude'], nvml_timeout=params['nvml_timeout'],
                    protect=params['protect'], free_threshold_mib=params['free_threshold_mib'],
                    spare_units=spare_units)


class Survey(object):
    """One observation, classified, for the selected GPUs."""

    def __init__(self, snapshot, selected, holders, clients, unconfirmed, rows, diagnosis,
                 spared=()):
        self.snapshot = snapshot
        self.selected = selected
        self.holders = holders
        self.spared = list(spared)    # holders owned by a spared unit: never targets
        self.clients = clients
        self.unconfirmed = unconfirmed
        self.rows = rows
        self.diagnosis = diagnosis

    @property
    def free(self):
        return all(row['free'] for row in self.rows)

    @property
    def spared_pids(self):
        return frozenset(h['pid'] for h in self.spared)

    def holders_of_selected(self):
        chosen = set(self.selected)
        return [h for h in self.holders if set(h['gpus']) & chosen]


class Surveyor(object):
    """Takes surveys with fixed options; remembers what stays the same between them."""

    def __init__(self, gpus=None, nvml_timeout=10.0, protect=None, free_threshold_mib=128,
                 dev_dir='/dev', proc='/proc', backend=None, exclude=None, spare_units=None):
        self.requested = gpus or []
        self.exclude = exclude or []
        self.spare_units = frozenset(decide.unit_names(spare_units, 'spare_units'))
        self.nvml_timeout = nvml_timeout
        self.protect = decide.compile_patterns(protect, 'protect')
        self.free_threshold_mib = free_threshold_mib
        self.dev_dir = dev_dir
        self.proc = proc
        self.backend = backend or observe.backend_name()
        self.own_ancestors = set(observe.ancestors(os.getpid(), proc))
        self.owner_details = {}   # (runtime, id) -> what its CLI said, asked once per run

    def protected_containers(self):
        """Ids of containers holding this module's ancestors (the caller's own container)."""
        ids = set()
        for pid in self.own_ancestors:
            info = observe.describe_process(pid, self.proc)
            owner = gpu_owner.owner_from_cgroup(info.cgroup) if info else None
            if owner and owner['kind'] == gpu_owner.CONTAINER and owner['id']:
                ids.add(owner['id'])
        return ids

    def protected_units(self):
        """Units never stopped: the spared ones, and those holding this module's ancestors
        (stopping them would cut the caller off)."""
        units = set(self.spare_units)
        for pid in self.own_ancestors:
            info = observe.describe_process(pid, self.proc)
            unit = decide.unit_from_cgroup(info.cgroup) if info else None
            if unit:
                units.add(unit)
        return units

    def survey(self, deep=False):
        snapshot = observe.take_snapshot(self.nvml_timeout, dev_dir=self.dev_dir, proc=self.proc,
                                         deep=deep, backend=self.backend)
        selected = decide.resolve_gpus(self.requested, snapshot.gpus, self.exclude)
        own_tree = self.own_ancestors | set(
            pid for pid, p in snapshot.procs.items() if p.ppid == snapshot.own_pid)
        units = self._units_of(snapshot)
        holders, clients, unconfirmed = decide.classify(snapshot, self.protect, own_tree, units,
                                                        self.free_threshold_mib)
        name_owners(holders, self.nvml_timeout, self.owner_details)
        for holder in holders:
            if holder['parent_name'] is None and holder['ppid']:
                parent = observe.describe_process(holder['ppid'], self.proc)
                holder['parent_name'] = parent.name if parent else None
        spared = [h for h in holders if h['unit'] in self.spare_units and set(h['gpus']) & set(selected)]
        spared_pids = frozenset(h['pid'] for h in spared)
        rows = decide.gpu_table(snapshot, holders, selected, self.free_threshold_mib, spared_pids)
        held = set(row['index'] for row in rows if not row['free'])
        explained = set(index for holder in holders for index in holder['context_gpus'])
        if not deep and held - explained:
            # Memory is held and no context explains it: a process may have closed its fds
            # but kept its mappings. Read every process's maps before calling it invisible.
            return self.survey(deep=True)
        diagnosis = decide.diagnose(snapshot, holders, unconfirmed, rows, spared_pids)
        return Survey(snapshot, selected, holders, clients, unconfirmed, rows, diagnosis, spared)

    @staticmethod
    def _units_of(snapshot):
        """Restart= and ActiveState of each service unit owning a process of the snapshot.

        Read anew at every survey: a unit the ladder stopped must show as stopped.
        """
        units = {}
        for proc in snapshot.procs.values():
            unit = decide.unit_from_cgroup(proc.cgroup)
            if unit and unit.endswith('.service') and unit not in units:
                units[unit] = observe.unit_restart_policy(unit)
        return units

    def memory_back(self, selected, spared_pids=frozenset()):
        """Cheap check used while waiting: NVML memory only, no /proc scan."""
        gpus = observe.read_gpus(self.nvml_timeout, backend=self.backend)
        return all(g.used_mib - decide.spared_mib(g, spared_pids) <= self.free_threshold_mib
                   for g in gpus if g.index in selected)


def name_owners(holders, timeout, asked):
    """Fill in each container's, pod's and guest's readable name, restart policy and pod from
    its runtime's CLI, asking once per owner (`asked` keeps the answers between surveys)."""
    for holder in holders:
        owner = holder['owner']
        if owner['kind'] not in ('container', 'pod', 'guest') or not owner['id']:
            continue
        key = (owner['runtime'], owner['id'])
        if key not in asked:
            asked[key] = observe.runtime_details(owner, timeout)
        details = dict(asked[key])
        pod = details.pop('pod', None)
        owner.update((k, v) for k, v in details.items() if v is not None)
        if pod and owner['kind'] == 'pod':
            owner['pod'] = dict(owner['pod'] or {}, **dict((k, v) for k, v in pod.items() if v))


def survey_result(survey):
    """The result keys gpu_holders returns."""
    return {
        'gpus': survey.rows,
        'holders': survey.holders_of_selected(),
        'clients': survey.clients,
        'free': survey.free,
        'diagnosis': survey.diagnosis,
        'backend': survey.snapshot.backend,
    }


# How long the ladder watches for a guest's systemd to restart what it killed from the host:
# systemd's default RestartSec is 100 ms; the rest covers a slow start of the new process.
GUEST_RESPAWN_WATCH_S = 5.0


def _guest_unit(holder):
    """(guest cgroup, service inside it) for a holder run by a guest's own systemd service."""
    owner = holder.get('owner') or {}
    unit = owner.get('guest_unit')
    if owner.get('kind') == gpu_owner.GUEST and unit and unit.endswith('.service'):
        return owner['cgroup'].split('/' + unit)[0], unit
    return None


class Ladder(object):
    """stop unit -> SIGTERM -> SIGKILL -> rescan -> wait for memory -> optional reset."""

    def __init__(self, surveyor, term_timeout=30.0, release_timeout=60.0, passes=3, stop_units=True,
                 match=None, force=False, allow_reset=False, check_mode=False,
                 clock=time.monotonic, stop_containers=True):
        self.surveyor = surveyor
        self.term_timeout = term_timeout
        self.release_timeout = release_timeout
        self.passes = passes
        self.stop_units = stop_units
        self.stop_containers = stop_containers
        self.match = decide.compile_patterns(match, 'match')
        self.force = force
        self.allow_reset = allow_reset
        self.check_mode = check_mode
        self.clock = clock
        self.started = None
        self.actions = []
        self.killed = set()       # (pid, start_time) that already got SIGKILL: never again
        self.stopped_containers = set()   # (runtime, id) already stopped: never twice
        self.respawning_guest_units = set()   # (guest cgroup, unit) seen restarting what was killed

    def _record(self, step, result, **what):
        entry = {'at_s': round(self.clock() - self.started, 3), 'step': step, 'result': result}
        entry.update(what)
        self.actions.append(entry)
        return entry

    # --- the ladder -------------------------------------------------------------------------

    def run(self):
        self.started = self.clock()
        first = self.surveyor.survey()
        if first.free:
            return self._result(first, first)
        if self.check_mode:
            self._plan(first)
            return self._result(first, first)
        try:
            return self._result(first, self._climb(first))
        except observe.ObserveError as exc:
            # The driver stopped answering after the ladder acted: say what was done so far.
            return self._interrupted(first, exc)

    def _climb(self, first):
        """The ladder proper, from the first survey to the last; returns the last survey."""
        protected_units = self.surveyor.protected_units()
        protected_containers = self.surveyor.protected_containers()
        current = first
        for attempt in range(self.passes + 1):
            if self.stop_containers and self._stop_containers(current, protected_containers):
                current = self.surveyor.survey()
                if current.free:
                    break
            targets = self._targets(current)
            targets = [t for t in targets if (t['pid'], t['start_time']) not in self.killed]
            if not targets:
                break
            if attempt > 0:
                self._record('rescan', 'found %d holder(s) left or new' % len(targets),
                             pids=[t['pid'] for t in targets])
            self._escalate(targets, protected_units)
            current = self.surveyor.survey()
            if current.free:
                current = self._watch_guest_respawn(targets, current)
            if current.free:
                break
        if not current.free:
            current = self._wait_release(current)
        if not current.free and self.allow_reset:
            current = self._reset(current)
        return current

    def _targets(self, survey):
        """The holders to signal: not those a guest's systemd was seen restarting, nor, without
        the container lever, those a container's restart policy would only bring back (both are
        named in the failure instead)."""
        targets = decide.plan_targets(survey.holders, survey.selected, self.match, survey.spared_pids)[0]
        targets = [t for t in targets if _guest_unit(t) not in self.respawning_guest_units]
        if self.stop_containers:
            return targets
        return [t for t in targets if not decide.container_restarts(t)]

    def _watch_guest_respawn(self, signalled, survey):
        """After killing processes of a guest's service from its host, watch for the guest's own
        systemd to start them again (this host can neither see nor stop that unit): poll the
        GPUs for up to GUEST_RESPAWN_WATCH_S and return the survey that shows the comeback, or
        the free one."""
        units = set(_guest_unit(t) for t in signalled) - set([None])
        if not units:
            return survey
        seen = {}

        def came_back():
            seen['survey'] = self.surveyor.survey()
            return not seen['survey'].free

        back, waited = act.wait_for(came_back, GUEST_RESPAWN_WATCH_S, clock=self.clock)
        if not back:
            self._record('watch_respawn', 'nothing came back within %.1f s' % waited,
                         guest_units=sorted(u[1] for u in units))
            return seen['survey']
        again = [h for h in seen['survey'].holders_of_selected() if _guest_unit(h) in units]
        self.respawning_guest_units |= set(_guest_unit(h) for h in again)
        self._record('watch_respawn', 'came back after %.1f s: %s' % (waited, ', '.join(
            'PID %d (%s)' % (h['pid'], gpu_owner.describe(h['owner'])) for h in again) or 'other holders'),
            guest_units=sorted(u[1] for u in units))
        return seen['survey']

    def _stop_containers(self, survey, protected_ids):
        """Stop the containers owning holders of the selected GPUs; True when any was asked."""
        holders = [h for h in survey.holders if h['pid'] not in survey.spared_pids]
        containers = [c for c in decide.containers_to_stop(holders, survey.selected, self.match, protected_ids)
                      if (c['runtime'], c['id']) not in self.stopped_containers]
        grace = 0 if self.force else self.term_timeout
        for owner in containers:
            self.stopped_containers.add((owner['runtime'], owner['id']))
            self._record('stop_container', act.stop_container(owner, grace), container=owner['id'],
                         runtime=owner['runtime'], name=owner['name'])
        return bool(containers)

    def _escalate(self, targets, protected_units):
        if self.stop_units:
            units = decide.units_to_stop(targets, protected_units)
            for unit in units:
                self._record('stop_unit', act.stop_unit(unit, 0 if self.force else self.term_timeout,
                                                        clock=self.clock), unit=unit)
            if units:
                targets = self._alive(targets)
        killed = []
        if not self.force:
            for holder in targets:
                self._signal(holder, signal.SIGTERM, 'sigterm')
            # A process whose SigIgn mask holds SIGTERM provably ignores it (SGLang's schedulers
            # before their first request, say): waiting out the grace for it frees nothing.
            killed = [self._kill(h) for h in targets if h['ignores_sigterm']]
            listening = [h for h in targets if not h['ignores_sigterm']]
            self._wait_gone(listening, self.term_timeout)
            targets = self._alive(listening)
        killed += [self._kill(h) for h in targets]
        # SIGKILL is final for every process that is not stuck in the kernel; bound the wait
        # so a D-state process is reported, not waited on forever.
        self._wait_gone(killed, max(self.term_timeout, 1.0))
        for holder in self._alive(killed):
            self._record('unreachable', 'alive after SIGKILL (state %s)'
                         % (observe.read_identity(holder['pid']) or (None, 'gone'))[1],
                         pid=holder['pid'], name=holder['name'])

    def _kill(self, holder):
        self._signal(holder, signal.SIGKILL, 'sigkill')
        self.killed.add((holder['pid'], holder['start_time']))
        return holder

    def _signal(self, holder, signum, step):
        result = act.send_signal(holder['pid'], holder['start_time'], signum,
                                 never=self.surveyor.own_ancestors)
        self._record(step, result, pid=holder['pid'], name=holder['name'], gpus=holder['gpus'])

    @staticmethod
    def _alive(targets):
        return [h for h in targets if act.is_alive(h['pid'], h['start_time'])]

    def _wait_gone(self, targets, timeout):
        if targets:
            act.wait_for(lambda: not self._alive(targets), timeout, clock=self.clock)

    def _wait_release(self, survey):
        selected = survey.selected
        spared_pids = survey.spared_pids
        back, waited = act.wait_for(lambda: self.surveyor.memory_back(selected, spared_pids),
                                    self.release_timeout, clock=self.clock)
        self._record('wait_release', 'memory back' if back else
                     'memory still held after %.1f s' % waited, gpus=selected, waited_s=round(waited, 3))
        return self.surveyor.survey()

    def _reset(self, survey):
        for row in survey.rows:
            if row['free']:
                continue
            users = [h for h in survey.holders if row['index'] in h['gpus']]
            if users:
                self._record('reset', 'skipped: PIDs %s still use the device'
                             % ', '.join(str(h['pid']) for h in users), gpu=row['index'])
                continue
            ok, steps = act.reset_gpu(row['index'], row['persistence_mode'], self.surveyor.nvml_timeout)
            for what, rc, out in steps:
                self._record(what, 'ok' if rc == 0 else 'failed (rc=%d): %s' % (rc, out), gpu=row['index'])
        if any(a['step'] == 'reset' and a['result'] == 'ok' for a in self.actions):
            return self._wait_release(survey)
        return survey

    def _plan(self, survey):
        """Check mode: what the ladder would do, from one observation, sending nothing."""
        if self.stop_containers:
            holders = [h for h in survey.holders if h['pid'] not in survey.spared_pids]
            for owner in decide.containers_to_stop(holders, survey.selected, self.match,
                                                   self.surveyor.protected_containers()):
                self._record('stop_container', 'planned', container=owner['id'], runtime=owner['runtime'],
                             name=owner['name'])
        targets = self._targets(survey)
        if self.stop_units:
            for unit in decide.units_to_stop(targets, self.surveyor.protected_units()):
                self._record('stop_unit', 'planned', unit=unit)
        for holder in targets:
            if not self.force:
                self._record('sigterm', 'planned', pid=holder['pid'], name=holder['name'],
                             gpus=holder['gpus'])
            self._record('sigkill', 'planned (if still alive)' if not self.force else 'planned',
                         pid=holder['pid'], name=holder['name'], gpus=holder['gpus'])
        if self.allow_reset:
            for row in survey.rows:
                if not row['free'] and not row['holders'] and not row['handles']:
                    self._record('reset', 'planned', gpu=row['index'])

    # --- the report -------------------------------------------------------------------------

    def _changed(self):
        """Something was stopped, signalled or reset (in check mode: would be)."""
        if self.check_mode:
            return any(a['result'].startswith('planned') for a in self.actions)
        return any(a['result'] in ('sent', 'stopped', 'ok') or a['result'].startswith('stopping')
                   for a in self.actions)

    def _interrupted(self, first, exc):
        return {
            'changed': self._changed(),
            'actions': self.actions,
            'before': first.rows,
            'after': [],
            'elapsed_s': round(self.clock() - self.started, 3),
            'free': False,
            'holders': first.holders_of_selected(),
            'spared': first.spared,
            'remaining': [],
            'diagnosis': first.diagnosis,
            'backend': first.snapshot.backend,
            'msg': '%s The ladder had taken %d action(s) before that (see actions); the GPUs were '
                   'not verified.' % (exc, len(self.actions)),
        }

    def _result(self, first, last):
        elapsed = round(self.clock() - self.started, 3)
        remaining = []
        if not last.free:
            targets, left = decide.plan_targets(last.holders, last.selected, self.match, last.spared_pids)
            remaining = left + [dict(t, reason='survived the ladder') for t in targets]
            held = set(row['index'] for row in last.rows if not row['free'])
            seen = set(h['pid'] for h in remaining) | last.spared_pids
            # Handles on a GPU still held block its reset; name them, never signal them.
            remaining += [dict(h, reason='has the device open (blocks a reset)') for h in last.holders
                          if h['pid'] not in seen and set(h['gpus']) & held]
        changed = self._changed()
        result = {
            'changed': changed,
            'actions': self.actions,
            'before': first.rows,
            'after': last.rows,
            'elapsed_s': elapsed,
            'free': last.free,
            'holders': first.holders_of_selected(),
            'spared': last.spared,
            'remaining': remaining,
            'diagnosis': last.diagnosis,
            'backend': last.snapshot.backend,
        }
        if not last.free and not self.check_mode:
            result['msg'] = decide.failure_message(last.rows, remaining, elapsed, self.allow_reset)
        return result
