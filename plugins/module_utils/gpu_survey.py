# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The survey (observe + decide): what holds the selected GPUs, each holder classified with its
owner, whose facts each owner family (gpu_families) reads. gpu_holders returns one survey;
gpu_flow's Ladder takes one after every step.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_access as access
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_families as families
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_respawn as respawn
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_vendor as vendor


SURVEY_ARGUMENT_SPEC = dict(
    gpus=dict(type='list', elements='str', default=[]),
    exclude=dict(type='list', elements='str', default=[]),
    nvml_timeout=dict(type='float', default=10.0),
    protect=dict(type='list', elements='str', default=[]),
    free_threshold_mib=dict(type='int', default=128),
)


# gpu_reclaim's own options; documented in its DOCUMENTATION.
def _default(name):
    return SURVEY_ARGUMENT_SPEC[name]['default']


def survey_param_error(params):
    """What is wrong with the survey options (ranges argument_spec cannot express), or None."""
    if params['nvml_timeout'] <= 0:
        return 'nvml_timeout must be greater than 0, got %s' % params['nvml_timeout']
    if params['free_threshold_mib'] < 0:
        return 'free_threshold_mib must be 0 or more, got %s' % params['free_threshold_mib']
    if vendor.available_backend() is None:
        return vendor.NO_BACKEND
    return None


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
        return frozenset(h.pid for h in self.spared)

    def holders_of_selected(self):
        chosen = set(self.selected)
        return [h for h in self.holders if set(h.gpus) & chosen]


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
            if owner.kind == gpu_owner.CONTAINER and owner.id:
                ids.add(owner.id)
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
        # Owners are resolved before any holder is built (issue 32 item 2): each holder is
        # built once, with its final owner.
        sorted_procs = decide.sort_processes(snapshot, self.free_threshold_mib)
        named, owners = self._owners([held.proc for held in sorted_procs[0]], units, facts)
        holders, clients, unconfirmed = decide.classify(snapshot, self.protect, own_tree, units,
                                                        self.free_threshold_mib, facts, owners, sorted_procs,
                                                        named)
        spared = [h for h in holders if h.unit in self.spare_units and set(h.gpus) & set(selected)]
        survey = self._survey(snapshot, selected, holders, clients, unconfirmed, spared)
        held = set(row['index'] for row in survey.rows if not row['free'])
        explained = set(index for holder in holders
                        for index in holder.context_gpus + holder.peer_gpus)
        if not snapshot.deep and held - explained:
            # Memory is held and no context explains it: a process may have closed its fds
            # but kept its mappings. Read every process's maps before calling it invisible.
            # (Memory charged to no PID made the scan deep at once: see _uncharged.)
            return self.survey(deep=True, full=True)
        return survey

    def _owners(self, procs, units, facts):
        """(named, final) for `procs` (gpu_observe.ProcState of holders), each PID -> an owner:
        named, the owner its cgroup names, confirmed (gpu_decide.cgroup_owner: protection is
        judged on it); final, a container's, pod's or guest's named by its runtime (named_owner),
        the program of a process supervisor where one runs it (gpu_family_supervisor, by
        identity on its ancestry), else the named one."""
        found = dict((proc.pid, decide.cgroup_owner(proc, units, facts)) for proc in procs)
        programs = families.SUPERVISOR.recognise_all(procs, found, units, self.nvml_timeout, self, self.proc)
        return found, dict((pid, programs.get(pid) or named_owner(owner, self.nvml_timeout, self.owner_details))
                           for pid, owner in found.items())

    def _uncharged(self, gpus):
        """Whether a selected GPU uses memory the driver charges to no process (a leak, a holder
        outside this PID namespace, one that closed its fds but kept its mappings): then no fd
        alone can explain it, and the survey reads every process's fds and maps in one pass
        instead of reading the fds, classifying, and reading everything again (bench/run scan,
        "gpu_holders + leak": 1.78x fuser in two passes)."""
        selected = set(decide.resolve_gpus(self.requested, gpus, self.exclude))
        return bool(decide.uncharged_gpus(gpus, selected, self.free_threshold_mib))

    def _survey(self, snapshot, selected, holders, clients, unconfirmed, spared):
        spared_pids = frozenset(h.pid for h in spared)
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
        ended_pids = set(h.pid for h in survey.holders if (h.pid, h.start_time) in ended)
        snapshot = decide.snapshot_without(survey.snapshot, survey.holders, ended_pids)
        keep = [h for h in survey.holders if h.pid not in ended_pids]
        return self._survey(snapshot, survey.selected, keep, survey.clients, survey.unconfirmed,
                            [h for h in survey.spared if h.pid not in ended_pids])

    def _facts_of(self, snapshot):
        """What the managers and runtimes confirm about the owners of the snapshot's processes
        (gpu_trust.confirm): (system units, {'user_units', 'runtimes', 'vendor_units'}).

        Units are read anew at every survey (a unit the ladder stopped must show as stopped);
        a runtime is asked once per container and run.
        """
        stores = {'units': {}, 'user_units': {}, 'runtimes': self.owner_details}
        units = stores['units']
        for proc in snapshot.procs.values():
            owner = gpu_owner.owner_from_cgroup(proc.cgroup, proc.cgroup_uids)
            for family in families.LADDER:   # the first family with facts of this owner reads them
                key = family.facts_key(owner)
                if key is not None:
                    store = stores[family.store]
                    if key not in store:
                        store[key] = family.facts(owner, self.nvml_timeout)
                    break
            if owner.kind == gpu_owner.USER and owner.uid is not None:
                # Her manager (user@UID.service's MainPID) is the system's, not hers: it may
                # respawn her holders, and is then named, never signalled.
                manager = 'user@%d.service' % owner.uid
                if manager not in units:
                    units[manager] = observe.unit_restart_policy(manager)
        facts = {'user_units': stores['user_units'], 'runtimes': self.owner_details,
                 'vendor_units': self.backend.infrastructure_units}
        self.last_facts = (units, facts)
        return units, facts

    def holder_of(self, pid, snapshot):
        """The gpu_holder.Holder of any process (a respawning parent, its new child); raises
        gpu_observe.ProcessGone."""
        proc = observe.read_process(pid, self.proc)
        units, facts = self.last_facts
        return decide.holder_of(proc, snapshot, [], {}, set(), 'respawner', self.protect,
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
        proc = observe.read_process(pid, self.proc)
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


def named_owner(owner, timeout, asked):
    """A container's, pod's or guest's owner record with its readable name, restart policy and
    pod from its runtime's CLI (its family's facts), a new record; any other owner as it is.
    Each owner's runtime is asked once (`asked` keeps the answers between surveys)."""
    family = next((f for f in families.LADDER if f.store == 'runtimes' and f.owns(owner)), None)
    if family is None or not owner.id:
        return owner
    key = (owner.runtime, owner.id)
    if key not in asked:
        asked[key] = family.facts(owner, timeout)
    details = dict(asked[key])
    pod = details.pop('pod', None)
    for fact in ('pid', 'init_cgroup'):   # the runtime's confirmation (gpu_trust.confirm)
        details.pop(fact, None)
    fields = dict((k, v) for k, v in details.items() if v is not None)
    fields['cli_error'] = details.get('cli_error')
    if pod and owner.kind == gpu_owner.POD:
        fields['pod'] = dict(owner.pod or {}, **dict((k, v) for k, v in pod.items() if v))
    return owner._replace(**fields)


def survey_result(survey):
    """The result keys gpu_holders returns."""
    return {
        'gpus': survey.rows,
        'holders': [h.as_result() for h in survey.holders_of_selected()],
        'clients': [c.as_result() for c in survey.clients],
        'free': survey.free,
        'diagnosis': survey.diagnosis,
        'backend': survey.snapshot.backend,
        'scan': survey.snapshot.scan,
    }
