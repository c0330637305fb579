"""gpu_family_unit: a confirmed Restart= system unit holding a GPU is stopped through systemd,
its stop's argv through the actor and is-active polled within the grace, before any signal."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever

from .test_gpu_flow import GPUHOG, UNIT, ScriptedActor, ScriptedSurveyor, free, held_by, ladder


def test_a_restarting_unit_is_stopped_before_any_signal(managers):
    actor = ScriptedActor()
    s = held_by((10, 'exits-on-term'), cgroup=UNIT, units=GPUHOG)
    result = ladder(ScriptedSurveyor(s, free()), actor).run()
    # The Lever's argv, then is-active polled through the actor's wait, bounded by the grace.
    assert actor.calls[:2] == [('run', 'systemctl stop --no-block -- gpuhog.service'), ('wait_release', 5.0)]
    assert managers == [('systemctl is-active -- gpuhog.service', None)]
    assert actor.calls[2] == ('SIGTERM', 10), 'the stop left the process alive: it is signalled'
    assert result['actions'][0]['code'] == lever.UNIT_STOPPED
    assert result['actions'][0]['target'] == 'gpuhog.service'
