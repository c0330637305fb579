# -*- coding: utf-8 -*-
"""gpu_lever: one table from an owner to its lever (what to run, allowed or a refusal code, how
a comeback is watched), through the holders gpu_decide.classify makes from cgroups as the real
hosts write them (observations.py); and the runtime table, the argv each runtime is run with."""

from __future__ import absolute_import, division, print_function
__metaclass__ = type

import re

# gpu_owner reads a cgroup with the families' recognisers, which gpu_families hands it on import.
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_families  # noqa: F401 pylint: disable=unused-import
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_trust as trust

from .holders import make_holder
from .observations import own, v2

CID = 'a' * 64


def holder(cgroup_owner, **fields):
    return make_holder(owner=cgroup_owner, **fields)


def system_unit(unit='sglang.service', confirmed=True, restart='always'):
    owner = gpu_owner.owner_from_path('/system.slice/%s' % unit)
    owner = owner._replace(confirmed=confirmed)
    return holder(owner, unit=unit, unit_restart=restart)


def container(runtime='docker', policy='always', confirmed=True):
    prefix = {'docker': 'docker', 'podman': 'libpod'}[runtime]
    owner = gpu_owner.owner_from_path('/system.slice/%s-%s.scope' % (prefix, CID))
    owner = owner._replace(confirmed=confirmed, restart_policy=policy)
    return holder(owner)


def test_a_confirmed_system_unit_is_stopped_through_systemctl_and_watched_by_its_restart():
    got = lever.unit_lever(system_unit())
    assert got.kind == lever.STOP_UNIT and got.refusal is None and got.key == 'sglang.service'
    assert got.argv == ['systemctl', 'stop', '--no-block', '--', 'sglang.service']
    assert got.watch == lever.WATCH_UNIT
    assert lever.unit_lever(system_unit(restart='no')).watch is None


def test_a_unit_lever_says_why_not_as_a_code():
    assert lever.unit_lever(system_unit(confirmed=False)).refusal == trust.UNCONFIRMED
    assert lever.unit_lever(system_unit(), protected_units={'sglang.service'}).refusal == lever.NEVER_STOPPED
    assert lever.unit_lever(system_unit(), allowed=False).refusal == lever.OPTION_OFF
    scope = holder(gpu_owner.owner_from_path('/user.slice/user-0.slice/session-3.scope'), unit='session-3.scope')
    assert lever.unit_lever(scope).refusal == lever.NOT_A_SERVICE


def test_every_runtime_row_reaches_its_container_and_none_removes_one():
    for runtime in ('docker', 'podman'):
        got = lever.container_lever(container(runtime), grace=5)
        assert got.refusal is None and got.argv == [runtime, 'stop', '-t', '5', '--', CID]
        assert got.watch == lever.WATCH_CONTAINER
    assert lever.container_lever(container(policy='no')).watch is None
    for row in lever.RUNTIMES.values():
        assert set(row) >= {'cli', 'inspect', 'parse', 'stop'}
        for argv in (row['stop'], row.get('guest_stop')):
            assert 'rm' not in (argv or []) and 'kill' not in (argv or [])


def test_a_container_lever_refuses_with_a_code():
    assert lever.container_lever(container(confirmed=False)).refusal == trust.UNCONFIRMED
    assert lever.container_lever(container(), protected_ids={CID}).refusal == lever.CALLERS
    assert lever.container_lever(container(), allowed=False).refusal == lever.OPTION_OFF
    assert lever.container_lever(container(), [re.compile('^nomatch$')]).refusal == lever.UNMATCHED
    guarded = container()._replace(protected=True, protected_code=lever.INFRASTRUCTURE)
    assert lever.container_lever(guarded).refusal == lever.PROTECTED
    init = container()._replace(protected=True, protected_code=lever.INIT_SHIELD)
    assert lever.container_lever(init).refusal is None
    assert lever.container_lever(system_unit()).refusal == trust.NOT_THAT_OWNER


def test_a_guest_unit_is_named_with_its_runtime_rows_command_and_watched_through_the_guest():
    for path, argv in (('/lxc.payload.gpu1/system.slice/vllm.service', 'lxc-attach -n gpu1 -- systemctl stop vllm.service'),
                       ('/lxc/129/ns/system.slice/vllm.service', 'pct exec 129 -- systemctl stop vllm.service')):
        guest = holder(gpu_owner.owner_from_path(path))
        got = lever.by_hand(guest)
        assert got.kind == lever.STOP_GUEST_UNIT and got.why == lever.GUEST_UNIT
        assert ' '.join(got.argv) == argv and got.watch == lever.WATCH_GUEST
        assert got.key == lever.guest_unit(guest) and got.key[1] == 'vllm.service'
        assert '`%s`' % argv in say.owner_clause(guest, got)


def test_a_respawner_is_a_target_unless_a_code_says_why_not():
    parent = holder(gpu_owner.new_owner('none'), name='bash', cmdline='bash loop.sh')
    assert lever.respawner_lever(parent, (), holds_gpu=False).refusal is None
    assert lever.respawner_lever(parent, (), holds_gpu=True).refusal == lever.HOLDS_GPU
    assert lever.respawner_lever(parent, [re.compile('sglang')], holds_gpu=False).refusal == lever.UNMATCHED
    guarded = parent._replace(protected=True, protected_reason='GPU or cluster infrastructure (sshd)')
    got = lever.respawner_lever(guarded, (), holds_gpu=False)
    assert got.refusal == lever.PROTECTED and got.watch == lever.WATCH_PARENT
    assert say.respawner_refusal(guarded, got.refusal) == 'it is protected (GPU or cluster infrastructure (sshd))'


def test_the_next_lever_reads_the_protection_code_not_the_sentence():
    init = container()._replace(protected=True, protected_code=lever.INIT_SHIELD,
                                protected_reason='anything a future wording says')
    assert say.next_lever(init).startswith('it is the init of docker container')
    other = container(policy='no')._replace(protected=True, protected_code=lever.PATTERN,
                                            protected_reason=say.CONTAINER_INIT)
    assert say.next_lever(other).startswith('it is protected (')


def supervised(runtime='supervisord', program='worker', error=None):
    found = {'pid': 300, 'start_time': 9, 'conf': '/etc/supervisor/supervisord.conf', 'uid': 0,
             'home': None, 'program_pid': 4242, 'service': None}
    owner = gpu_owner.new_owner(gpu_owner.SUPERVISOR, '/system.slice/supervisor.service', runtime=runtime,
                                id=program, name=program, unit='supervisor.service',
                                manager=gpu_owner.SYSTEM_MANAGER, confirmed=True, cli_error=error,
                                supervisor=found)
    return holder(owner, unit='supervisor.service', unit_restart='on-failure')


def test_a_supervised_program_is_a_row_of_the_table_stopped_through_its_own_supervisor():
    assert set(lever.SUPERVISORS) >= {'supervisord', 'runit', 's6', 'pm2'}
    got = lever.supervised_lever(supervised(), grace=5)
    assert got.kind == lever.STOP_SUPERVISED and got.refusal is None
    assert got.argv == ['supervisorctl', '-c', '/etc/supervisor/supervisord.conf', 'stop', 'worker']
    assert got.watch == lever.WATCH_SUPERVISOR
    # the signal ladder leaves it to its supervisor; the unit around it is never its lever
    assert lever.skip_code(supervised(), ()) is not None
    assert lever.by_hand(supervised()).why == lever.SUPERVISED


def test_a_supervised_lever_refuses_with_a_code():
    assert lever.supervised_lever(supervised(), allowed=False).refusal == lever.OPTION_OFF
    assert lever.supervised_lever(supervised(), [re.compile('^nomatch$')]).refusal == lever.UNMATCHED
    assert lever.supervised_lever(supervised()._replace(protected=True)).refusal == lever.PROTECTED
    missing = supervised(error={'code': gpu_owner.CLI_MISSING, 'text': 'supervisorctl is not on PATH here'})
    assert lever.supervised_lever(missing).refusal == gpu_owner.CLI_MISSING
    assert lever.supervised_lever(system_unit()).refusal == trust.NOT_THAT_OWNER


def test_one_entry_maps_each_kind_of_owner_to_its_lever():
    assert lever.of(system_unit()).kind == lever.STOP_UNIT
    assert lever.of(system_unit(), options={'stop_units': False}).refusal == lever.OPTION_OFF
    assert lever.of(container()).kind == lever.STOP_CONTAINER
    assert lever.of(supervised()).kind == lever.STOP_SUPERVISED
    guest = holder(gpu_owner.owner_from_path('/lxc.payload.gpu1/system.slice/vllm.service'))
    assert lever.of(guest).kind == lever.STOP_GUEST_UNIT
    pod = holder(gpu_owner.owner_from_path('/kubepods.slice/kubepods-pod0123abcd_0000_0000_0000_000000000000.slice'))
    assert lever.of(pod).kind == lever.DELETE_POD
    orphan = holder(gpu_owner.owner_from_path('/init.scope'), ppid=1)
    got = lever.of(orphan)
    assert got.kind == lever.SIGNAL and got.refusal is None and got.key == (4242, 77)
    assert lever.of(orphan._replace(pid=1)).refusal == lever.INIT


def test_codes_are_grouped_and_no_value_means_two_things():
    """Issue 32 item 4: each group's codes are its own, and a value named twice in gpu_lever is
    one code of one meaning (an adoption's refusal or error reusing the step's or protection's),
    never two (before: 'pod' was the kubelet's lever and the pod shield, 'container_init' a
    lever's reason and a protection, 'restart_policy' a watch and a reason)."""
    groups = {'steps': lever.STEPS, 'watches': lever.WATCHES, 'why_by_hand': lever.WHY_BY_HAND,
              'protections': lever.PROTECTIONS, 'adopt_refusals': lever.ADOPT_REFUSALS,
              'adopt_errors': lever.ADOPT_ERRORS, 'diagnosis': lever.DIAGNOSIS, 'full_scan': lever.FULL_SCAN}
    for name, codes in groups.items():
        assert len(set(codes)) == len(codes), name
    named = {}
    for name, value in vars(lever).items():
        if name.isupper() and isinstance(value, str):
            named.setdefault(value, set()).add(name)
    shared = dict((value, names) for value, names in named.items() if len(names) > 1)
    assert shared == {
        'gone': {'GONE', 'ADOPT_GONE'}, 'reused': {'REUSED', 'ADOPT_REUSED'},
        'no_start_time': {'NO_START_TIME', 'ADOPT_NO_START_TIME'}, 'stop_failed': {'STOP_FAILED', 'ADOPT_STOP_FAILED'},
        'kthread': {'KTHREAD', 'ADOPT_KTHREAD'}}
    # Lever.why, Lever.watch and the protection codes never share a value.
    assert not set(lever.WHY_BY_HAND) & set(lever.WATCHES)
    assert not set(lever.WHY_BY_HAND) & set(lever.PROTECTIONS)


# --- the runtime table: what each runtime is run with -----------------------------------------

def test_stop_argv_never_removes_and_carries_the_grace():
    container = own(v2("/machine.slice/libpod-%s.scope" % CID))
    assert lever.runtime_argv("podman", "stop", container, grace=7.6) == ["podman", "stop", "-t", "8", "--", CID]
    docker = own(v2("/system.slice/docker-%s.scope" % CID))
    assert lever.runtime_argv("docker", "stop", docker, grace=0) == ["docker", "stop", "-t", "0", "--", CID]
    for row in lever.RUNTIMES.values():
        assert "rm" not in (row["stop"] or []) and "kill" not in (row["stop"] or [])


def test_pods_and_guests_have_no_stop():
    for runtime in ("cri-containerd", "cri-o", "proxmox", "lxc", "systemd-nspawn"):
        assert lever.runtime_argv(runtime, "stop", gpu_owner.new_owner("pod", id=CID)) is None


def test_containerd_argv_carries_its_namespace():
    got = own(v2("/k8s.io/%s" % CID))
    assert lever.runtime_argv("containerd", "inspect", got)[:3] == ["nerdctl", "--namespace", "k8s.io"]
