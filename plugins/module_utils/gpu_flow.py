# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The two flows the modules run: survey (observe + decide) and reclaim (the escalation ladder).

observe -> decide -> act -> verify -> report, one way. The ladder has one path: each step
goes through an actor (gpu_act.HostActor acts, gpu_act.RecordingActor only records, for check
mode) and comes back as a gpu_act.Action. It never sleeps a guessed time: each wait polls the
kernel or the driver and ends as soon as the answer is known.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import signal
import time

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_access as access
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act as act
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_respawn as respawn
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_supervisor as supervisors
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_vendor as vendor


# The options every surveying module takes; their documentation is the gpu_survey doc fragment.
SURVEY_ARGUMENT_SPEC = dict(
    gpus=dict(type='list', elements='str', default=[]),
    exclude=dict(type='list', elements='str', default=[]),
    nvml_timeout=dict(type='float', default=10.0),
    protect=dict(type='list', elements='str', default=[]),
    free_threshold_mib=dict(type='int', default=128),
)

# gpu_reclaim's own options; documented in its DOCUMENTATION.
RECLAIM_ARGUMENT_SPEC = dict(
    term_timeout=dict(type='float', default=30.0),
    release_timeout=dict(type='float', default=60.0),
    passes=dict(type='int', default=3, no_log=False),
    stop_units=dict(type='bool', default=True),
    stop_containers=dict(type='bool', default=True),
    stop_supervised=dict(type='bool', default=True),
    match=dict(type='list', elements='str', default=[]),
    force=dict(type='bool', default=False),
    allow_reset=dict(type='bool', default=False),
    spare_units=dict(type='list', elements='str', default=[]),
    peers=dict(type='bool', default=False),
    lock_timeout=dict(type='float', default=300.0),
)


# How long memory that no visible process holds, on a GPU the ladder ended nothing on, is
# watched for falling before waiting for it is given up (a leak or a holder out of sight).
FALLING_S = 1.0


def _default(name):
    spec = SURVEY_ARGUMENT_SPEC.get(name) or RECLAIM_ARGUMENT_SPEC[name]
    return spec['default']


def survey_param_error(params):
    """What is wrong with the survey options (ranges argument_spec cannot express), or None."""
    if params['nvml_timeout'] <= 0:
        return 'nvml_timeout must be greater than 0, got %s' % params['nvml_timeout']
    if params['free_threshold_mib'] < 0:
        return 'free_threshold_mib must be 0 or more, got %s' % params['free_threshold_mib']
    if vendor.available_backend() is None:
        return vendor.NO_BACKEND
    return None


def reclaim_param_error(params):
    """What is wrong with gpu_reclaim's own options, or None."""
    for name in ('term_timeout', 'release_timeout', 'passes', 'lock_timeout'):
        if params[name] < 0:
            return '%s must be 0 or more, got %s' % (name, params[name])
    return survey_param_error(params)


def pattern_set(values, option):
    """The bounded patterns of a protect/match option (gpu_patterns.PatternSet); () when none
    are given."""
    if not values:
        return ()
    # Imported here: modules compile their module_utils at every run, and a run without
    # protect/match needs none of the bounded search.
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_patterns
    return gpu_patterns.PatternSet(values, option)


def pattern_error():
    """gpu_patterns.PatternError, for except clauses: Python evaluates one only once something
    was raised, so a run without patterns never imports gpu_patterns for it."""
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_patterns
    return gpu_patterns.PatternError


def surveyor_from_params(params, spare_units=None):
    return Surveyor(gpus=params['gpus'], exclude=params['exclude'], nvml_timeout=params['nvml_timeout'],
                    protect=params['protect'], free_threshold_mib=params['free_threshold_mib'],
                    spare_units=spare_units)


def ladder_from_params(params, check_mode):
    return Ladder(surveyor_from_params(params, spare_units=params['spare_units']),
                  term_timeout=params['term_timeout'], release_timeout=params['release_timeout'],
                  passes=params['passes'], stop_units=params['stop_units'], match=params['match'],
                  force=params['force'], allow_reset=params['allow_reset'], check_mode=check_mode,
                  stop_containers=params['stop_containers'], peers=params['peers'],
                  stop_supervised=params['stop_supervised'])


class Survey(object):
    """One observation, classified, for the selected GPUs."""

    def __init__(self, snapshot, selected, holders, clients, unconfirmed, rows, diagnosis,
                 spared=()):
        self.snapshot = snapshot
        self.selected = selected
        self.holders = holders
        self.clients = clients
        self.unconfirmed = unconfirmed
        self.rows = rows
        self.diagnosis = diagnosis
        self.spared = list(spared)    # holders owned by a spared unit: never targets

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

    def __init__(self, gpus=None, nvml_timeout=_default('nvml_timeout'), protect=None,
                 free_threshold_mib=_default('free_threshold_mib'), dev_dir='/dev', proc='/proc',
                 backend=None, exclude=None, spare_units=None):
        self.requested = gpus or []
        self.exclude = exclude or []
        self.spare_units = frozenset(decide.unit_names(spare_units, 'spare_units'))
        self.nvml_timeout = nvml_timeout
        self.protect = pattern_set(protect, 'protect')
        # The pattern sets (protect, the ladder's match) evaluated on every survey, before any
        # decision; none when no patterns are given.
        self.pattern_sets = [self.protect] if self.protect else []
        self.free_threshold_mib = free_threshold_mib
        self.proc = proc
        self.backend = backend or vendor.available_backend(dev_dir)
        if self.backend is None:
            raise observe.ObserveError(vendor.NO_BACKEND)
        self.own_ancestors = set(observe.ancestors(os.getpid(), proc))
        self.owner_details = {}   # (runtime, id) -> what its CLI said, asked once per run
        self.last_facts = ({}, {})   # the last survey's unit and runtime facts (_facts_of)
        # gpu_supervisor: (row, pid, start) -> the supervisor's last status, or its CLI's failure;
        # what the ladder learnt since about a program (gpu_supervisor.key -> error); the system
        # units whose MainPID is a supervisor (never stopped whole).
        self.supervisor_status = {}
        self.supervisor_errors = {}
        self.supervisor_units = set()
        self.access = access.read_access(proc)

    def protected_containers(self):
        """Ids of containers holding this module's ancestors (the caller's own container)."""
        ids = set()
        for pid in self.own_ancestors:
            try:
                owner = gpu_owner.owner_from_cgroup(observe.read_cgroup(pid, self.proc))
            except observe.ProcessGone:
                continue
            if owner['kind'] == gpu_owner.CONTAINER and owner['id']:
                ids.add(owner['id'])
        return ids

    def protected_units(self):
        """Units never stopped: the spared ones, and those holding this module's ancestors
        (stopping them would cut the caller off)."""
        units = set(self.spare_units)
        for pid in self.own_ancestors:
            try:
                unit = decide.unit_from_cgroup(observe.read_cgroup(pid, self.proc))
            except observe.ProcessGone:
                continue
            if unit:
                units.add(unit)
        return units

    def survey(self, deep=False, full=True):
        """Observe and classify. With `full` false, only the processes NVML lists are read when
        that explains every used MiB of the selected GPUs (gpu_decide.full_scan_code); every
        process is read otherwise. Handles, clients and peers need `full`."""
        snapshot = observe.take_snapshot(self.backend, self.nvml_timeout, proc=self.proc, deep=deep,
                                         listed_only=not full, deep_when=self._uncharged)
        if snapshot.scan == 'listed':
            selected = decide.resolve_gpus(self.requested, snapshot.gpus, self.exclude)
            if decide.full_scan_code(snapshot, selected, self.free_threshold_mib):
                return self.survey(deep=deep, full=True)
        texts = set()
        for proc in snapshot.procs.values():
            texts.update((proc.name, proc.cmdline))
        for pattern_set in self.pattern_sets:
            pattern_set.prime(sorted(texts))   # bounded; PatternTimeout names a hostile pattern
        selected = decide.resolve_gpus(self.requested, snapshot.gpus, self.exclude)
        own_tree = self.own_ancestors | set(
            pid for pid, p in snapshot.procs.items() if p.ppid == snapshot.own_pid)
        units, facts = self._facts_of(snapshot)
        holders, clients, unconfirmed = decide.classify(snapshot, self.protect, own_tree, units,
                                                        self.free_threshold_mib, facts)
        name_owners(holders, self.nvml_timeout, self.owner_details)
        supervise_owners(holders, units, self.nvml_timeout, self, self.proc)
        spared = [h for h in holders if h['unit'] in self.spare_units and set(h['gpus']) & set(selected)]
        survey = self._survey(snapshot, selected, holders, clients, unconfirmed, spared)
        held = set(row['index'] for row in survey.rows if not row['free'])
        explained = set(index for holder in holders
                        for index in holder['context_gpus'] + holder['peer_gpus'])
        if not snapshot.deep and held - explained:
            # Memory is held and no context explains it: a process may have closed its fds
            # but kept its mappings. Read every process's maps before calling it invisible.
            # (Memory charged to no PID made the scan deep at once: see _uncharged.)
            return self.survey(deep=True, full=True)
        return survey

    def _uncharged(self, gpus):
        """Whether a selected GPU uses memory the driver charges to no process (a leak, a holder
        outside this PID namespace, one that closed its fds but kept its mappings): then no fd
        alone can explain it, and the survey reads every process's fds and maps in one pass
        instead of reading the fds, classifying, and reading everything again (bench/run scan,
        "gpu_holders + leak": 1.78x fuser in two passes)."""
        selected = set(decide.resolve_gpus(self.requested, gpus, self.exclude))
        return bool(decide.uncharged_gpus(gpus, selected, self.free_threshold_mib))

    def _survey(self, snapshot, selected, holders, clients, unconfirmed, spared):
        spared_pids = frozenset(h['pid'] for h in spared)
        rows = decide.gpu_table(snapshot, holders, selected, self.free_threshold_mib, spared_pids)
        blind_sentence = say.blind(self.access)
        diagnosis = say.diagnosis(decide.findings(snapshot, holders, unconfirmed, rows, spared_pids,
                                                  bool(blind_sentence)), blind_sentence)
        return Survey(snapshot, selected, holders, clients, unconfirmed, rows, diagnosis, spared)

    def without(self, survey, ended):
        """The survey as it would read with the processes in `ended` ((pid, start_time) pairs)
        gone: what check mode walks on after a step it only recorded."""
        if not ended:
            return survey
        ended_pids = set(h['pid'] for h in survey.holders if (h['pid'], h['start_time']) in ended)
        snapshot = decide.snapshot_without(survey.snapshot, survey.holders, ended_pids)
        keep = [h for h in survey.holders if h['pid'] not in ended_pids]
        return self._survey(snapshot, survey.selected, keep, survey.clients, survey.unconfirmed,
                            [h for h in survey.spared if h['pid'] not in ended_pids])

    def _facts_of(self, snapshot):
        """What the managers and runtimes confirm about the owners of the snapshot's processes
        (gpu_trust.confirm): (system units, {'user_units', 'runtimes', 'vendor_units'}).

        Units are read anew at every survey (a unit the ladder stopped must show as stopped);
        a runtime is asked once per container and run.
        """
        units, user_units = {}, {}
        for proc in snapshot.procs.values():
            owner = gpu_owner.owner_from_cgroup(proc.cgroup, proc.cgroup_uids)
            unit = owner['unit']
            if owner['manager'] == gpu_owner.SYSTEM_MANAGER and unit.endswith('.service') \
                    and unit not in units:
                units[unit] = observe.unit_restart_policy(unit)
            elif owner['manager'] == gpu_owner.USER_MANAGER and unit.endswith('.service') \
                    and (owner['uid'], unit) not in user_units:
                user_units[(owner['uid'], unit)] = observe.user_unit_facts(owner['uid'], unit)
            elif owner['kind'] in (gpu_owner.CONTAINER, gpu_owner.POD, gpu_owner.GUEST) and owner['id']:
                key = (owner['runtime'], owner['id'])
                if key not in self.owner_details:
                    self.owner_details[key] = observe.runtime_details(owner, self.nvml_timeout)
            if owner['kind'] == gpu_owner.USER and owner['uid'] is not None:
                # Her manager (user@UID.service's MainPID) is the system's, not hers: it may
                # respawn her holders, and is then named, never signalled.
                manager = 'user@%d.service' % owner['uid']
                if manager not in units:
                    units[manager] = observe.unit_restart_policy(manager)
        facts = {'user_units': user_units, 'runtimes': self.owner_details,
                 'vendor_units': self.backend.infrastructure_units}
        self.last_facts = (units, facts)
        return units, facts

    def describe(self, pid, snapshot):
        """The holder-shaped dict of any process (a respawning parent, its new child); raises
        gpu_observe.ProcessGone."""
        proc = observe.describe_process(pid, self.proc)
        units, facts = self.last_facts
        return decide.describe(proc, snapshot, [], {}, set(), 'respawner', self.protect,
                               self.own_ancestors, units, [], facts)

    # --- what gpu_respawn.Watch reads ---------------------------------------------------------

    def peek(self, pid):
        """gpu_respawn.Link of a process, without its protection; raises gpu_observe.ProcError."""
        stat = observe.read_stat(pid, self.proc)
        try:
            exe = observe.read_exe(pid, self.proc)
            program = respawn.Program(exe.path, exe.dev, exe.ino,
                                      bool(stat.flags & observe.FORKNOEXEC_FLAG))
        except observe.AccessDenied:
            program = None
        return respawn.Link(pid, stat.ppid, stat.start_time, program, None)

    def link(self, pid):
        """gpu_respawn.Link of an ancestor, with whether it is protected; raises
        gpu_observe.ProcError."""
        peeked = self.peek(pid)
        proc = observe.describe_process(pid, self.proc)
        code, _detail = decide.protection_code(proc, self.own_ancestors, self.protect,
                                               vendor_infrastructure=self.backend.infrastructure)
        if code == lever.INIT_SHIELD:
            return peeked._replace(protected=respawn.NAMESPACE_INIT)
        return peeked._replace(protected=code is not None)

    def init_respawns(self):
        """Whether PID 1 is no systemd manager, so may restart what the ladder ends as a loop does
        (the init of the guest or container this runs in); False when it cannot be read."""
        try:
            program = self.peek(1).program
        except observe.ProcError:
            return False
        return program is not None and not respawn.systemd_manager(program)

    def descendants(self, pid):
        return observe.descendants_of(pid, self.proc)

    def identity(self, pid):
        """Identity of a process, or None when it is gone."""
        try:
            return observe.read_identity(pid, self.proc)
        except observe.ProcessGone:
            return None

    def used_mib(self, indices, spared_pids=frozenset()):
        """Used MiB per GPU index, less what the spared processes hold: the driver only."""
        return dict((g.index, g.used_mib - decide.spared_mib(g, spared_pids))
                    for g in self.backend.read_gpus(self.nvml_timeout) if g.index in indices)

    def memory_back(self, selected, spared_pids=frozenset()):
        """Cheap check used while waiting: the driver's memory only, no /proc scan."""
        gpus = self.backend.read_gpus(self.nvml_timeout)
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
        owner['cli_error'] = details.pop('cli_error', None)
        for fact in ('pid', 'init_cgroup'):   # the runtime's confirmation (gpu_trust.confirm)
            details.pop(fact, None)
        owner.update((k, v) for k, v in details.items() if v is not None)
        if pod and owner['kind'] == 'pod':
            owner['pod'] = dict(owner['pod'] or {}, **dict((k, v) for k, v in pod.items() if v))


def supervise_owners(holders, units, timeout, surveyor, proc='/proc'):
    """Make the owner of each holder that a process supervisor runs (gpu_supervisor) that
    supervisor's program: matched by identity on the holder's ancestry, the program from the
    supervisor's own status (asked once per supervisor and survey while it answers; a CLI that
    is missing or hangs is not asked again this run). A holder in a container, pod or guest is
    theirs. Also notes the system units whose MainPID is a supervisor (never stopped whole)."""
    checked = set()
    # Each process read once per survey: 24 ranks under one launcher read its chain 24 times. With
    # Watch.add's the same, the first signal on them came at 34 ms instead of 52 (bench/run reclaim
    # --shape ranks, 5 reps, medians; cProfile: 29 ms here, 9 in Watch.add).
    links = {}
    for holder in holders:
        owner = holder['owner']
        if owner['kind'] in (gpu_owner.CONTAINER, gpu_owner.POD, gpu_owner.GUEST):
            continue
        system = owner['kind'] == gpu_owner.SERVICE and owner['manager'] == gpu_owner.SYSTEM_MANAGER \
            and owner['confirmed'] and owner['controlled_by'] == gpu_owner.ROOT
        facts = units.get(owner['unit']) if system else None
        main_pid = facts.main_pid if facts else None
        if main_pid and owner['unit'] not in checked:
            checked.add(owner['unit'])
            if supervisors.daemon_row(observe.supervisor_chain(main_pid, proc, depth=0, links=links), main_pid):
                surveyor.supervisor_units.add(owner['unit'])
        if not holder['ppid'] or holder['ppid'] <= 1 or holder['ppid'] in surveyor.own_ancestors:
            continue   # an orphan of PID 1 (the seeds) or the module's own child: no supervisor above
        chain = observe.supervisor_chain(holder['pid'], proc, links=links)
        if not chain or chain[0].start_time != holder['start_time']:
            continue
        found = supervisors.match(chain, main_pid)
        if not found:
            continue
        if system:
            surveyor.supervisor_units.add(owner['unit'])
        holder['owner'] = _supervised_owner(owner, found, timeout, surveyor)


def _supervised_owner(owner, found, timeout, surveyor):
    runtime = found['runtime']
    row = supervisors.SUPERVISORS[runtime]
    key = (runtime, found['pid'], found['start_time'])
    service = found['service']
    status = surveyor.supervisor_status.get(key)
    program = supervisors.program_of(runtime, status[1], found['program_pid'], service) \
        if status and status[0] == 'ok' else None
    if program is None and not (status and status[0] in (supervisors.CLI_MISSING, supervisors.CLI_TIMEOUT)):
        argv = supervisors.argv(runtime, 'status', found, service)
        code, text = observe.supervisor_status(argv, timeout, found['uid'] if row['as_user'] else None,
                                               found['home'])
        entries = supervisors.parse_status(row['parse'], text) if code not in (
            supervisors.CLI_MISSING, supervisors.CLI_TIMEOUT) else None
        if entries is not None:
            status = ('ok', entries)
        elif code in (supervisors.CLI_MISSING, supervisors.CLI_TIMEOUT):
            status = (code, text)
        else:
            status = (supervisors.CLI_FAILED, say.cli_failed(argv, code, text))
        surveyor.supervisor_status[key] = status
        if status[0] == 'ok':
            program = supervisors.program_of(runtime, entries, found['program_pid'], service)
    error = None
    if status[0] != 'ok':
        error = {'code': status[0], 'text': status[1]}
    elif program is None:
        error = {'code': supervisors.NOT_LISTED, 'text': say.not_listed(found['program_pid'])}
    program_id, name = program or ((service, os.path.basename(service)) if service else (None, None))
    new = gpu_owner.new_owner(gpu_owner.SUPERVISOR, owner['cgroup'], runtime=runtime, id=program_id, name=name,
                              unit=owner['unit'], manager=owner['manager'], controlled_by=owner['controlled_by'],
                              uid=owner['uid'], confirmed=owner['confirmed'], cli_error=error,
                              supervisor=dict((k, v) for k, v in found.items() if k != 'runtime'))
    new['cli_error'] = error or surveyor.supervisor_errors.get(supervisors.key(new))
    return new


def survey_result(survey):
    """The result keys gpu_holders returns."""
    return {
        'gpus': survey.rows,
        'holders': survey.holders_of_selected(),
        'clients': survey.clients,
        'free': survey.free,
        'diagnosis': survey.diagnosis,
        'backend': survey.snapshot.backend,
        'scan': survey.snapshot.scan,
    }


# How long the ladder watches for a guest's systemd to restart what it killed from the host:
# systemd's default RestartSec is 100 ms; the rest covers a slow start of the new process.
GUEST_RESPAWN_WATCH_S = 5.0


_guest_unit = lever.guest_unit


class Ladder(object):
    """stop container -> stop supervised program -> stop unit -> SIGTERM -> SIGKILL -> rescan -> wait for memory -> optional reset.

    Each pass reads plan (gpu_lever: the levers of what holds the selected GPUs), pull (the
    owners' stops, then the signals), watch (gpu_respawn.Comebacks: everything that could bring
    a holder back) and verify (a new survey).

    One path for real runs and check mode: the actor decides whether a step acts or is only
    recorded; every step is a gpu_act.Action in self.actions.
    """

    def __init__(self, surveyor, term_timeout=_default('term_timeout'),
                 release_timeout=_default('release_timeout'), passes=_default('passes'),
                 stop_units=_default('stop_units'), match=None, force=_default('force'),
                 allow_reset=_default('allow_reset'), check_mode=False, clock=time.monotonic,
                 actor=None, stop_containers=_default('stop_containers'), peers=_default('peers'),
                 stop_supervised=_default('stop_supervised')):
        self.surveyor = surveyor
        self.term_timeout = term_timeout
        self.release_timeout = release_timeout
        self.passes = passes
        self.stop_units = stop_units
        self.stop_containers = stop_containers
        self.stop_supervised = stop_supervised
        self.match = pattern_set(match, 'match')
        if self.match:
            surveyor.pattern_sets.append(self.match)
        self.peers = peers
        self.force = force
        self.allow_reset = allow_reset
        self.clock = clock
        if actor is None:
            actor = act.RecordingActor(clock) if check_mode else act.HostActor(clock)
        self.actor = actor
        self.started = None
        self.actions = []
        self.killed = set()       # (pid, start_time) that already got SIGKILL: never again
        self.ended_gpus = set()   # GPUs whose holders this run signalled or whose units it stopped
        self.unreachable = set()  # PIDs alive after SIGKILL
        # What can bring a holder back (units, containers, ancestors, the settle window, guests).
        self.watch = respawn.Comebacks(surveyor, clock, observe.ProcError)

    def _record(self, action, since=None):
        now = self.clock()
        action.at_s = round(now - self.started, 3)
        if since is not None:
            action.took_s = round(now - since, 3)
        self.actions.append(action)
        return action

    def _look(self, full=False):
        """A new survey, as check mode's recorded steps would have left it.

        The ladder signals context holders only, so it reads only the processes NVML lists
        when they explain all the memory (Surveyor.survey); peers are found by their
        mappings, and a reset is skipped while any process has the device open: both need
        every process read.
        """
        survey = self.surveyor.survey(full=full or self.peers)
        return self._claimed(self.surveyor.without(survey, self.actor.ended))

    def _claimed(self, survey):
        """The survey, with every selected GPU that a holder of a guest unit seen restarting has
        open read as not free, whatever its memory reads at that instant: the restarted server
        opens the device before it takes its memory (a real one loads its weights first). The
        soak's guest trials (seed 3005: 6, 43, 78) saw the comeback 0.2 s after the kill with
        its GPU still reading free, and the failure named only another GPU's protected holder."""
        units = self.watch.guest_units
        if not units:
            return survey
        claimed = set(g for h in survey.holders_of_selected() if _guest_unit(h) in units for g in h['gpus'])
        for row in survey.rows:
            if row['index'] in claimed:
                row['free'] = False
        return survey

    # --- the ladder -------------------------------------------------------------------------

    def run(self):
        self.started = self.clock()
        # One driver session for the whole run: every wait reads the GPUs again (gpu_nvidia.
        # NvmlBackend.hold_session says what an init per read cost).
        self.surveyor.backend.hold_session()
        try:
            return self._run()
        finally:
            self.surveyor.backend.end_session(self.surveyor.nvml_timeout)

    def _run(self):
        first = self.surveyor.survey(full=self.peers)
        if first.free:
            return self._result(first, first)
        try:
            last = self._climb(first)
        except (observe.ObserveError, pattern_error()) as exc:
            # The driver stopped answering after the ladder acted: say what was done so far, and
            # let go of what it froze (the host no worse than it was found).
            self._thaw()
            return self._interrupted(first, exc)
        # Check mode changed nothing: the GPUs are as the first survey found them.
        return self._result(first, first if self.actor.recording else last)

    def _climb(self, first):
        """The ladder proper, from the first survey to the last; returns the last survey. Each
        pass: plan (the levers for what holds the selected GPUs), pull (owners' stops, then the
        signals), watch (what could bring a holder back), verify (a new survey)."""
        protected_units = self.surveyor.protected_units()
        protected_containers = self.surveyor.protected_containers()
        current = first
        for attempt in range(self.passes + 1):
            # Containers first: a container's init is reachable no other way, and its restart
            # policy brings back whatever is killed inside.
            if self.stop_containers and self._stop_containers(current, protected_containers):
                current = self._look()
                if current.free:
                    break
            if self.stop_supervised and self._stop_supervised(current):
                current = self._look()
                if current.free:
                    break
            targets = self._plan(current)
            if not targets or self.watch.respawners:
                break
            if attempt > 0:
                self._record(act.Action('rescan', 'GPU %s' % _indices(current.selected),
                                        say.step(lever.RESCAN_FOUND, count=len(targets)), False,
                                        pids=[t['pid'] for t in targets]))
            self._watch_parents(targets)
            self._escalate(targets, protected_units)
            current, left = self._verify(targets)
            if self._respawned(current):
                continue
            # Not free, and something left can still be ended: another round. Not free only
            # because of holders the ladder may not end (protected, outside match) or memory
            # still coming back: the respawners of what was ended are watched all the same, or
            # a loop restarts its holder on a GPU the run then leaves held unnamed (the soak,
            # bench/soak_bench.py: a loop beside a protected holder on another GPU).
            if not current.free and (left if left is not None else self._targets(current)):
                continue
            if not self._settle(current):
                break
            current = self._look()
        self._give_up_respawns()
        if not current.free:
            current = self._wait_release(current)
        if not current.free and self.allow_reset:
            current = self._reset(self._look(full=True))
        return current

    def _plan(self, survey):
        """This pass's targets: the holders to signal, and the respawners (with what they
        started) to end, each once."""
        targets = self._targets(survey) + self.watch.take_next_targets()
        return _unique([t for t in targets if (t['pid'], t['start_time']) not in self.killed])

    def _verify(self, signalled):
        """A new survey after the pull. The guests' systemd of what this run killed, in this pass
        or an earlier one, is watched for a comeback before the run can end: when the survey
        reads free, or when nothing left can be signalled (a protected holder keeps another GPU).
        The soak found both holes (bench/README, seed 3002: a guest unit's holder killed in pass 1
        while a fork-inherited holder needed pass 2 was never watched).

        Returns (the survey, its targets where they were planned here, else None): the pass that
        follows asks for them again only when they were not (each survey is planned once)."""
        self.watch.guest_pending |= set(_guest_unit(t) for t in signalled) - set([None])
        current = self._look()
        left = self._targets(current) if self.watch.guest_pending and not current.free else None
        if current.free or (self.watch.guest_pending and not left):
            return self._watch_guest_respawn(current), None
        return current, left

    def _targets(self, survey):
        """The holders to signal: not those a guest's systemd was seen restarting, nor, without
        the container lever, those a container's restart policy would only bring back (both are
        named in the failure instead)."""
        targets = decide.plan_targets(survey.holders, survey.selected, self.match, survey.spared_pids,
                                      self.peers)[0]
        targets = [t for t in targets if _guest_unit(t) not in self.watch.guest_units]
        if self.stop_containers:
            return targets
        return [t for t in targets if lever.container_lever(t).watch != lever.WATCH_CONTAINER]

    def _watch_guest_respawn(self, survey):
        """After killing processes of a guest's service from its host, watch for the guest's own
        systemd to start them again (this host can neither see nor stop that unit): poll the
        GPUs for up to GUEST_RESPAWN_WATCH_S for a holder of one of those units, and return the
        survey that shows the comeback, or the last one."""
        units, self.watch.guest_pending = self.watch.guest_pending, set()
        if not units or self.actor.recording:
            return survey
        seen = {'survey': survey}

        def came_back():
            seen['survey'] = self._look()
            return any(_guest_unit(h) in units for h in seen['survey'].holders_of_selected())

        since = self.clock()
        back, waited = self.actor.wait_until(came_back, GUEST_RESPAWN_WATCH_S)
        watched = sorted(u[1] for u in units)
        if not back:
            self._record(act.Action('watch_respawn', ', '.join(watched), say.step(lever.GUEST_NOT_BACK, waited=waited),
                                    False, guest_units=watched), since)
            return seen['survey']
        again = [h for h in seen['survey'].holders_of_selected() if _guest_unit(h) in units]
        self.watch.guest_units |= set(_guest_unit(h) for h in again)
        self._claimed(seen['survey'])
        self._record(act.Action('watch_respawn', ', '.join(watched), say.step(lever.GUEST_BACK, waited=waited, holders=again),
                                False, guest_units=watched), since)
        return seen['survey']

    def _stop_containers(self, survey, protected_ids):
        """Stop the containers owning holders of the selected GPUs; True when any was asked."""
        levers = self._plan_owners(survey, protected_ids)
        for chosen in levers:
            self.watch.containers.add(chosen.key)
            self._pull(chosen)
        return bool(levers)

    def _plan_owners(self, survey, protected_ids):
        """The container levers for the holders of the selected GPUs (gpu_lever.container_lever),
        each container once and never twice a run."""
        selected, levers = set(survey.selected), []
        for holder in survey.holders:
            if holder['pid'] in survey.spared_pids or not set(holder['context_gpus']) & selected:
                continue
            chosen = lever.container_lever(holder, self.match, protected_ids)
            if chosen.refusal is None and chosen.key not in self.watch.containers \
                    and all(chosen.key != other.key for other in levers):
                levers.append(chosen)
        return levers

    def _pull(self, chosen, holders=()):
        """Pull an owner's lever (gpu_lever.Lever) through the actor; records the step and returns
        whether it changed the host. `holders`: the supervised holders a supervisor's stop ends."""
        grace = 0 if self.force else self.term_timeout
        since = self.clock()
        owner = chosen.owner
        if chosen.kind == lever.STOP_CONTAINER:
            result, changed = self.actor.stop_container(owner, grace)
            action = act.Action('stop_container', gpu_owner.describe(owner), result, changed,
                                container=owner['id'], runtime=owner['runtime'], name=owner['name'])
        elif chosen.kind == lever.STOP_SUPERVISED:
            result, changed, error = self.actor.stop_supervised(owner, holders, grace, self.surveyor.nvml_timeout)
            if changed:
                self.ended_gpus.update(g for h in holders for g in h['gpus'])
            if error:
                self.surveyor.supervisor_errors[chosen.key] = error
            action = act.Action('stop_supervised', supervisors.describe(owner), result, changed,
                                runtime=owner['runtime'], program=owner['name'], unit=owner['unit'],
                                command=supervisors.manual(owner))
        elif chosen.kind == lever.STOP_UNIT:
            result, changed = self.actor.stop_unit(chosen.key, grace)
            action = act.Action('stop_unit', chosen.key, result, changed, unit=chosen.key)
        else:
            uid, unit = chosen.key
            result, changed = self.actor.stop_user_unit(uid, unit, grace)
            action = act.Action('stop_user_unit', unit, result, changed, unit=unit, uid=uid)
        if changed and chosen.kind in (lever.STOP_UNIT, lever.STOP_USER_UNIT):
            self.watch.units.add(chosen.key)
        self._record(action, since)
        return changed

    def _stop_supervised(self, survey):
        """Stop, through its own supervisor, the program of each supervised holder of the selected
        GPUs (gpu_lever.supervised_lever), and watch that it stays down; True when any was asked.
        A failure is kept on the surveyor, so the holder is named with it, never signalled."""
        holders = [h for h in survey.holders if h['pid'] not in survey.spared_pids]
        selected, levers = set(survey.selected), []
        for holder in holders:
            if not set(holder['context_gpus']) & selected:
                continue
            chosen = lever.supervised_lever(holder, self.match)
            if chosen.refusal is None and chosen.key not in self.watch.supervised \
                    and all(chosen.key != other.key for other in levers):
                levers.append(chosen)
        for chosen in levers:
            self.watch.supervised.add(chosen.key)
            self._pull(chosen, [h for h in holders if supervisors.key(h['owner']) == chosen.key])
        return bool(levers)

    # --- respawns (gpu_respawn: which ancestors are watched, what counts as a respawn) -----------

    def _watch_parents(self, targets):
        """Before ending targets, watch their live ancestors (gpu_respawn.Watch.add)."""
        if not self.actor.recording:
            self.watch.parents.add(targets)

    def _respawned(self, survey):
        """A watched ancestor that already brought a holder back (it runs an ended program again,
        or holds a context on the selected GPUs) is dealt with: made the target, or named. True
        when one did."""
        if not self.watch.parents.watched():
            return False
        holders = set(h['pid'] for h in survey.holders_of_selected() if h['context_gpus'])
        found = self.watch.parents.poll(holders)
        for pid, new_pids in sorted(found.items()):
            self._respawn(pid, new_pids, survey)
        return bool(found)

    def _settle(self, survey):
        """The GPUs read free: watch the live watched ancestors for up to gpu_respawn.WATCH_S, and
        no longer than one of them lives. True when one brought a holder back (handled)."""
        watched = self.watch.parents.watched()
        if not watched:
            return False
        found = {}

        def respawn_seen_or_none_left():
            found.update(self.watch.parents.poll())
            return bool(found) or not self.watch.parents.watched()

        since = self.clock()
        self.actor.wait_until(respawn_seen_or_none_left, respawn.WATCH_S)
        for pid, new_pids in sorted(found.items()):
            self._respawn(pid, new_pids, survey)
        if not found:
            took = self.clock() - since
            alive = self.watch.parents.watched()
            if alive:
                result = say.step(lever.SETTLE_BOUND, bound=respawn.WATCH_S, alive=alive)
            else:
                result = say.step(lever.SETTLE_NONE_ALIVE, took=took)
            self._record(act.Action('settle', 'PID %s' % ', '.join(str(p) for p in watched), result, False,
                                    pids=watched, watched_s=round(took, 3), bound_s=respawn.WATCH_S), since)
        return bool(found)

    def _respawn(self, pid, new_pids, survey):
        """Ancestor `pid` brought a holder back as `new_pids`: when decide allows, it and every
        process started under it since the watch began are frozen (SIGSTOP, so none can start
        another) and become the next targets; otherwise it is named in the failure."""
        entry = self.watch.parents.pop(pid)
        try:
            parent = self.surveyor.describe(pid, survey.snapshot)
        except observe.ProcessGone:
            return
        if parent['start_time'] != entry.start_time:
            return
        holds_gpu = any(h['pid'] == pid for h in survey.holders)
        refusal = lever.respawner_lever(parent, self.match, holds_gpu).refusal
        back = {'ended': entry.ended, 'new_pids': new_pids, 'after_s': self.clock() - entry.since}
        if refusal:
            self.watch.respawners.append(dict(parent, reason=say.respawner_refusal(parent, refusal),
                                              respawned=say.came_back(**back)))
            result = say.step(lever.RESPAWNER_REFUSED, back=back, parent=parent, refusal=refusal)
        else:
            result = say.step(lever.RESPAWNER_TARGET, back=back, depth=entry.depth)
        self._record(act.Action('respawn', say.who(parent), result, False, pid=pid, name=parent['name'],
                                pids=list(new_pids)))
        if not refusal:
            self.watch.next_targets += self._freeze(parent, entry, survey)

    def _freeze(self, parent, entry, survey):
        """SIGSTOP the respawner, then, top down, what started under it since the watch began,
        until nothing new appears: a stopped process forks nothing, so no restarted worker
        escapes between this look and the signals. Returns them (state stopped: the ladder sends
        SIGCONT right after SIGTERM)."""
        frozen, seen = [], set()
        candidates = [parent]
        for _round in range(8):
            for holder in candidates:
                action = self._signal(holder, signal.SIGSTOP)
                if action.changed:
                    holder['state'] = 'stopped'
                    self.watch.frozen[(holder['pid'], holder['start_time'])] = holder
                    frozen.append(holder)
            fresh = [p for p in self.watch.parents.new_descendants(entry) if p not in seen]
            seen.update(fresh)
            candidates = []
            for pid in fresh:
                try:
                    child = self.surveyor.describe(pid, survey.snapshot)
                except observe.ProcessGone:
                    continue
                if not child['protected']:
                    child['kind'] = 'respawned'
                    candidates.append(child)
            if not candidates:
                break
        return frozen

    def _give_up_respawns(self):
        """Respawners still to be ended when the passes ran out are named, not ended, and what it
        froze is let go (SIGCONT): the host is left as it was found."""
        for target in self.watch.take_next_targets():
            if target['kind'] == 'respawner' and (target['pid'], target['start_time']) not in self.killed:
                self.watch.respawners.append(dict(target, reason=say.respawner_refusal(target, lever.PASSES_RAN_OUT),
                                                  respawned='see actions'))
        self._thaw()

    def _thaw(self):
        """SIGCONT to what the ladder froze and has not let go since, the last frozen first."""
        for key, holder in reversed(list(self.watch.frozen.items())):
            if key not in self.killed:
                self._signal(holder, signal.SIGCONT)
        self.watch.frozen.clear()

    # --- signals ----------------------------------------------------------------------------

    def _escalate(self, targets, protected_units):
        if self.stop_units:
            # A supervisor's unit is never stopped whole (it ends every program it runs): a holder
            # left in it outside the supervisor (an orphan of a stopped program) is signalled.
            protected_units = set(protected_units) | set(self.surveyor.supervisor_units)
            # A user's own service goes through her own manager, run as her: it can stop
            # nothing she could not stop herself. System units first, then users' units.
            levers = self._plan_units(targets, protected_units)
            for chosen, owned in levers:
                if self._pull(chosen):
                    self.ended_gpus.update(g for t in owned for g in t['gpus'])
            if levers:
                targets = self.actor.alive(targets)
        killed = []
        if not self.force:
            terms = [(h, self._signal(h, signal.SIGTERM)) for h in targets]
            # A stopped process acts on SIGTERM only once continued: SIGCONT right after it, as
            # systemd does.
            for holder, action in terms:
                if action.changed and holder['state'] == 'stopped':
                    self._signal(holder, signal.SIGCONT)
                    self.watch.frozen.pop((holder['pid'], holder['start_time']), None)
            # A process whose SigIgn mask holds SIGTERM provably ignores it (SGLang's schedulers
            # before their first request, say), and a traced stopped one cannot act on it:
            # waiting out the grace for them frees nothing.
            codes = [decide.sigterm_futile_code(h) for h in targets]
            futile = [h for h, code in zip(targets, codes) if code]
            for (holder, action), code in zip(terms, codes):
                if code and action.changed and not self.actor.recording:
                    action.result = say.step(lever.SENT_FUTILE, why=say.sigterm_futile(holder, code))
            killed = [self._kill(h) for h in futile]
            listening = [(h, a) for h, a in terms if h not in futile]
            self._wait_outcomes(listening, self.term_timeout, 'SIGTERM')
            targets = self.actor.alive([h for h, _action in listening])
        killed += [self._kill(h) for h in targets]
        # SIGKILL is final for every process that is not stuck in the kernel; bound the wait
        # so a D-state process is reported, not waited on forever.
        self._wait_outcomes(killed, max(self.term_timeout, 1.0), 'SIGKILL')
        for holder, _action in killed:
            if self.actor.alive([holder]):
                self.unreachable.add(holder['pid'])
                self._record(act.Action('unreachable', say.who(holder),
                                        say.step(lever.ALIVE_AFTER_KILL_STEP, state=self.actor.state_of(holder)),
                                        False, pid=holder['pid'], name=holder['name']))

    def _plan_units(self, targets, protected_units):
        """[(lever, the targets it ends)] of the units owning targets that may be stopped: the
        system manager's (gpu_lever.unit_lever), then users' own (user_unit_lever)."""
        vendor_units = self.surveyor.backend.infrastructure_units
        planned = []
        for make in (lambda t: lever.unit_lever(t, protected_units, vendor_units, is_protected=decide.protected_unit),
                     lever.user_unit_lever):
            chosen = [(t, make(t)) for t in targets]
            keys = []
            for _target, one in chosen:
                if one.refusal is None and one.key not in keys:
                    keys.append(one.key)
                    planned.append((one, [t for t, other in chosen if other.refusal is None and other.key == one.key]))
        return planned

    def _wait_outcomes(self, sent, timeout, signame):
        """Wait for the processes `sent` (holder, action) a signal to exit; say in each action
        what happened."""
        gone_at = self.actor.wait_gone([h for h, _action in sent], timeout)
        if self.actor.recording:
            return
        for holder, action in sent:
            if not action.changed:
                continue
            if holder['pid'] in gone_at:
                action.took_s = round(max(0.0, gone_at[holder['pid']] - self.started - action.at_s), 3)
                action.result = say.step(lever.EXITED, signal=signame, took=action.took_s)
            elif signame == 'SIGTERM':
                action.result = say.step(lever.STILL_RUNNING, signal=signame, took=timeout)

    def _kill(self, holder):
        action = self._signal(holder, signal.SIGKILL)
        self.killed.add((holder['pid'], holder['start_time']))
        return holder, action

    def _signal(self, holder, signum):
        result, changed = self.actor.signal(holder, signum, self.surveyor.own_ancestors)
        if changed:
            self.ended_gpus.update(holder['gpus'])
        step = act.SIGNAL_NAMES[signum].lower()
        return self._record(act.Action(step, say.who(holder), result, changed, pid=holder['pid'],
                                       name=holder['name'], gpus=holder['gpus']))

    def _wait_release(self, survey):
        """Wait for the memory of the GPUs that can still come back; end at once when none can.

        A GPU cannot come back while a holder the ladder may not or could not end (protected,
        out of `match`, a zombie, alive after SIGKILL) keeps its context; memory no visible
        process holds, on a GPU the ladder ended nothing on, is waited for only while it falls.
        """
        selected, spared = survey.selected, survey.spared_pids
        targets, left = decide.plan_targets(survey.holders, selected, self.match, spared)
        keepers = dict((h['pid'], h) for h in left)
        keepers.update((h['pid'], h) for h in targets if h['pid'] in self.unreachable)
        # A guest's systemd seen restarting what was killed from here brings it back as often as
        # it is killed, and this host cannot stop that unit: its GPU is not waited for.
        keepers.update((h['pid'], h) for h in targets if _guest_unit(h) in self.watch.guest_units)
        hopeful, blocked, unseen = [], {}, []
        for row in survey.rows:
            if row['free']:
                continue
            kept = [keepers[pid] for pid in row['holders'] if pid in keepers]
            if kept:
                blocked[row['index']] = kept
            elif row['holders'] or row['index'] in self.ended_gpus:
                hopeful.append(row['index'])
            else:
                unseen.append(row['index'])
        if unseen and self._falling(unseen, spared):
            hopeful += unseen
            unseen = []
        if not hopeful:
            restarting = self.watch.guest_units
            held = [(index, [(h, _held_code(h, self.unreachable, restarting)) for h in kept])
                    for index, kept in sorted(blocked.items())]
            self._record(act.Action('wait_release', 'GPU %s' % _indices(selected),
                                    say.step(lever.NOT_WAITED, blocked=held, unseen=unseen),
                                    False, gpus=selected, waited_s=0.0))
            return survey
        back, waited = self.actor.wait_until(lambda: self.surveyor.memory_back(hopeful, spared),
                                             self.release_timeout)
        if self.actor.recording:
            result = say.step(lever.WOULD_WAIT, timeout=self.release_timeout)
        elif back:
            result = say.step(lever.MEMORY_BACK, waited=waited)
        else:
            result = say.step(lever.MEMORY_HELD, waited=waited)
        self._record(act.Action('wait_release', 'GPU %s' % _indices(hopeful), result, False,
                                gpus=hopeful, waited_s=round(waited, 3)))
        return self._look()

    def _falling(self, indices, spared):
        """Whether the used memory of any of these GPUs falls within FALLING_S."""
        first = self.surveyor.used_mib(indices, spared)
        return self.actor.wait_until(
            lambda: any(used < first.get(index, used) for index, used in
                        self.surveyor.used_mib(indices, spared).items()), FALLING_S)[0]

    def _reset(self, survey):
        reset = False
        # nvidia-smi --gpu-reset refuses while any process, this one too, has the device open.
        self.surveyor.backend.end_session(self.surveyor.nvml_timeout)
        for row in survey.rows:
            if row['free']:
                continue
            target = 'GPU %d' % row['index']
            users = [h for h in survey.holders if row['index'] in h['gpus']]
            if users:
                self._record(act.Action('reset', target, say.step(lever.RESET_SKIPPED, pids=[h['pid'] for h in users]),
                                        False, gpu=row['index']))
                continue
            for what, argv in self.surveyor.backend.reset_commands(row['index'], row['persistence_mode']):
                since = self.clock()
                result, changed = self.actor.run(argv, self.surveyor.nvml_timeout)
                self._record(act.Action(what, target, result, changed, gpu=row['index']), since)
                if what == 'reset' and changed:
                    reset = True
                    self.ended_gpus.add(row['index'])
        return self._wait_release(survey) if reset else survey

    # --- the report -------------------------------------------------------------------------

    def _changed(self):
        """Something was stopped, signalled or reset (in check mode: would be)."""
        return any(a.changed for a in self.actions)

    def _common(self, first):
        return {
            'changed': self._changed(),
            'actions': [a.as_result() for a in self.actions],
            'before': first.rows,
            'elapsed_s': round(self.clock() - self.started, 3),
            'holders': first.holders_of_selected(),
            'backend': first.snapshot.backend,
        }

    def _interrupted(self, first, exc):
        result = self._common(first)
        result.update({
            'after': [],
            'free': False,
            'spared': first.spared,
            'remaining': [],
            'diagnosis': first.diagnosis,
            'msg': say.interrupted(exc, len(self.actions)),
        })
        return result

    def _result(self, first, last):
        result = self._common(first)
        remaining = []
        if not last.free:
            targets, left = decide.plan_targets(last.holders, last.selected, self.match, last.spared_pids,
                                                self.peers)
            remaining = left + [dict(t, reason=say.remaining(decide.SURVIVED), reason_code=decide.SURVIVED)
                                for t in targets]
            held = set(row['index'] for row in last.rows if not row['free'])
            seen = set(h['pid'] for h in remaining) | last.spared_pids
            # Handles on a GPU still held block its reset; name them, never signal them. A peer
            # mapper is named with what holds the memory and the lever (peers: true).
            for h in last.holders:
                if h['pid'] in seen or not set(h['gpus']) & held:
                    continue
                peer_held = sorted(held & set(h['peer_gpus']))
                if peer_held:
                    remaining.append(dict(h, reason=say.remaining(decide.PEER_MEMORY, peer_held),
                                          lever=say.peer_lever(h, peer_held[0]), reason_code=decide.PEER_MEMORY))
                else:
                    remaining.append(dict(h, reason=say.remaining(decide.DEVICE_OPEN), reason_code=decide.DEVICE_OPEN))
        for parent in self.watch.respawners:
            remaining.append(dict(((k, v) for k, v in parent.items() if k != 'respawned'), reason_code=decide.RESPAWNS))
        result.update({
            'after': last.rows,
            'free': last.free and not self.watch.respawners,
            'spared': last.spared,
            'remaining': remaining,
            'diagnosis': last.diagnosis,
        })
        if not result['free'] and not self.actor.recording:
            result['msg'] = say.failure_message(last.rows, remaining, result['elapsed_s'], self.allow_reset,
                                                self.watch.respawners, say.blind(self.surveyor.access))
        return result


def _unique(holders):
    seen, out = set(), []
    for holder in holders:
        if holder['pid'] not in seen:
            seen.add(holder['pid'])
            out.append(holder)
    return out


def _held_code(holder, unreachable, restarting_guest_units=frozenset()):
    """Why a holder keeps its GPU, so the GPU is not waited for (gpu_say.held writes it)."""
    if holder['pid'] in unreachable:
        return lever.ALIVE_AFTER_KILL
    if _guest_unit(holder) in restarting_guest_units:
        return lever.GUEST_RESTARTS
    return lever.LEFT


def _indices(selected):
    return ','.join(str(i) for i in selected)
