"""gpu_family_supervisor: a supervisor's program is stopped through its supervisor's CLI (as its
user for pm2) and read down from its status; a failed stop is named, never fought with signals.
The supervisors' table and status outputs are gpu_supervisor's (test_gpu_supervisor.py)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_supervisor as sup

from .test_gpu_flow import ScriptedActor, ScriptedSurveyor, free, ladder
from .test_gpu_supervisor import STOP_WORKER, SupervisingActor, supervised_survey


def test_the_program_is_stopped_through_its_supervisor_and_nothing_is_signalled(monkeypatch):
    actor = SupervisingActor(monkeypatch)
    result = ladder(ScriptedSurveyor(supervised_survey(), free()), actor).run()
    # The Lever's stop with the grace bound, then the status polled down and staying down.
    assert [c for c in actor.calls if c[0] == 'run'] == [('run', STOP_WORKER, 35.0)]
    assert [c[0] for c in actor.calls if c[0] != 'status'] == ['run', 'wait_release', 'wait_release']
    assert result['free'] is True
    (step,) = result['actions']
    assert (step['step'], step['program'], step['unit'], step['command']) == (
        'stop_supervised', 'worker', 'supervisor.service', STOP_WORKER)
    assert step['code'] == lever.SUPERVISED_STOPPED


def test_a_failed_stop_is_named_never_fought_with_signals(monkeypatch):
    actor = SupervisingActor(monkeypatch, stops=False)
    surveyor = ScriptedSurveyor(supervised_survey())
    surveyor.supervisor_errors = {}
    surveyor.supervisor_units = set()

    def survey(deep=False, full=True):
        fresh = supervised_survey()
        owner = fresh.holders[0].owner
        fresh.holders[0] = fresh.holders[0]._replace(
            owner=owner._replace(cli_error=surveyor.supervisor_errors.get(sup.key(owner))))
        return fresh
    surveyor.survey = survey
    result = ladder(surveyor, actor).run()
    assert [c[0] for c in actor.calls if c[0] not in ('wait_release', 'status')] == ['run']
    (left,) = result['remaining']
    assert left['reason_code'] == sup.STOP_FAILED
    assert 'not down after 35.0s' in result['msg']


def test_pm2s_stop_runs_as_its_user_or_not_at_all():
    """pm2's daemon is its user's: the stop runs as her; a UID no user has stops nothing (before,
    the module failed with a KeyError), and never runs as root."""
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family_supervisor as family
    owner = gpu_owner.new_owner(gpu_owner.SUPERVISOR, '/user.slice', runtime='pm2', id='api', name='api',
                                supervisor={'pid': 50, 'start_time': 1, 'uid': 2 ** 31 - 7, 'home': None})
    chosen = lever.lever(lever.STOP_SUPERVISED, ('pm2', 50, 1, 'api'), owner, ['pm2', 'stop', 'api'])
    actor = ScriptedActor()
    result, changed, error = family.stop(actor, chosen, [], 5.0, 10)
    assert (result.code, changed, error['code']) == (lever.STOP_FAILED, False, sup.CLI_FAILED)
    assert actor.calls == []
