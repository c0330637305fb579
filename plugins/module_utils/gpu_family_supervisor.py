# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The process supervisor family (gpu_family): supervisord, runit, s6, pm2 (gpu_supervisor's
rows).

- recognise: on the holder's ancestry, never from a cgroup (every program sits in its
  supervisor's unit): `recognise_all` matches each holding process's chain by identity
  (gpu_supervisor.match) and gives that supervisor's program as its owner, before the holder
  is built (gpu_survey.Surveyor._owners);
- facts: the supervisor's own status, asked once per supervisor in a run (Surveyor.supervisor_status)
  and again only when the answer kept does not list the program (one started since); a CLI that is
  missing or hangs is not asked again this run;
- lever: the supervisor's stop of that one program (gpu_lever.supervised_lever);
- pull: the Lever's stop (gpu_supervisor's row) through the actor, as the user for pm2, then the
  status polled through the actor's wait until it reads down and for STAY_DOWN_S that it stays
  down (`stop`); a failure is kept on the surveyor, so the holder is named with it, never
  signalled;
- comeback: the supervisor's autorestart, read in its status for STAY_DOWN_S after the stop;
  each program is stopped once a run (gpu_respawn.Comebacks.supervised).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act as act
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family as family
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_supervisor as supervisors

# Owners a supervisor's program never replaces: what a container, a pod or a guest runs is theirs.
_THEIRS = (gpu_owner.CONTAINER, gpu_owner.POD, gpu_owner.GUEST)


class Supervisor(family.Family):

    name = 'supervisor'
    kinds = (gpu_owner.SUPERVISOR,)
    stage = family.OWNERS
    option = 'stop_supervised'
    ends_holders = True

    def lever(self, holder, context):
        return lever.supervised_lever(holder, context.match, grace=context.grace)

    @staticmethod
    def owned(chosen, planned):
        return [h for h, _one in planned if supervisors.key(h.owner) == chosen.key]

    def pull(self, chosen, owned, ladder):
        result, changed, error = stop(ladder.actor, chosen, owned, ladder.grace(), ladder.surveyor.nvml_timeout)
        if error:
            ladder.surveyor.supervisor_errors[chosen.key] = error
        return result, changed

    @staticmethod
    def seen(chosen, watch):
        return chosen.key in watch.supervised

    @staticmethod
    def comeback(chosen, changed, watch):
        watch.supervised.add(chosen.key)

    def phrase(self, chosen):
        owner = chosen.owner
        return 'stop_supervised', gpu_owner.describe(owner), {
            'runtime': owner.runtime, 'program': owner.name, 'unit': owner.unit,
            'command': supervisors.manual(owner)}

    @staticmethod
    def recognise_all(procs, owners, units, timeout, surveyor, proc='/proc'):
        """PID -> the supervisor's program owner of each of `procs` (gpu_observe.ProcState) that
        a process supervisor runs, before any holder is built: matched by identity on the
        process's ancestry, the program from the supervisor's own status. `owners` are the
        owners their cgroups name, confirmed (gpu_decide.cgroup_owner); a process in a
        container, pod or guest is theirs. Also notes the system units whose MainPID is a
        supervisor (never stopped whole)."""
        checked, programs = set(), {}
        # Each process read once per survey: 24 ranks under one launcher read its chain 24 times.
        # With Watch.add's the same, the first signal on them came at 34 ms instead of 52
        # (bench/run reclaim --shape ranks, 5 reps, medians; cProfile: 29 ms here, 9 in Watch.add).
        links = {}
        for one in procs:
            owner = owners[one.pid]
            if owner.kind in _THEIRS:
                continue
            system = owner.kind == gpu_owner.SERVICE and owner.manager == gpu_owner.SYSTEM_MANAGER \
                and owner.confirmed and owner.controlled_by == gpu_owner.ROOT
            facts = units.get(owner.unit) if system else None
            main_pid = facts.main_pid if facts else None
            if main_pid and owner.unit not in checked:
                checked.add(owner.unit)
                if supervisors.daemon_row(observe.supervisor_chain(main_pid, proc, depth=0, links=links), main_pid):
                    surveyor.supervisor_units.add(owner.unit)
            if not one.ppid or one.ppid <= 1 or one.ppid in surveyor.own_ancestors:
                continue   # an orphan of PID 1 (the seeds) or the module's own child: no supervisor above
            chain = observe.supervisor_chain(one.pid, proc, links=links)
            if not chain or chain[0].start_time != one.start_time:
                continue
            found = supervisors.match(chain, main_pid)
            if not found:
                continue
            if system:
                surveyor.supervisor_units.add(owner.unit)
            programs[one.pid] = _program_owner(owner, found, timeout, surveyor)
        return programs


def stop(actor, chosen, holders, grace, status_timeout):
    """Stop one program through its own supervisor: the Lever's argv (`supervisorctl stop`, `sv
    force-stop`, `s6-svc -d`, `pm2 stop`, pm2's as its user) through `actor`, then the
    supervisor's status polled until it says the program is down by request (bounded by grace +
    30 s), then for STAY_DOWN_S more that nothing starts it again. Returns (result, changed,
    error): error {'code', 'text'} (gpu_supervisor's codes) when it failed or the program came
    back; nothing is signalled from here."""
    owner = chosen.owner
    sup = owner.supervisor
    row = supervisors.SUPERVISORS[owner.runtime]
    as_user = observe.as_user(sup['uid'], sup.get('home')) if row['as_user'] else None
    bound = grace + 30
    if row['as_user'] and as_user is None and not actor.recording:
        # Her supervisor's CLI runs as her, never as root: no such user, no stop.
        text = say.cli_no_user(sup['uid'])
        return say.step(lever.STOP_FAILED, output=text), False, {'code': supervisors.CLI_FAILED, 'text': text}
    result, _ran = actor.run(chosen.argv, bound, as_user=as_user, ends=holders)
    if actor.recording:
        return say.step(lever.WOULD_STOP_SUPERVISED, argv=chosen.argv), True, None
    rc, out = result.facts.get('rc'), result.facts.get('output')
    if rc in (124, 127):
        code = supervisors.CLI_TIMEOUT if rc == 124 else supervisors.CLI_MISSING
        return say.step(lever.STOP_FAILED, output=out), False, {'code': code, 'text': say.cli_said(chosen.argv, out)}
    if rc != 0 and row['kill']:
        actor.run(supervisors.argv(owner.runtime, 'kill', sup, owner.id), bound, as_user=as_user)
    state = {}

    def read():
        code, text = observe.supervisor_status(supervisors.argv(owner.runtime, 'status', sup, owner.id),
                                               status_timeout, sup['uid'] if row['as_user'] else None, sup.get('home'))
        entries = supervisors.parse_status(row['parse'], text) if code in ('ok',) or code.startswith('rc=') else None
        state['error'] = None if entries is not None else {
            'code': code if code in (supervisors.CLI_MISSING, supervisors.CLI_TIMEOUT) else supervisors.CLI_FAILED,
            'text': say.status_after_stop(text)}
        state['entries'] = entries
        return entries

    def down():
        # The program down by its supervisor's word: a holder below it that outlives it (a
        # launcher's child) is an orphan the supervisor no longer restarts, for the signals.
        entries = read()
        return state['error'] is not None or supervisors.is_down(owner.runtime, entries, owner.id)

    _done, waited = actor.wait_until(down, bound, max_interval=act.COMMAND_POLL_S)
    if state.get('error'):
        return say.step(lever.STOP_FAILED, output=state['error']['text']), rc == 0, state['error']
    if not supervisors.is_down(owner.runtime, state.get('entries'), owner.id):
        text = say.not_down(chosen.argv, rc, out, bound)
        return say.step(lever.STOP_FAILED, output=text), rc == 0, {'code': supervisors.STOP_FAILED, 'text': text}
    # Stays down: its supervisor's word (down by request) is checked against what it does.
    back, watched = actor.wait_until(lambda: read() is None or supervisors.running_pid(
        owner.runtime, state['entries'], owner.id), supervisors.STAY_DOWN_S, max_interval=act.COMMAND_POLL_S)
    if back:
        pid = supervisors.running_pid(owner.runtime, state.get('entries'), owner.id)
        text = (say.program_back(pid, watched) if pid
                else (state.get('error') or {}).get('text', say.STATUS_FAILED))
        return say.step(lever.STOP_FAILED, output=text), True, {
            'code': supervisors.CAME_BACK if pid else supervisors.CLI_FAILED, 'text': text}
    left = actor.alive(holders)
    return (say.step(lever.SUPERVISED_STOPPED, waited=waited, command=' '.join(chosen.argv), watched=watched,
                     left=[h.pid for h in left]), True, None)


def _program_owner(owner, found, timeout, surveyor):
    """The supervised program's owner record. The supervisor's status is kept for the run
    (surveyor.supervisor_status) and asked again only when the answer kept does not list this
    program, never after its CLI was missing or hung."""
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
    new = gpu_owner.new_owner(gpu_owner.SUPERVISOR, owner.cgroup, runtime=runtime, id=program_id, name=name,
                              unit=owner.unit, manager=owner.manager, controlled_by=owner.controlled_by,
                              uid=owner.uid, confirmed=owner.confirmed, cli_error=error,
                              supervisor=dict((k, v) for k, v in found.items() if k != 'runtime'))
    return new if error else new._replace(cli_error=surveyor.supervisor_errors.get(supervisors.key(new)))


FAMILY = Supervisor()
