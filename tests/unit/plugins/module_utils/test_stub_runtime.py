"""Issue 32 item 6: a new runtime is one new family module (stub_runtime.py) plus its test. It
is registered here, and the real survey code (recognition, facts, naming, trust) and the ladder
(its lever, pulled through the actor with its own argv) use it with nothing else changed."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_families as families
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_flow as flow
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_flow import Survey

from .observations import CTX, FREE_MIB, NVIDIA, diagnosed, gpu, proc, snap
from .stub_runtime import StubRuntime, cgroup_of
from .test_gpu_flow import ScriptedActor, ScriptedSurveyor, free, ladder

CID = '0123456789ab'
NO_SUCH_PID = decide.PID_MAX_LIMIT + 11


@pytest.fixture
def stub():
    family = StubRuntime()
    families.register(family, before='container')
    try:
        yield family
    finally:
        families.unregister(family)


def held_in_stub(policy_surveyor):
    """GPU 0 held by one process in the stub runtime's container, classified by the real survey
    code: the owner from the cgroup (the family's recogniser), its facts read through the
    family (Surveyor's facts of the snapshot), its name and policy filled in before the holder
    is built (Surveyor.owners)."""
    snapshot = snap([gpu(0, used=4000, processes=[(NO_SUCH_PID, 4000)])],
                    [proc(NO_SUCH_PID, name='server', fds=CTX, maps=CTX, cgroup=cgroup_of(CID))])
    units, facts = policy_surveyor._facts_of(snapshot)
    sorted_procs = decide.sort_processes(snapshot, FREE_MIB)
    named, owners = policy_surveyor._owners([held.proc for held in sorted_procs[0]], units, facts)
    holders, clients, unconfirmed = decide.classify(snapshot, [], set(), units, FREE_MIB, facts=facts, owners=owners,
                                                    sorted_procs=sorted_procs, named=named)
    rows = decide.gpu_table(snapshot, holders, [0], 128, frozenset())
    return Survey(snapshot, [0], holders, clients, unconfirmed, rows, diagnosed(snapshot, holders, unconfirmed, rows))


def test_its_cgroup_names_its_container_only_while_it_is_registered():
    before = gpu_owner.owner_from_cgroup(cgroup_of(CID))
    family = StubRuntime()
    families.register(family, before='container')
    try:
        owner = gpu_owner.owner_from_cgroup(cgroup_of(CID))
        assert families.of(owner) is family
        assert families.LADDER.index(family) == families.LADDER.index(families.CONTAINER) - 1
    finally:
        families.unregister(family)
    assert (owner.kind, owner.runtime, owner.id) == (gpu_owner.CONTAINER, 'stubrt', CID)
    # Unregistered, the same path is a plain scope of this host, as before and after.
    assert before.kind == gpu_owner.SCOPE and gpu_owner.owner_from_cgroup(cgroup_of(CID)) == before
    assert 'stubrt' not in lever.RUNTIMES and family not in families.LADDER


def test_the_survey_reads_its_facts_once_and_trusts_its_confirmation(stub):
    surveyor = flow.Surveyor(backend=NVIDIA)
    survey = held_in_stub(surveyor)
    held_in_stub(surveyor)
    holder = survey.holders[0]
    assert stub.asked == [CID]      # once per container and run
    owner = holder.owner
    assert (owner.runtime, owner.name, owner.restart_policy, owner.confirmed) == (
        'stubrt', 'stub-0123', 'always', True)
    chosen = stub.lever(holder, flow.family.Context((), set(), set(), None, 5.0))
    assert chosen.refusal is None and chosen.watch == lever.WATCH_CONTAINER
    assert chosen.argv == ['stubrtctl', 'stop', '--time', '5', CID]


def test_the_ladder_stops_its_container_with_its_own_argv_and_signals_nothing(stub):
    actor = ScriptedActor()
    result = ladder(ScriptedSurveyor(held_in_stub(flow.Surveyor(backend=NVIDIA)), free()), actor).run()
    assert actor.calls[0] == ('run', 'stubrtctl stop --time 5 %s' % CID)
    assert not [c for c in actor.calls if c[0] in ('SIGTERM', 'SIGKILL')]
    first = result['actions'][0]
    assert (first['step'], first['code'], first['runtime'], first['container'], first['changed']) == (
        'stop_container', lever.CONTAINER_STOPPED, 'stubrt', CID, True)
    assert result['free'] is True


def test_its_container_unconfirmed_is_never_stopped_through_it(stub):
    """The runtime's inspect names an init in another cgroup: the container is not this
    holder's by the runtime's word (gpu_trust.UNCONFIRMED), so its CLI stops nothing; the
    holder is left to the signals, as a docker container's would be."""
    stub.facts = lambda owner, timeout: {'restart_policy': 'always', 'pid': 4343,
                                         'init_cgroup': '0::/system.slice/other.service\n'}
    actor = ScriptedActor()
    survey = held_in_stub(flow.Surveyor(backend=NVIDIA))
    result = ladder(ScriptedSurveyor(survey), actor, passes=1).run()
    assert not [c for c in actor.calls if c[0] == 'run']
    assert [c[0] for c in actor.calls if c[0] in ('SIGTERM', 'SIGKILL')] == ['SIGTERM', 'SIGKILL']
    assert result['holders'][0] == survey.holders[0].as_result()
    chosen = stub.lever(survey.holders[0], flow.family.Context((), set(), set(), None, 5.0))
    assert chosen.refusal == lever.trust.UNCONFIRMED
