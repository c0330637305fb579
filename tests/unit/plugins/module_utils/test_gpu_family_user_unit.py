"""gpu_family_user_unit: a user's own service is stopped through her own manager, as her, once
her manager confirms the unit; a directory she named like a service is stopped by no manager."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import UnitFacts

from .observations import CTX, gpu, proc
from .test_gpu_flow import ScriptedActor, ScriptedSurveyor, free, ladder, survey_of


ALICE_SVC = '/user.slice/user-1000.slice/user@1000.service/app.slice/hog.service'


def user_held(confirmed=True):
    """GPU 0 held by PID 10 in alice's own Restart=always service hog.service; her manager
    confirms the unit's ControlGroup, or knows no such unit (a directory she made)."""
    facts = {'user_units': {(1000, 'hog.service'): UnitFacts('always', 'active', ALICE_SVC) if confirmed
                            else UnitFacts()}}
    return survey_of([gpu(0, used=1000, processes=[(10, 1000)])],
                     [proc(10, name='exits-on-term', fds=CTX, maps=CTX, cgroup='0::%s\n' % ALICE_SVC)],
                     facts=facts)


def test_a_users_confirmed_service_is_stopped_through_her_manager_never_the_systems(managers):
    actor = ScriptedActor()
    result = ladder(ScriptedSurveyor(user_held(), free()), actor).run()
    # As her, through her manager, polled as her, bounded by the grace.
    assert actor.calls[:2] == [('run', 'systemctl --user stop --no-block -- hog.service', 1000), ('wait_release', 5.0)]
    assert managers == [('systemctl --user is-active -- hog.service', 1000)]
    assert not [c for c in actor.calls if c[0] == 'run' and c[1].startswith('systemctl stop')]
    assert result['actions'][0]['step'] == 'stop_user_unit' and result['actions'][0]['uid'] == 1000


def test_a_directory_she_named_like_a_service_is_stopped_by_no_manager():
    actor = ScriptedActor()
    ladder(ScriptedSurveyor(user_held(confirmed=False), free()), actor).run()
    assert not [c for c in actor.calls if c[0] == 'run']
    assert actor.calls[0] == ('SIGTERM', 10)
