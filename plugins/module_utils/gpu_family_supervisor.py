# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The process supervisor family (gpu_family): supervisord, runit, s6, pm2 (gpu_supervisor's
rows).

- recognise: on the holder's ancestry, never from a cgroup (every program sits in its
  supervisor's unit): `recognise_all` matches each holding process's chain by identity
  (gpu_supervisor.match) and gives that supervisor's program as its owner, before the holder
  is built (gpu_survey.Surveyor._owners);
- facts: the supervisor's own status, asked once per supervisor and survey while it answers (a
  CLI that is missing or hangs is not asked again this run);
- lever: the supervisor's stop of that one program (gpu_lever.supervised_lever);
- pull: the actor's stop_supervised (the stop, then the status polled down and staying down); a
  failure is kept on the surveyor, so the holder is named with it, never signalled;
- comeback: the supervisor's autorestart, read in its status for STAY_DOWN_S after the stop;
  each program is stopped once a run (gpu_respawn.Comebacks.supervised).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

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
        return lever.supervised_lever(holder, context.match)

    @staticmethod
    def owned(chosen, planned):
        return [h for h, _one in planned if supervisors.key(h.owner) == chosen.key]

    def pull(self, chosen, owned, ladder):
        result, changed, error = ladder.actor.stop_supervised(chosen.owner, owned, ladder.grace(),
                                                              ladder.surveyor.nvml_timeout)
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
        return 'stop_supervised', supervisors.describe(owner), {
            'runtime': owner['runtime'], 'program': owner['name'], 'unit': owner['unit'],
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
            if owner['kind'] in _THEIRS:
                continue
            system = owner['kind'] == gpu_owner.SERVICE and owner['manager'] == gpu_owner.SYSTEM_MANAGER \
                and owner['confirmed'] and owner['controlled_by'] == gpu_owner.ROOT
            facts = units.get(owner['unit']) if system else None
            main_pid = facts.main_pid if facts else None
            if main_pid and owner['unit'] not in checked:
                checked.add(owner['unit'])
                if supervisors.daemon_row(observe.supervisor_chain(main_pid, proc, depth=0, links=links), main_pid):
                    surveyor.supervisor_units.add(owner['unit'])
            if not one.ppid or one.ppid <= 1 or one.ppid in surveyor.own_ancestors:
                continue   # an orphan of PID 1 (the seeds) or the module's own child: no supervisor above
            chain = observe.supervisor_chain(one.pid, proc, links=links)
            if not chain or chain[0].start_time != one.start_time:
                continue
            found = supervisors.match(chain, main_pid)
            if not found:
                continue
            if system:
                surveyor.supervisor_units.add(owner['unit'])
            programs[one.pid] = _program_owner(owner, found, timeout, surveyor)
        return programs


def _program_owner(owner, found, timeout, surveyor):
    """The supervised program's owner record, its status asked at most once per supervisor and
    survey (surveyor.supervisor_status)."""
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


FAMILY = Supervisor()
