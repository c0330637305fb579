"""Pure decision rules of gpu_decide, driven with hand-built observations (no processes)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import re

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say

from .holders import make_holder
from .observations import CTX, FREE_MIB, NVIDIA, OWN_NS, UnitFacts, diagnosed, gpu, proc, runtime_confirms, snap, systemd_confirms


def classify(s, patterns=(), own_tree=frozenset(), units=None, facts=None):
    return decide.classify(s, [re.compile(p) for p in patterns], set(own_tree), units, FREE_MIB, facts=facts)


def test_mapping_is_a_context_fd_only_is_a_handle_shared_nodes_are_clients():
    # GPU 0's memory is charged to nobody NVML can name (another namespace, say): the mapping
    # is what shows the context.
    s = snap([gpu(0, used=900), gpu(1)], [
        proc(10, fds=CTX, maps=CTX),
        proc(11, fds=('/dev/nvidia1', '/dev/nvidiactl')),
        proc(12, name='nvidia-smi', fds=('/dev/nvidiactl', '/dev/nvidia-uvm')),
    ])
    holders, clients, _unused = classify(s)
    by_pid = dict((h.pid, h) for h in holders)
    assert by_pid[10].kind == 'context' and by_pid[10].gpus == [0]
    assert by_pid[10].evidence == ['fd', 'mmap']
    assert by_pid[11].kind == 'handle' and by_pid[11].context_gpus == []
    assert [c.pid for c in clients] == [12] and 12 not in by_pid


def test_device_nodes_are_mapped_through_minor_numbers_not_names():
    # GPU index 0 has minor 3: /dev/nvidia3 is GPU 0, /dev/nvidia0 is GPU 3.
    s = snap([gpu(0, minor=3), gpu(3, minor=0)], [proc(10, fds=['/dev/nvidia3'], maps=['/dev/nvidia3'])])
    holders, _unused, _unused = classify(s)
    assert holders[0].gpus == [0]


ALL = ('/dev/nvidia0', '/dev/nvidia1', '/dev/nvidiactl', '/dev/nvidia-uvm')


def test_a_cuda_process_maps_every_gpu_but_holds_a_context_only_where_nvml_lists_it():
    # Measured on 2x H200: a torch process on GPU 0 opens and maps /dev/nvidia1 as well.
    s = snap([gpu(0, used=1642, processes=[(10, 1634)]), gpu(1)], [proc(10, fds=ALL, maps=ALL)])
    (holder,), _unused, _unused = classify(s)
    assert holder.context_gpus == [0] and holder.gpus == [0, 1]
    rows = decide.gpu_table(s, [holder], [0, 1], 128)
    assert [(r['holders'], r['handles'], r['free']) for r in rows] == [([10], [], False), ([], [10], True)]
    assert decide.plan_targets([holder], [1], [])[0] == []
    assert [t.pid for t in decide.plan_targets([holder], [0], [])[0]] == [10]


def test_a_forked_child_holds_the_context_where_nvml_charges_its_dead_parent():
    s = snap([gpu(0, used=4614, processes=[(10, 4614)]), gpu(1)],
             [proc(11, name='worker', fds=ALL, maps=('/dev/nvidia0', '/dev/nvidia1', '/dev/nvidiactl'))],
             missing=[10])
    (child,), _unused, _unused = classify(s)
    assert child.context_gpus == [0] and child.kind == 'context' and child.evidence == ['fd', 'mmap']


def test_nvml_listing_gives_memory_and_context():
    s = snap([gpu(2, used=1024, processes=[(10, 1024)])], [proc(10, fds=['/dev/nvidia2'])])
    (holder,), _unused, _unused = classify(s)
    assert holder.kind == 'context' and holder.gpu_memory_mib == {'2': 1024}
    assert holder.evidence == ['fd', 'nvml']


def test_a_holders_cgroup_owner_read_before_is_not_read_again(monkeypatch):
    # gpu_survey.Surveyor reads each holder's cgroup owner once, to resolve its final owner, and
    # hands it to classify (`named`): the holder is the same record, and no owner is read twice.
    s = snap([gpu(0, used=900, processes=[(10, 900)])],
             [proc(10, fds=CTX, maps=CTX, cgroup='0::/system.slice/sglang.service')])
    (read_here,), _unused, _unused = classify(s)
    named = {10: decide.cgroup_owner(s.procs[10])}
    reads = []
    real = decide.cgroup_owner
    monkeypatch.setattr(decide, 'cgroup_owner', lambda *args, **kwargs: reads.append(args) or real(*args, **kwargs))
    (handed,), _unused, _unused = decide.classify(s, [], set(), None, FREE_MIB, named=named)
    assert reads == [] and handed == read_here and handed.unit == 'sglang.service'


def test_nvml_pid_resolving_to_a_process_without_device_is_unconfirmed():
    # A host PID reported inside a container can name an unrelated local process.
    s = snap([gpu(0, used=4000, processes=[(10, 4000)])], [proc(10, name='bash')])
    holders, _unused, unconfirmed = classify(s)
    assert holders == [] and unconfirmed == [{'pid': 10, 'name': 'bash', 'gpus': [0], 'code': lever.UNCONFIRMED_PID}]


@pytest.mark.parametrize('name,cmdline,reason', [
    ('nvidia-persiste', '/usr/bin/nvidia-persistenced --verbose', 'nvidia-persistenced'),
    ('nv-hostengine', 'nv-hostengine -n', 'nv-hostengine'),
    ('dcgm-exporter', '/usr/bin/dcgm-exporter', 'dcgm-exporter'),
    ('Xorg', '/usr/lib/xorg/Xorg :0', 'Xorg'),
    ('nvidia-cuda-mps', 'nvidia-cuda-mps-server', 'nvidia-cuda-mps-server'),
    ('slurmstepd', 'slurmstepd: [12.0]', 'slurmstepd'),
    ('orted', 'orted --hnp', 'orted'),
])
def test_infrastructure_is_protected(name, cmdline, reason):
    s = snap([gpu(0)], [proc(10, name=name, cmdline=cmdline, fds=CTX, maps=CTX)])
    (holder,), _unused, _unused = classify(s)
    assert holder.protected and reason in holder.protected_reason


def test_misleading_names_are_not_protected():
    s = snap([gpu(0)], [proc(10, name='[kworker/2:1]', fds=CTX, maps=CTX),
                        proc(11, name='sshd-helper', cmdline='sshd-helper', fds=CTX, maps=CTX)])
    holders, _unused, _unused = classify(s)
    assert [h.protected for h in holders] == [False, False]


def test_init_kernel_threads_own_tree_container_init_and_user_patterns_are_protected():
    s = snap([gpu(0)], [
        proc(1, name='systemd', fds=CTX, maps=CTX),
        proc(2, name='kthreadd', fds=CTX, maps=CTX, kthread=True),
        proc(30, name='bash', fds=CTX, maps=CTX),
        proc(40, name='init', cmdline='/sbin/my-init', fds=CTX, maps=CTX, nspid=[40, 1],
             cgroup='0::/machine.slice/libpod-%s.scope' % CID),
        proc(50, name='jupyter', cmdline='jupyter-lab --port 8888', fds=CTX, maps=CTX),
        proc(60, name='python3', fds=CTX, maps=CTX),
    ])
    holders, _unused, _unused = classify(s, patterns=['^jupyter'], own_tree={30},
                                         facts=runtime_confirms('0::/machine.slice/libpod-%s.scope' % CID))
    reasons = dict((h.pid, h.protected_reason) for h in holders)
    assert 'init process' in reasons[1]
    assert reasons[2] == 'kernel thread'
    assert 'process tree running this module' in reasons[30]
    assert "container's PID namespace" in reasons[40]
    assert "protect pattern '^jupyter'" in reasons[50]
    assert reasons[60] is None


def test_module_itself_and_its_children_are_not_listed():
    s = snap([gpu(0)], [proc(500, fds=CTX), proc(501, name='nvidia-smi', ppid=500, fds=CTX, maps=CTX)],
             own_pid=500)
    holders, clients, _unused = classify(s)
    assert holders == [] and clients == []


def test_unit_from_cgroup_v1_and_v2():
    assert decide.unit_from_cgroup('0::/system.slice/sglang.service\n') == 'sglang.service'
    v1 = '12:pids:/system.slice/x.service\n1:name=systemd:/system.slice/vllm.service\n'
    assert decide.unit_from_cgroup(v1) == 'vllm.service'
    assert decide.unit_from_cgroup('0::/user.slice/user-0.slice/session-4.scope') == 'session-4.scope'
    assert decide.unit_from_cgroup('0::/') is None


def test_resolve_gpus_by_index_uuid_and_bus_id():
    gpus = [gpu(0), gpu(1), gpu(2)]
    assert decide.resolve_gpus([], gpus) == [0, 1, 2]
    assert decide.resolve_gpus(['2', 'GPU-00000000-0000', '00000000:11:00.0'], gpus) == [0, 1, 2]
    assert decide.resolve_gpus(['0000:11:00.0'], gpus) == [1]


@pytest.mark.parametrize('bad', ['9', 'GPU-nope', '-1', ''])
def test_resolve_gpus_names_the_bad_value_and_the_gpus_that_exist(bad):
    with pytest.raises(ValueError) as err:
        decide.resolve_gpus([bad], [gpu(0), gpu(1)])
    assert repr(bad) in str(err.value) and 'GPU-00000001-0000' in str(err.value)


def test_exclude_leaves_gpus_out_of_the_selection_or_of_every_gpu():
    gpus = [gpu(0), gpu(1), gpu(2)]
    assert decide.resolve_gpus([], gpus, exclude=['1']) == [0, 2]
    assert decide.resolve_gpus(['0', '1'], gpus, exclude=['GPU-00000001-0000']) == [0]
    assert decide.resolve_gpus([], gpus, exclude=['0', '1', '00000000:12:00.0']) == []


@pytest.mark.parametrize('bad', ['9', 'GPU-nope'])
def test_exclude_names_the_bad_value_as_exclude(bad):
    with pytest.raises(ValueError) as err:
        decide.resolve_gpus(['0'], [gpu(0), gpu(1)], exclude=[bad])
    assert str(err.value).startswith('exclude: %r matches no GPU' % bad)


def test_unit_names_are_spelled_as_systemd_does_and_bad_ones_named():
    assert decide.unit_names(['sglang', 'vllm@0.service', 'x.scope', 'sglang.service'], 'spare_units') == [
        'sglang.service', 'vllm@0.service', 'x.scope']
    for bad in ('', 'a b', 'x/y.service', 'sglang.socket', '.service'):
        with pytest.raises(ValueError) as err:
            decide.unit_names([bad], 'spare_units')
        assert str(err.value).startswith('spare_units: %r' % bad)


def test_spared_holders_neither_hold_their_gpu_nor_count_their_memory_nor_are_targets():
    unit = '0::/system.slice/sglang.service'
    s = snap([gpu(0, used=3000, processes=[(10, 2000), (11, 1000)]),
              gpu(1, used=2100, processes=[(12, 2000)])], [
        proc(10, name='sglang::schedul', fds=CTX, maps=CTX, cgroup=unit),
        proc(11, name='stray', fds=CTX, maps=CTX),
        proc(12, name='sglang::schedul', fds=['/dev/nvidia1'], maps=['/dev/nvidia1'], cgroup=unit),
    ])
    holders, _unused, _unused = classify(s)
    spared = frozenset([10, 12])
    targets, left = decide.plan_targets(holders, [0, 1], [], spared)
    assert [t.pid for t in targets] == [11] and left == []
    rows = decide.gpu_table(s, holders, [0, 1], 128, spared)
    # GPU 0: the stray's context and its 1000 MiB keep it held; GPU 1: 100 MiB left beside the
    # spared 2000, within the threshold.
    assert [r['free'] for r in rows] == [False, True]
    assert rows[1]['holders'] == [12]
    s.gpus[0].used_mib, s.gpus[0].processes = 2000, [(10, 2000)]
    holders = [h for h in holders if h.pid != 11]
    assert decide.gpu_table(s, holders, [0], 128, spared)[0]['free'] is True
    assert decide.gpu_table(s, holders, [0], 128)[0]['free'] is False


def test_gpu_free_needs_low_memory_and_no_context():
    s = snap([gpu(0, used=0), gpu(1, used=50), gpu(2, used=5000), gpu(3, used=10, processes=[(10, 10)])],
             [proc(10, fds=['/dev/nvidia3'], maps=['/dev/nvidia3'])])
    holders, _unused, _unused = classify(s)
    rows = decide.gpu_table(s, holders, [0, 1, 2, 3], free_threshold_mib=128)
    assert [r['free'] for r in rows] == [True, True, False, False]
    assert rows[3]['holders'] == [10]


def test_plan_targets_keeps_scope_match_and_protection():
    s = snap([gpu(0, used=3000, processes=[(10, 1000), (12, 1000), (13, 1000)]),
              gpu(1, used=1000, processes=[(11, 1000)])], [
        proc(10, name='sglang::schedul', fds=CTX, maps=CTX),                                   # target
        proc(11, name='python3', fds=['/dev/nvidia1'], maps=['/dev/nvidia1']),                  # other GPU
        proc(12, name='nv-hostengine', fds=CTX, maps=CTX),                                      # protected
        proc(13, name='trainer', fds=CTX, maps=CTX),                                            # no match
        proc(14, name='sglang::schedul', fds=['/dev/nvidia0']),                                 # handle
    ])
    holders, _unused, _unused = classify(s)
    targets, left = decide.plan_targets(holders, [0], [re.compile('sglang')])
    assert [t.pid for t in targets] == [10]
    assert dict((h.pid, h.reason) for h in left) == {
        12: 'protected: GPU or cluster infrastructure (nv-hostengine)',
        13: 'does not match the match filter'}
    assert dict((h.pid, h.reason_code) for h in left) == {12: 'protected', 13: 'unmatched'}
    assert 14 not in [h.pid for h in left]   # a handle is never a target, nor "left"


def test_zombies_are_left_for_their_parent():
    s = snap([gpu(0, used=900, processes=[(10, 900)])],
             [proc(10, state='zombie', ppid=77), proc(77, name='launcher')])
    holders, _unused, _unused = classify(s)
    targets, left = decide.plan_targets(holders, [0], [])
    assert targets == [] and 'parent PID 77' in left[0].reason
    assert left[0].reason_code == 'zombie'


def test_units_to_stop_skips_scopes_infrastructure_and_own_session_units():
    def mk(pid, path):
        return proc(pid, fds=CTX, maps=CTX, cgroup='0::' + path)
    s = snap([gpu(0)], [
        mk(10, '/system.slice/sglang.service'),                        # the one to stop
        mk(11, '/system.slice/ssh.service'),                           # infrastructure (PROTECTED_UNIT_PATTERN)
        mk(12, '/system.slice/ansible-pull.service'),                  # the caller's own unit
        mk(13, '/system.slice/sglang.service'),                        # named once
        mk(15, '/system.slice/nvidia-persistenced.service'),           # the backend's infrastructure unit
        mk(16, '/user.slice/user-0.slice/session-4.scope'),            # a login session's scope
        mk(17, '/system.slice/run-r1b2c3.scope'),                      # a transient scope (systemd-run --scope)
        proc(14, fds=CTX, maps=CTX, cgroup=''),                        # no unit at all
    ])
    # systemd confirms every service (its ControlGroup is the holder's cgroup): what is left out
    # is left out by the rule, not for want of confirmation.
    holders, _unused, _unused = classify(s, units=systemd_confirms(
        '/system.slice/sglang.service', '/system.slice/ssh.service', '/system.slice/ansible-pull.service',
        '/system.slice/nvidia-persistenced.service'))
    assert sorted(h.unit for h in holders if h.unit) == sorted([
        'sglang.service', 'ssh.service', 'ansible-pull.service', 'sglang.service', 'nvidia-persistenced.service',
        'session-4.scope', 'run-r1b2c3.scope'])
    assert decide.units_to_stop(holders, {'ansible-pull.service'}, NVIDIA.infrastructure_units) == ['sglang.service']


def test_diagnosis_memory_without_visible_holder():
    s = snap([gpu(3, used=92134)], [])
    rows = decide.gpu_table(s, [], [3], 128)
    (sentence,) = diagnosed(s, [], [], rows)
    assert 'GPU 3: 92134 MiB used with no process visible here' in sentence
    assert 'another PID namespace' in sentence and 'reset' in sentence


def test_diagnosis_dead_parent_memory_held_by_inheriting_child():
    s = snap([gpu(0, used=4614, processes=[(10, 4614)])],
             [proc(11, name='worker', fds=CTX, maps=CTX)], missing=[10])
    holders, _unused, unconfirmed = classify(s)
    rows = decide.gpu_table(s, holders, [0], 128)
    text = ' '.join(diagnosed(s, holders, unconfirmed, rows))
    assert 'NVML charges 4614 MiB to PID 10, which has exited; PID 11 (worker) still maps' in text


def test_diagnosis_unresolvable_and_impossible_pids():
    s = snap([gpu(0, used=3000, processes=[(0, 1000), (4294967295, 1000), (424242, 1000)])], [],
             missing=[0, 424242, 4294967295])
    rows = decide.gpu_table(s, [], [0], 128)
    text = ' '.join(diagnosed(s, [], [], rows))
    assert 'impossible PID 0' in text and 'impossible PID 4294967295' in text
    assert 'NVML lists PID 424242 (1000 MiB) but no such process exists in this PID namespace' in text


def test_diagnosis_d_state_zombie_and_restarting_unit():
    s = snap([gpu(0, used=9000, processes=[(10, 3000), (11, 3000), (12, 3000)])], [
        proc(10, state='disk-sleep', fds=CTX, maps=CTX),
        proc(11, state='zombie', ppid=77),
        proc(12, fds=CTX, maps=CTX, cgroup='0::/system.slice/hog.service'),
        proc(77, name='launcher'),
    ])
    s.procs[10].wchan = 'uvm_gpu_retain_by_uuid'
    holders, _unused, unconfirmed = classify(s, units={'hog.service': UnitFacts('always', 'active')})
    text = ' '.join(diagnosed(s, holders, unconfirmed, decide.gpu_table(s, holders, [0], 128)))
    assert 'PID 10 (python3) is in uninterruptible sleep (D, wchan uvm_gpu_retain_by_uuid)' in text
    assert 'PID 11 (python3) is a zombie' in text and 'parent PID 77 (launcher) must reap it' in text
    assert 'hog.service with Restart=always' in text


def test_a_zombie_leader_with_live_threads_is_a_target_not_left_for_a_parent():
    # pytorch#1223: the main thread exited, another thread keeps the context.
    s = snap([gpu(0, used=800, processes=[(10, 800)])],
             [proc(10, state='zombie-leader', fds=CTX, maps=CTX)])
    holders, _unused, _unused = classify(s)
    targets, left = decide.plan_targets(holders, [0], [])
    assert [t.pid for t in targets] == [10] and left == []
    text = ' '.join(diagnosed(s, holders, [], decide.gpu_table(s, holders, [0], 128)))
    assert 'zombie leader' in text and 'must reap' not in text and 'no such process' not in text


def test_a_pid_namespace_init_no_runtime_confirms_is_a_target_not_a_container_init():
    # `unshare -Urpf --mount-proc` needs no privilege and makes its command PID 1 of a new PID
    # namespace: being such an init shields nothing unless a runtime confirms the container.
    s = snap([gpu(5, used=900, processes=[(40, 900)])],
             [proc(40, name='fakegpu', fds=CTX, maps=CTX, nspid=[40, 1], pidns='pid:[999]')])
    s.procs[40].dev_fds = {'/dev/nvidia5'}
    s.procs[40].dev_maps = {'/dev/nvidia5'}
    holders, _unused, _unused = classify(s)
    assert holders[0].protected is False
    assert [t.pid for t in decide.plan_targets(holders, [5], [])[0]] == [40]
    text = ' '.join(diagnosed(s, holders, [], decide.gpu_table(s, holders, [5], 128)))
    assert 'init of' not in text and 'another PID namespace' in text


def test_a_container_init_whose_runtime_does_not_confirm_it_is_no_shield():
    # A docker-<id>.scope root named, but the runtime gives another container's init (or none):
    # the id is not the holder's, so it neither shields the init nor gets a `docker stop`.
    cgroup = '0::/system.slice/docker-%s.scope\n' % CID
    other = runtime_confirms('0::/system.slice/docker-%s.scope\n' % CID2)
    other['runtimes'] = {('docker', CID): list(other['runtimes'].values())[0]}
    for facts in (None, other):
        s, holders = held_by(cgroup, nspid=[50, 1], facts=facts)
        assert holders[0].owner.confirmed is False
        assert holders[0].protected is False
        assert decide.stoppable_container(holders[0]) is None
        assert decide.containers_to_stop(holders, [3], []) == []


CID = '9408f0bbe98e121b565cc3d4090a128d9894b03676992794f62c58c6a037b74b'
CID2 = '34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376'
POD_UID = '74c13223-5a00-11e9-b385-42010a80018d'


def held_by(cgroup, nspid=None, name='sglang', facts=None):
    s = snap([gpu(3, used=1500, processes=[(50, 1500)])],
             [proc(50, name=name, fds=['/dev/nvidia3'], maps=['/dev/nvidia3'], cgroup=cgroup,
                   nspid=nspid, pidns='pid:[999]' if nspid else OWN_NS)])
    holders = classify(s, facts=facts)[0]
    return s, holders


def test_a_pod_process_is_protected_and_named_with_the_pod_lever():
    cgroup = '0::/kubepods/besteffort/pod%s/%s\n' % (POD_UID, CID)
    s, holders = held_by(cgroup)
    assert holders[0].protected and holders[0].protected_reason == say.POD_PROTECTED
    assert holders[0].owner.pod['uid'] == POD_UID
    assert decide.plan_targets(holders, [3], [])[0] == []
    pod = dict(holders[0].owner.pod, namespace='infer', name='sglang-0')
    clause = say.next_lever(holders[0]._replace(owner=holders[0].owner._replace(pod=pod)))
    assert 'Kubernetes pod infer/sglang-0' in clause and 'kubectl delete pod -n infer sglang-0' in clause
    assert 'never signalled from under the kubelet' in clause


def test_a_podman_container_init_names_the_container_and_its_stop():
    cgroup = '0::/machine.slice/libpod-%s.scope\n' % CID
    s, holders = held_by(cgroup, nspid=[50, 1], facts=runtime_confirms(cgroup))
    holder = holders[0]
    assert holder.protected_reason == say.CONTAINER_INIT
    assert decide.stoppable_container(holder).id == CID
    holder = holder._replace(owner=holder.owner._replace(name='hog'))
    clause = say.next_lever(holder)
    assert 'init of podman container hog (%s)' % CID[:12] in clause
    assert 'stop_containers: true' in clause and '`podman stop -t 10 -- %s`' % CID in clause


def test_a_container_that_restarts_its_holder_is_named():
    cgroup = '0::/system.slice/docker-%s.scope\n' % CID
    s, holders = held_by(cgroup, facts=runtime_confirms(cgroup))
    holder = holders[0]
    assert not holder.protected
    assert say.next_lever(holder).startswith('it survived SIGKILL')   # no policy known
    holder = holder._replace(owner=holder.owner._replace(name='sglang', restart_policy='always'))
    assert decide.container_restarts(holder) == 'always'
    clause = say.next_lever(holder)
    assert 'docker container sglang' in clause and 'restart policy always' in clause
    assert '`docker stop -t 10 -- %s`' % CID in clause


def test_a_guest_process_is_named_with_its_guest_and_its_unit_is_not_this_hosts():
    s, holders = held_by('0::/lxc/101/ns/system.slice/sglang.service\n')
    holder = holders[0]
    assert holder.unit is None                  # never `systemctl stop` on the host
    assert holder.owner.guest_unit == 'sglang.service'
    assert decide.units_to_stop(holders, set()) == []
    clause = say.next_lever(holder)
    assert 'Proxmox guest 101, unit sglang.service inside it' in clause
    assert '`pct exec 101 -- systemctl stop sglang.service`' in clause
    text = ' '.join(diagnosed(s, holders, [], decide.gpu_table(s, holders, [3], 128)))
    assert 'PID 50 (sglang) holds GPU 3: it runs in Proxmox guest 101' in text


def test_a_guest_init_stays_protected_and_is_named():
    s, holders = held_by('0::/lxc/101/ns/init.scope\n', nspid=[50, 1], name='systemd')
    holder = holders[0]
    assert holder.protected
    assert 'init of Proxmox guest 101' in say.next_lever(holder)


def test_a_guest_init_that_respawns_holders_is_named_with_its_guest_and_the_command_not_kill():
    s, holders = held_by('0::/lxc.payload.130\n', nspid=[50, 1], name='sh')
    parent = holders[0].left(None, 'it is protected (%s)' % say.CONTAINER_INIT, respawned='PID(s) 60 came back as PID 61')
    assert parent.protected_reason == say.CONTAINER_INIT
    said = say.respawn_message(parent)
    assert 'init of Proxmox guest 130' in said and '`pct stop 130`' in said, said
    assert '`kill' not in said and 'match' not in said, said
    lxc, lxc_holders = held_by('0::/lxc.payload.gpuops-t-loop\n', nspid=[50, 1], name='sh')
    said = say.respawn_message(lxc_holders[0].left(None, 'protected', respawned='PID(s) 60'))
    assert 'init of LXC guest gpuops-t-loop' in said and '`lxc-stop -n gpuops-t-loop`' in said, said


def test_pid_1_that_respawns_holders_is_named_as_the_init_with_the_command_from_the_host_not_kill():
    s, holders = held_by('0::/init.scope\n', name='sh')
    parent = holders[0]._replace(pid=1, protected=True, protected_reason='PID 1 is the init process').left(
        None, 'it is protected (PID 1 is the init process)', respawned='PID(s) 60 came back as PID 61')
    said = say.respawn_message(parent)
    assert said.startswith('PID 1 (') and 'init of the guest or container this runs in' in said, said
    assert '`pct stop VMID`' in said and '`kill' not in said and 'match' not in said, said


def test_failure_message_names_gpu_mib_pid_state_and_next_lever():
    s = snap([gpu(2, used=76107)], [proc(10, state='disk-sleep', fds=['/dev/nvidia2'], maps=['/dev/nvidia2'])])
    holders, _unused, _unused = classify(s)
    rows = decide.gpu_table(s, holders, [2], 128)
    msg = say.failure_message(rows, holders, 12.34, allow_reset=False)
    assert msg.startswith('GPU 2 (GPU-00000002-0000) still holds 76107 MiB after 12.3 s: PID 10 (python3) '
                          'disk-sleep')
    assert 'reset the GPU (allow_reset: true) or reboot the host' in msg
    empty = snap([gpu(1, used=500)], [])
    msg = say.failure_message(decide.gpu_table(empty, [], [1], 128), [], 3.0, allow_reset=False)
    assert 'no process visible here' in msg and 'reset or reboot' in msg


def test_sigterm_is_futile_for_an_ignoring_mask_or_a_traced_stop_only():
    s = snap([gpu(0, used=900, processes=[(10, 900)])], [proc(10, fds=CTX, maps=CTX)])
    (holder,), _unused, _unused = classify(s)
    assert decide.sigterm_futile_code(holder) is None
    assert decide.sigterm_futile_code(holder._replace(state='stopped')) is None, 'SIGCONT makes it act'
    ignoring = holder._replace(ignores_sigterm=True)
    assert say.sigterm_futile(ignoring, decide.sigterm_futile_code(ignoring)) == 'ignored (SigIgn)'
    traced = holder._replace(state='tracing-stop', tracer_pid=77, tracer_name='gdb')
    assert 'traced by PID 77 (gdb)' in say.sigterm_futile(traced, decide.sigterm_futile_code(traced))


@pytest.mark.parametrize('nspid, handles, ignores, dropped', [
    ([5010, 1], False, False, True),     # PID 1 of its own namespace, no handler: the kernel drops SIGTERM
    ([5010, 1], True, False, False),     # its own handler gets it
    ([5010, 1], False, True, False),     # SigIgn says so first (sigterm_ignored)
    ([5010, 7], False, False, False),    # not its namespace's init
    ([5010], False, False, False),       # this namespace's
])
def test_sigterm_is_dropped_for_a_namespace_init_without_a_handler(nspid, handles, ignores, dropped):
    p = proc(10, fds=CTX, maps=CTX, nspid=nspid)
    p.handles_sigterm, p.ignores_sigterm = handles, ignores
    (holder,), _unused, _unused = classify(snap([gpu(0, used=900, processes=[(10, 900)])], [p]))
    assert holder.sigterm_dropped is dropped
    want = lever.SIGTERM_DROPPED if dropped else (lever.SIGTERM_IGNORED if ignores else None)
    assert decide.sigterm_futile_code(holder) == want


def test_a_traced_holder_is_diagnosed_with_its_tracer():
    p = proc(10, fds=CTX, maps=CTX, state='tracing-stop')
    p.tracer_pid = 77
    s = snap([gpu(0, used=900, processes=[(10, 900)])], [p])
    s.related_names = {77: 'gdb'}
    holders, _unused, unconfirmed = classify(s)
    assert (holders[0].tracer_pid, holders[0].tracer_name) == (77, 'gdb')
    text = ' '.join(diagnosed(s, holders, unconfirmed, decide.gpu_table(s, holders, [0], 128)))
    assert 'traced by PID 77 (gdb) and stopped (state t)' in text


def test_a_traced_holder_alive_after_sigkill_names_its_tracer_as_the_lever_never_a_reset():
    # A SIGKILLed tracee stops in its exit until its tracer resumes it (lab, 6.18 kernel:
    # test_gpu_reclaim.py's traced-holder test): the tracer is the lever, not a reset.
    p = proc(10, fds=CTX, maps=CTX, state='tracing-stop')
    p.tracer_pid = 77
    s = snap([gpu(0, used=900, processes=[(10, 900)])], [p])
    s.related_names = {77: 'strace'}
    holders, _unused, _unused = classify(s)
    clause = say.next_lever(holders[0].left(decide.SURVIVED, 'survived the ladder'))
    assert clause.startswith('it is traced by PID 77 (strace) and stays in its exit'), clause
    assert 'kill -CONT 77' in clause and 'reset' not in clause and 'reboot' not in clause


def test_a_respawning_parent_is_a_target_only_when_it_matches_or_holds_nothing_and_is_unprotected():
    loop = make_holder(pid=50, name='bash', cmdline='bash -c while true', protected=False, protected_reason=None)
    assert say.respawner_refusal(loop, lever.respawner_lever(loop, [], False).refusal) is None
    assert say.respawner_refusal(loop, lever.respawner_lever(loop, [], True).refusal) == 'it holds a GPU itself'
    assert say.respawner_refusal(loop, lever.respawner_lever(loop, [re.compile('while')], True).refusal) is None
    assert say.respawner_refusal(loop, lever.respawner_lever(loop, [re.compile('sglang')], False).refusal) == 'it does not match `match`'
    guarded = loop._replace(protected=True, protected_reason='GPU or cluster infrastructure (sshd)')
    assert say.respawner_refusal(guarded, lever.respawner_lever(guarded, [re.compile('.')], False).refusal).startswith('it is protected')


def test_listed_processes_are_enough_when_nvml_charges_all_memory_to_live_local_holders():
    s = snap([gpu(0, used=4614 + 100, processes=[(10, 4614)]), gpu(1, used=900)],
             [proc(10, fds=CTX, maps=CTX)])
    assert say.full_scan(decide.full_scan_code(s, [0], 128)) is None
    # GPU 1 holds 900 MiB nobody is charged with, but it is not selected
    assert say.full_scan(decide.full_scan_code(s, [1], 128)) == 'GPU 1: 900 MiB used, 0 MiB charged to processes'


@pytest.mark.parametrize('gpus, procs, why', [
    # the parent NVML charges is gone: a forked child may hold its context through inherited maps
    ([gpu(0, used=4614, processes=[(10, 4614)])], [], 'NVML lists PID 10, which holds nothing here'),
    ([gpu(0, used=4614, processes=[(10, 4614)])], [proc(10, fds=CTX, maps=CTX, state='zombie')],
     'NVML lists PID 10, which holds nothing here'),
    # a PID of another namespace, or a reused one, resolving to a process without the device
    ([gpu(0, used=4614, processes=[(10, 4614)])], [proc(10)], 'NVML lists PID 10, which holds nothing here'),
    ([gpu(0, used=4614, processes=[(10, None)])], [proc(10, fds=CTX, maps=CTX)],
     'NVML gives no memory for PID 10'),
    # more used than charged, beyond the threshold: a process NVML does not list holds some
    ([gpu(0, used=4614 + 129, processes=[(10, 4614)])], [proc(10, fds=CTX, maps=CTX)],
     'GPU 0: 4743 MiB used, 4614 MiB charged to processes'),
])
def test_every_process_is_read_when_the_listed_ones_do_not_explain_the_memory(gpus, procs, why):
    assert why in say.full_scan(decide.full_scan_code(snap(gpus, procs), [0], 128))


def _ranks(count, uncharged):
    """`count` ranks of 1,634 MiB on GPU 0, as NVML lists them, with `uncharged` MiB more used."""
    listed = [(100 + i, 1634) for i in range(count)]
    return snap([gpu(0, used=1634 * count + uncharged, processes=listed)],
                [proc(pid, fds=CTX, maps=CTX) for pid, _mib in listed])


def test_the_drivers_own_share_of_each_context_is_no_reason_to_read_every_process():
    # Measured on one H200 (tests/gpu s12): 24 ranks, 141 MiB used beyond the process list; 8 ranks, 49.
    for count, uncharged in ((24, 141), (8, 49), (2, 14), (1, 8)):
        snapshot = _ranks(count, uncharged)
        assert say.full_scan(decide.full_scan_code(snapshot, [0], 128)) is None, count
        assert decide.uncharged_gpus(snapshot.gpus, [0], 128) == [], count


def test_memory_beyond_the_contexts_share_still_makes_every_process_read():
    # 24 contexts may leave 128 + 23 * 8 = 312 MiB charged to nobody; one MiB more is a holder NVML
    # does not list (a forked child's inherited mappings, a process in another namespace).
    snapshot = _ranks(24, 313)
    assert say.full_scan(decide.full_scan_code(snapshot, [0], 128)) == 'GPU 0: %d MiB used, %d MiB charged to processes' % (
        1634 * 24 + 313, 1634 * 24)
    assert decide.uncharged_gpus(snapshot.gpus, [0], 128) == [0]
    assert say.full_scan(decide.full_scan_code(_ranks(24, 312), [0], 128)) is None
    # one context: the threshold alone, as before
    assert say.full_scan(decide.full_scan_code(_ranks(1, 129), [0], 128)) is not None
    assert decide.uncharged_gpus(_ranks(1, 129).gpus, [0], 128) == [0]


def test_sentences_escape_names_users_chose():
    # A user titles her process with a newline and an escape sequence: no sentence or failure
    # message carries them raw (gpu_text.escape_text).
    evil = 'x\nGPU 2 free\x1b[2J'
    s = snap([gpu(2, used=76107)], [proc(10, name=evil, state='disk-sleep', fds=['/dev/nvidia2'],
                                         maps=['/dev/nvidia2'], ppid=11)])
    s.related_names[11] = 'p\x1bq'
    holders, _unused, _unused = classify(s)
    rows = decide.gpu_table(s, holders, [2], 128)
    texts = diagnosed(s, holders, [], rows) + [say.failure_message(rows, holders, 1.0, False)]
    for text in texts:
        assert '\n' not in text and '\x1b' not in text, text
    assert any('PID 10 (x\\nGPU 2 free\\x1b[2J)' in t for t in texts)
    zombie = holders[0]._replace(state='zombie')
    said = say.skip(zombie, decide.skip_code(zombie, ()))
    assert '\x1b' not in said and 'p\\x1bq' in said


def test_a_listed_pid_reused_by_a_rank_of_another_gpu_is_not_that_gpus_holder():
    """NVML goes on listing a dead parent's PID on GPU 1 while its forked child keeps the context
    (FIELD_NOTES); the PID is reused by a rank holding GPU 0. Before, the reclaim of GPU 1 took
    that rank for GPU 1's holder. A context keeps its GPU's node open and mapped: without GPU
    1's node, PID 30 is not GPU 1's holder; the child that maps it is."""
    ctx1 = ('/dev/nvidia1', '/dev/nvidiactl')
    s = snap([gpu(0, used=900, processes=[(30, 900)]), gpu(1, used=4000, processes=[(30, 4000)])],
             [proc(30, name='sglang::schedul', fds=CTX, maps=CTX), proc(31, name='python3', fds=ctx1, maps=ctx1, ppid=1)])
    holders, _unused, unconfirmed = classify(s)
    by_pid = dict((h.pid, h) for h in holders)
    assert by_pid[30].context_gpus == [0]
    assert by_pid[31].context_gpus == [1]
    assert unconfirmed == [{'pid': 30, 'name': 'sglang::schedul', 'gpus': [1], 'code': lever.UNCONFIRMED_GPU}]
    assert decide.full_scan_code(s, {1}, 128).code == lever.LISTED_HOLDS_NOTHING
