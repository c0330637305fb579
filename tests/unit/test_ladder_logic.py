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
