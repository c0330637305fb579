"""The ladder's orchestration with a scripted observation source (no driver, no real holders).

The surveys are hand-built observations; the holders' PIDs are above the kernel's PID limit,
so every signal the real gpu_act sends finds no process and reports `gone`.
"""
import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_flow import Ladder, Survey
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import NvmlTimeout

from .test_decide import CTX, gpu, proc, snap

NO_SUCH_PID = decide.PID_MAX_LIMIT + 7


def survey_of(gpus, procs):
    s = snap(gpus, procs)
    holders, clients, unconfirmed = decide.classify(s, [], set())
    rows = decide.gpu_table(s, holders, [g.index for g in gpus], 128)
    return Survey(s, [g.index for g in gpus], holders, clients, unconfirmed, rows,
                  decide.diagnose(s, holders, unconfirmed, rows))


class ScriptedSurveyor(object):
    """Returns the given surveys in order; an exception in the list is raised instead."""

    nvml_timeout = 1.0
    own_ancestors = frozenset()

    def __init__(self, *script):
        self.script = list(script)

    def survey(self, deep=False):
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def protected_units(self):
        return set()

    def protected_containers(self):
        return set()

    def memory_back(self, selected, spared_pids=frozenset()):
        return False


def held():
    return survey_of([gpu(0, used=5000, processes=[(NO_SUCH_PID, 5000)])],
                     [proc(NO_SUCH_PID, fds=CTX, maps=CTX)])


def test_a_driver_that_hangs_after_the_ladder_acted_fails_with_the_actions_so_far():
    surveyor = ScriptedSurveyor(held(), NvmlTimeout('NVML did not answer within nvml_timeout=1.0s.'))
    result = Ladder(surveyor, term_timeout=0.1, release_timeout=0.1).run()
    assert result['free'] is False
    assert [(a['step'], a['result']) for a in result['actions']] == [('sigterm', 'gone')]
    assert result['msg'].startswith('NVML did not answer within nvml_timeout=1.0s.')
    assert 'taken 1 action(s) before that' in result['msg']


def test_a_driver_that_hangs_at_the_first_look_raises_before_any_action():
    surveyor = ScriptedSurveyor(NvmlTimeout('hung'))
    with pytest.raises(NvmlTimeout):
        Ladder(surveyor).run()


def test_a_free_host_gets_no_action_and_no_change():
    free = survey_of([gpu(0)], [])
    result = Ladder(ScriptedSurveyor(free)).run()
    assert result['changed'] is False and result['actions'] == [] and result['free'] is True


CID = '9408f0bbe98e121b565cc3d4090a128d9894b03676992794f62c58c6a037b74b'


def container_held(nspid=None, policy=None):
    survey = survey_of([gpu(0, used=5000, processes=[(NO_SUCH_PID, 5000)])],
                       [proc(NO_SUCH_PID, fds=CTX, maps=CTX, nspid=nspid,
                             cgroup='0::/machine.slice/libpod-%s.scope\n' % CID)])
    for holder in survey.holders:
        holder['owner'].update(name='hog', restart_policy=policy)
    return survey


def test_check_mode_plans_the_container_stop_before_any_signal():
    result = Ladder(ScriptedSurveyor(container_held(nspid=[NO_SUCH_PID, 1])), check_mode=True).run()
    assert [(a['step'], a.get('container'), a.get('runtime'), a['result']) for a in result['actions']] == [
        ('stop_container', CID, 'podman', 'planned')]
    assert result['changed'] is True


def test_check_mode_plans_nothing_for_a_container_init_without_the_lever():
    result = Ladder(ScriptedSurveyor(container_held(nspid=[NO_SUCH_PID, 1])), check_mode=True,
                    stop_containers=False).run()
    assert result['actions'] == [] and result['changed'] is False


def test_without_the_lever_a_restarting_container_is_not_fought():
    result = Ladder(ScriptedSurveyor(container_held(policy='always')), check_mode=True,
                    stop_containers=False).run()
    assert result['actions'] == []
    plain = Ladder(ScriptedSurveyor(container_held(policy=None)), check_mode=True,
                   stop_containers=False).run()
    assert [a['step'] for a in plain['actions']] == ['sigterm', 'sigkill']
