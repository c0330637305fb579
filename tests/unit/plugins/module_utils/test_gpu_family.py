"""gpu_family: a unit's stop, shared by the system and user unit families (gpu_family.stop_unit,
unit_down): the Lever's argv run through the actor, judged here as down, stopping or failed
(issue 32 item 1)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act as act
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family as family
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say


class Actor(object):
    """An actor double: the stop command exits `rc`; the unit reads down within the wait or not."""

    recording = False

    def __init__(self, rc=0, down=True):
        self.rc, self.down, self.ran = rc, down, []

    def run(self, argv, timeout, as_user=None, ends=()):
        self.ran.append((argv, timeout, as_user))
        code = lever.COMMAND_OK if self.rc == 0 else lever.COMMAND_FAILED
        return say.step(code, rc=self.rc, output='Unit x.service not loaded.' if self.rc else ''), self.rc == 0

    def wait_until(self, predicate, timeout, max_interval=None):
        return (True, 0.2) if self.down else (False, timeout)


STOP = ['systemctl', 'stop', '--no-block', '--', 'x.service']


def test_a_units_stop_is_read_down_stopping_or_failed_from_rc_and_is_active():
    cases = [(Actor(), lever.UNIT_STOPPED, True), (Actor(down=False), lever.UNIT_STOPPING, True),
             (Actor(rc=5), lever.STOP_FAILED, False)]
    for actor, code, changed in cases:
        result, did = family.stop_unit(actor, STOP, gpu_owner.SYSTEM_MANAGER, 'x.service', 5.0)
        assert (result.code, did) == (code, changed)
        assert actor.ran == [(STOP, family.SYSTEMCTL_TIMEOUT_S, None)]
    assert 'not loaded' in family.stop_unit(Actor(rc=5), STOP, gpu_owner.SYSTEM_MANAGER, 'x.service', 5.0)[0]


def test_is_active_reads_down_when_inactive_failed_or_gone_never_while_deactivating():
    assert family.unit_down(3, 'inactive') and family.unit_down(3, 'failed') and family.unit_down(4, 'unknown')
    assert family.unit_down(124, 'systemctl is-active did not answer')
    assert not family.unit_down(0, 'active') and not family.unit_down(3, 'deactivating')


def test_check_mode_plans_a_units_stop_as_before_and_runs_nothing():
    actor = act.RecordingActor()
    result, changed = family.stop_unit(actor, STOP, gpu_owner.USER_MANAGER, 'x.service', 5.0, uid=1000)
    assert (result.code, changed) == (lever.WOULD_STOP_UNIT, True)
    assert str(result) == str(say.step(lever.WOULD_STOP_UNIT, timeout=5.0, uid=1000))
    assert actor.ended == set()
