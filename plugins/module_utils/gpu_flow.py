# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The reclaim flow: the escalation ladder over a survey (gpu_survey).

observe -> decide -> act -> verify -> report, one way. The ladder has one path: each step
goes through an actor (gpu_act.HostActor acts, gpu_act.RecordingActor only records, for check
mode) and comes back as a gpu_act.Action. Each owner's lever is its family's (gpu_families,
walked in order). It never sleeps a guessed time: each wait polls the kernel or the driver and
ends as soon as the answer is known.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import signal
import time

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act as act
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_families as families
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family as family
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family_guest as guests
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_respawn as respawn
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_result
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say
# The survey's names, as the modules and tests import them from here.
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_survey import (  # noqa: F401 pylint: disable=unused-import
    SURVEY_ARGUMENT_SPEC, Survey, Surveyor, pattern_error, pattern_set, survey_param_error,
    survey_result, surveyor_from_params)

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
    return RECLAIM_ARGUMENT_SPEC[name]['default']


def reclaim_param_error(params):
    """What is wrong with gpu_reclaim's own options, or None."""
    for name in ('term_timeout', 'release_timeout', 'passes', 'lock_timeout'):
        if params[name] < 0:
            return '%s must be 0 or more, got %s' % (name, params[name])
    return survey_param_error(params)


def ladder_from_params(params, check_mode):
    return Ladder(surveyor_from_params(params, spare_units=params['spare_units']),
                  term_timeout=params['term_timeout'], release_timeout=params['release_timeout'],
                  passes=params['passes'], stop_units=params['stop_units'], match=params['match'],
                  force=params['force'], allow_reset=params['allow_reset'], check_mode=check_mode,
                  stop_containers=params['stop_containers'], peers=params['peers'],
                  stop_supervised=params['stop_supervised'])


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
        self.stop_containers = stop_containers
        # The options that allow each family's lever (gpu_family.Family.option).
        self.options = {'stop_units': stop_units, 'stop_containers': stop_containers,
                        'stop_supervised': stop_supervised}
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
        self.protected = (set(), set())   # the units and containers never stopped (_climb reads them)
        # What can bring a holder back (units, containers, ancestors, the settle window, guests).
        self.watch = respawn.Comebacks(surveyor, clock, observe.ProcError)

    def record(self, action, since=None):
        now = self.clock()
        action.at_s = round(now - self.started, 3)
        if since is not None:
            action.took_s = round(now - since, 3)
        self.actions.append(action)
        return action

    def look(self, full=False):
        """A new survey, as check mode's recorded steps would have left it.

        The ladder signals context holders only, so it reads only the processes NVML lists
        when they explain all the memory (Surveyor.survey); peers are found by their
        mappings, and a reset is skipped while any process has the device open: both need
        every process read.
        """
        survey = self.surveyor.survey(full=full or self.peers)
        return guests.claimed(self.surveyor.without(survey, self.actor.ended), self.watch.guest_units)

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
            return gpu_result.result(self, first, first)
        try:
            last = self._climb(first)
        except (observe.ObserveError, pattern_error()) as exc:
            # The driver stopped answering after the ladder acted: say what was done so far, and
            # let go of what it froze (the host no worse than it was found).
            self._thaw()
            return gpu_result.interrupted(self, first, exc)
        # Check mode changed nothing: the GPUs are as the first survey found them.
        return gpu_result.result(self, first, first if self.actor.recording else last)

    def _climb(self, first):
        """The ladder proper, from the first survey to the last; returns the last survey. Each
        pass: plan (the levers for what holds the selected GPUs), pull (owners' stops, then the
        signals), watch (what could bring a holder back), verify (a new survey)."""
        self.protected = (self.surveyor.protected_units(), self.surveyor.protected_containers())
        current = first
        for attempt in range(self.passes + 1):
            current, done = self._pull_owners(current)
            if done:
                break
            targets = self._plan(current)
            if not targets or self.watch.respawners:
                break
            if attempt > 0:
                self.record(act.Action('rescan', 'GPU %s' % _indices(current.selected),
                                       say.step(lever.RESCAN_FOUND, count=len(targets)), False,
                                       pids=[t.pid for t in targets]))
            self._watch_parents(targets)
            self._escalate(targets)
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
            current = self.look()
        self._give_up_respawns()
        if not current.free:
            current = self._wait_release(current)
        if not current.free and self.allow_reset:
            current = self._reset(self.look(full=True))
        return current

    def _plan(self, survey):
        """This pass's targets: the holders to signal, and the respawners (with what they
        started) to end, each once."""
        targets = self._targets(survey) + self.watch.take_next_targets()
        return _unique([t for t in targets if (t.pid, t.start_time) not in self.killed])

    def _verify(self, signalled):
        """A new survey after the pull. The guests' systemd of what this run killed, in this pass
        or an earlier one, is watched for a comeback before the run can end: when the survey
        reads free, or when nothing left can be signalled (a protected holder keeps another GPU).
        The soak found both holes (bench/README, seed 3002: a guest unit's holder killed in pass 1
        while a fork-inherited holder needed pass 2 was never watched).

        Returns (the survey, its targets where they were planned here, else None): _climb's test
        for something left to end reads them instead of planning that survey again."""
        self.watch.guest_pending |= set(_guest_unit(t) for t in signalled) - set([None])
        current = self.look()
        left = self._targets(current) if self.watch.guest_pending and not current.free else None
        if current.free or (self.watch.guest_pending and not left):
            return guests.watch_comeback(self, current), None
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

    def grace(self):
        """The grace an owner's stop gives its processes: none with `force`."""
        return 0 if self.force else self.term_timeout

    def _context(self):
        """What the families' levers are planned with now (gpu_family.Context). A supervisor's
        unit is never stopped whole (it ends every program it runs): a holder left in it outside
        the supervisor (an orphan of a stopped program) is signalled; each survey may find one."""
        units, containers = self.protected
        return family.Context(self.match, set(units) | set(self.surveyor.supervisor_units), containers,
                              self.surveyor.backend.infrastructure_units, self.grace(), decide.protected_unit)

    def _pull_owners(self, survey):
        """The owners' own stops first, in the families' order (gpu_families: a container's init
        is reachable no other way, and its restart policy or a supervisor's autorestart brings
        back whatever is killed inside), a new survey after each family that pulled. Returns
        (the last survey, whether it reads free after a pull: the ladder is done)."""
        for one in families.LADDER:
            if one.stage == family.OWNERS and self._pull_family(one, survey, self._context()):
                survey = self.look()
                if survey.free:
                    return survey, True
        return survey, False

    def _pull_family(self, one, survey, context, targets=None):
        """Plan and pull a family's levers (gpu_family): over the survey's holders of the selected
        GPUs, or over `targets` (the pass's, for a family whose stage is UNITS); each owner once
        in the pass, never one the family has `seen` pulled this run. Returns the levers pulled
        with the holders each ends ([(lever, holders)])."""
        if not self.options[one.option]:
            return []
        if targets is None:
            selected = set(survey.selected)
            pool = [h for h in survey.holders if h.pid not in survey.spared_pids]
        else:
            selected, pool = None, targets
        planned = [(h, one.lever(h, context)) for h in pool]
        pulled, keys = [], set()
        for holder, chosen in planned:
            if chosen.refusal is not None or chosen.key in keys or not one.candidate(holder, selected) \
                    or one.seen(chosen, self.watch):
                continue
            keys.add(chosen.key)
            pulled.append((chosen, one.owned(chosen, planned)))
        for chosen, owned in pulled:
            since = self.clock()
            result, changed = one.pull(chosen, owned, self)
            one.comeback(chosen, changed, self.watch)
            if changed and one.ends_holders:
                self.ended_gpus.update(g for h in owned for g in h.gpus)
            step, target, details = one.phrase(chosen)
            self.record(act.Action(step, target, result, changed, **details), since)
        return pulled

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
        holders = set(h.pid for h in survey.holders_of_selected() if h.context_gpus)
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
            self.record(act.Action('settle', 'PID %s' % ', '.join(str(p) for p in watched), result, False,
                                   pids=watched, watched_s=round(took, 3), bound_s=respawn.WATCH_S), since)
        return bool(found)

    def _respawn(self, pid, new_pids, survey):
        """Ancestor `pid` brought a holder back as `new_pids`: when decide allows, it and every
        process started under it since the watch began are frozen (SIGSTOP, so none can start
        another) and become the next targets; otherwise it is named in the failure."""
        entry = self.watch.parents.pop(pid)
        try:
            parent = self.surveyor.holder_of(pid, survey.snapshot)
        except observe.ProcessGone:
            return
        if parent.start_time != entry.start_time:
            return
        holds_gpu = any(h.pid == pid for h in survey.holders)
        refusal = lever.respawner_lever(parent, self.match, holds_gpu).refusal
        back = {'ended': entry.ended, 'new_pids': new_pids, 'after_s': self.clock() - entry.since}
        if refusal:
            self.watch.respawners.append(parent.left(lever.RESPAWNS, say.respawner_refusal(parent, refusal),
                                                     respawned=say.came_back(**back)))
            result = say.step(lever.RESPAWNER_REFUSED, back=back, parent=parent, refusal=refusal)
        else:
            result = say.step(lever.RESPAWNER_TARGET, back=back, depth=entry.depth)
        self.record(act.Action('respawn', say.who(parent), result, False, pid=pid, name=parent.name,
                               pids=list(new_pids)))
        if not refusal:
            self.watch.next_targets += self._freeze(parent, entry, survey)

    def _freeze(self, parent, entry, survey):
        """SIGSTOP the respawner, then, top down, what started under it since the watch began,
        until nothing new appears: a stopped process forks nothing, so no restarted worker
        escapes between this look and the signals. Returns them; the Ladder keeps that it froze
        them (Comebacks.frozen, its own state, never the holder's) and sends SIGCONT right after
        SIGTERM."""
        frozen, seen = [], set()
        candidates = [parent]
        for _round in range(8):
            for holder in candidates:
                action = self._signal(holder, signal.SIGSTOP)
                if action.changed:
                    self.watch.frozen[(holder.pid, holder.start_time)] = holder
                    if holder is parent:
                        self.watch.frozen_respawners.add((holder.pid, holder.start_time))
                    frozen.append(holder)
            fresh = [p for p in self.watch.parents.new_descendants(entry) if p not in seen]
            seen.update(fresh)
            candidates = []
            for pid in fresh:
                try:
                    child = self.surveyor.holder_of(pid, survey.snapshot)
                except observe.ProcessGone:
                    continue
                if not child.protected:
                    candidates.append(child)
            if not candidates:
                break
        return frozen

    def _give_up_respawns(self):
        """Respawners still to be ended when the passes ran out are named, not ended, and what it
        froze is let go (SIGCONT): the host is left as it was found."""
        for target in self.watch.take_next_targets():
            key = (target.pid, target.start_time)
            if key in self.watch.frozen_respawners and key not in self.killed:
                self.watch.respawners.append(target.left(lever.RESPAWNS,
                                                         say.respawner_refusal(target, lever.PASSES_RAN_OUT),
                                                         respawned='see actions'))
        self._thaw()

    def _thaw(self):
        """SIGCONT to what the ladder froze and has not let go since, the last frozen first."""
        for key, holder in reversed(list(self.watch.frozen.items())):
            if key not in self.killed:
                self._signal(holder, signal.SIGCONT)
        self.watch.frozen.clear()

    # --- signals ----------------------------------------------------------------------------

    def _escalate(self, targets):
        pulled, context = [], self._context()
        for one in families.LADDER:
            # A user's own service goes through her own manager, run as her: it can stop
            # nothing she could not stop herself. System units first, then users' units.
            if one.stage == family.UNITS:
                pulled += self._pull_family(one, None, context, targets)
        if pulled:
            targets = self.actor.alive(targets)
        killed = []
        if not self.force:
            terms = [(h, self._signal(h, signal.SIGTERM)) for h in targets]
            # A stopped process acts on SIGTERM only once continued: SIGCONT right after it, as
            # systemd does.
            for holder, action in terms:
                frozen = (holder.pid, holder.start_time) in self.watch.frozen
                if action.changed and (holder.state == 'stopped' or frozen):
                    self._signal(holder, signal.SIGCONT)
                    self.watch.frozen.pop((holder.pid, holder.start_time), None)
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
                self.unreachable.add(holder.pid)
                self.record(act.Action('unreachable', say.who(holder),
                                       say.step(lever.ALIVE_AFTER_KILL_STEP, state=self.actor.state_of(holder)),
                                       False, pid=holder.pid, name=holder.name))

    def _wait_outcomes(self, sent, timeout, signame):
        """Wait for the processes `sent` (holder, action) a signal to exit; say in each action
        what happened."""
        gone_at = self.actor.wait_gone([h for h, _action in sent], timeout)
        if self.actor.recording:
            return
        for holder, action in sent:
            if not action.changed:
                continue
            if holder.pid in gone_at:
                action.took_s = round(max(0.0, gone_at[holder.pid] - self.started - action.at_s), 3)
                action.result = say.step(lever.EXITED, signal=signame, took=action.took_s)
            elif signame == 'SIGTERM':
                action.result = say.step(lever.STILL_RUNNING, signal=signame, took=timeout)

    def _kill(self, holder):
        action = self._signal(holder, signal.SIGKILL)
        self.killed.add((holder.pid, holder.start_time))
        return holder, action

    def _signal(self, holder, signum):
        result, changed = self.actor.signal(holder, signum, self.surveyor.own_ancestors)
        if changed:
            self.ended_gpus.update(holder.gpus)
        step = act.SIGNAL_NAMES[signum].lower()
        return self.record(act.Action(step, say.who(holder), result, changed, pid=holder.pid,
                                      name=holder.name, gpus=holder.gpus))

    def _wait_release(self, survey):
        """Wait for the memory of the GPUs that can still come back; end at once when none can.

        A GPU cannot come back while a holder the ladder may not or could not end (protected,
        out of `match`, a zombie, alive after SIGKILL) keeps its context; memory no visible
        process holds, on a GPU the ladder ended nothing on, is waited for only while it falls.
        """
        selected, spared = survey.selected, survey.spared_pids
        targets, left = decide.plan_targets(survey.holders, selected, self.match, spared)
        keepers = dict((h.pid, h) for h in left)
        keepers.update((h.pid, h) for h in targets if h.pid in self.unreachable)
        # A guest's systemd seen restarting what was killed from here brings it back as often as
        # it is killed, and this host cannot stop that unit: its GPU is not waited for.
        keepers.update((h.pid, h) for h in targets if _guest_unit(h) in self.watch.guest_units)
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
            self.record(act.Action('wait_release', 'GPU %s' % _indices(selected),
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
        self.record(act.Action('wait_release', 'GPU %s' % _indices(hopeful), result, False,
                               gpus=hopeful, waited_s=round(waited, 3)))
        return self.look()

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
            users = [h for h in survey.holders if row['index'] in h.gpus]
            if users:
                self.record(act.Action('reset', target, say.step(lever.RESET_SKIPPED, pids=[h.pid for h in users]),
                                       False, gpu=row['index']))
                continue
            for what, argv in self.surveyor.backend.reset_commands(row['index'], row['persistence_mode']):
                since = self.clock()
                result, changed = self.actor.run(argv, self.surveyor.nvml_timeout)
                self.record(act.Action(what, target, result, changed, gpu=row['index']), since)
                if what == 'reset' and changed:
                    reset = True
                    self.ended_gpus.add(row['index'])
        return self._wait_release(survey) if reset else survey


def _unique(holders):
    seen, out = set(), []
    for holder in holders:
        if holder.pid not in seen:
            seen.add(holder.pid)
            out.append(holder)
    return out


def _held_code(holder, unreachable, restarting_guest_units=frozenset()):
    """Why a holder keeps its GPU, so the GPU is not waited for (gpu_say.held writes it)."""
    if holder.pid in unreachable:
        return lever.ALIVE_AFTER_KILL
    if _guest_unit(holder) in restarting_guest_units:
        return lever.GUEST_RESTARTS
    return lever.LEFT


def _indices(selected):
    return ','.join(str(i) for i in selected)
