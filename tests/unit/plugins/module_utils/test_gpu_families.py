"""gpu_families: the ordered list of owner families the Ladder walks, which family answers for
which owner, whose facts each reads in that order, how the action of each pull is phrased, and
the recognisers it hands gpu_owner (issue 32 item 1). One family's own rules are tested in its
test_gpu_family_<name>.py; the unit stop they share in test_gpu_family.py."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_families as families
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family as family
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner

from .holders import make_holder

CID = '9408f0bbe98e121b565cc3d4090a128d9894b03676992794f62c58c6a037b74b'


def owner_of(path):
    return gpu_owner.owner_from_cgroup('0::%s\n' % path)


def test_the_ladder_order_is_containers_supervisors_then_units_then_the_by_hand_owners():
    assert [f.name for f in families.LADDER] == ['container', 'supervisor', 'system_unit', 'user_unit',
                                                 'guest', 'pod']
    assert [f.stage for f in families.LADDER] == [family.OWNERS, family.OWNERS, family.UNITS, family.UNITS,
                                                  family.BY_HAND, family.BY_HAND]
    assert [f.option for f in families.LADDER[:4]] == ['stop_containers', 'stop_supervised', 'stop_units',
                                                       'stop_units']


def test_each_owner_is_answered_for_by_its_family():
    cases = [
        ('/system.slice/docker-%s.scope' % CID, families.CONTAINER),
        ('/system.slice/gpuhog.service', families.SYSTEM_UNIT),
        ('/user.slice/user-1000.slice/user@1000.service/app.slice/hog.service', families.USER_UNIT),
        ('/lxc.payload.web/system.slice/sglang.service', families.GUEST),
        ('/kubepods.slice/kubepods-pod0a1b2c3d_0000_1111_2222_333344445555.slice', families.POD),
        ('/user.slice/user-1000.slice/session-3.scope', None),
    ]
    for path, expected in cases:
        assert families.of(owner_of(path)) is expected, path
    supervised = gpu_owner.new_owner(gpu_owner.SUPERVISOR, '/system.slice/supervisor.service')
    assert families.of(supervised) is families.SUPERVISOR


def test_a_guest_started_as_a_system_service_has_its_units_facts_read_not_a_runtimes():
    """systemd-nspawn@NAME.service: systemd confirms the guest's cgroup (gpu_trust.confirm), so
    the first family with facts for it, in ladder order, is the system unit's."""
    owner = owner_of('/machine.slice/systemd-nspawn@web.service/payload/system.slice/x.service')
    assert owner.kind == gpu_owner.GUEST
    keyed = [(f.name, f.facts_key(owner)) for f in families.LADDER if f.facts_key(owner) is not None]
    assert keyed[0] == ('system_unit', 'systemd-nspawn@web.service')
    container = owner_of('/system.slice/docker-%s.scope' % CID)
    assert [(f.store, f.facts_key(container)) for f in families.LADDER if f.facts_key(container)] == [
        ('runtimes', ('docker', CID))]


def test_the_by_hand_families_never_offer_the_ladder_a_lever():
    pod = make_holder(owner=owner_of('/kubepods.slice/kubepods-pod0a1b2c3d_0000_1111_2222_333344445555.slice'),
                      protected_code=None, unit=None)
    assert families.POD.lever(pod, None).refusal == lever.NO_STOP
    guest = make_holder(owner=owner_of('/lxc.payload.web/system.slice/sglang.service'), protected_code=None,
                        unit=None)
    chosen = families.GUEST.lever(guest, None)
    assert chosen.refusal == lever.NO_STOP and chosen.kind == lever.STOP_GUEST_UNIT
    assert chosen.argv == ['lxc-attach', '-n', 'web', '--', 'systemctl', 'stop', 'sglang.service']


def test_each_pull_is_phrased_as_the_step_gpu_reclaim_documents():
    unit = families.SYSTEM_UNIT.phrase(lever.lever(lever.STOP_UNIT, 'gpuhog.service'))
    assert unit == ('stop_unit', 'gpuhog.service', {'unit': 'gpuhog.service'})
    user = families.USER_UNIT.phrase(lever.lever(lever.STOP_USER_UNIT, (1000, 'hog.service')))
    assert user == ('stop_user_unit', 'hog.service', {'unit': 'hog.service', 'uid': 1000})
    owner = owner_of('/system.slice/docker-%s.scope' % CID)._replace(name='hog')
    step, target, details = families.CONTAINER.phrase(lever.lever(lever.STOP_CONTAINER, ('docker', CID), owner))
    assert (step, details) == ('stop_container', {'container': CID, 'runtime': 'docker', 'name': 'hog'})
    assert target == gpu_owner.describe(owner)


def test_a_container_or_program_is_pulled_once_a_run_a_unit_again():
    class Watch(object):
        containers, supervised, units = set([('docker', CID)]), set(['k']), set(['gpuhog.service'])

    assert families.CONTAINER.seen(lever.lever(lever.STOP_CONTAINER, ('docker', CID)), Watch)
    assert families.SUPERVISOR.seen(lever.lever(lever.STOP_SUPERVISED, 'k'), Watch)
    assert not families.SYSTEM_UNIT.seen(lever.lever(lever.STOP_UNIT, 'gpuhog.service'), Watch)


# --- recognition: each layout is its family's; gpu_owner knows only systemd's generic one --------

def test_each_runtimes_guests_and_pods_layout_is_recognised_by_its_own_family(monkeypatch):
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family_container, gpu_family_guest
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family_pod
    cases = [('/system.slice/docker-%s.scope' % CID, gpu_family_container, gpu_owner.CONTAINER),
             ('/lxc.payload.gpubox/system.slice/llm.service', gpu_family_guest, gpu_owner.GUEST),
             ('/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234abcd.slice/cri-containerd-%s.scope'
              % CID, gpu_family_pod, gpu_owner.POD)]
    assert gpu_owner.RECOGNISERS == [families.CONTAINER.recognise, families.GUEST.recognise, families.POD.recognise]
    for path, module, kind in cases:
        assert owner_of(path).kind == kind
        # Without its family's recogniser, gpu_owner reads only systemd's layout: a unit, a
        # scope or nothing, never that kind.
        monkeypatch.setattr(gpu_owner, 'RECOGNISERS', [r for r in gpu_owner.RECOGNISERS
                                                       if r is not module.FAMILY.recognise])
        assert owner_of(path).kind != kind
        monkeypatch.undo()


def test_gpu_owner_refuses_to_read_a_cgroup_before_the_families_are_handed_over(monkeypatch):
    monkeypatch.setattr(gpu_owner, 'RECOGNISERS', [])
    with pytest.raises(RuntimeError, match='gpu_families'):
        owner_of('/system.slice/docker-%s.scope' % CID)
