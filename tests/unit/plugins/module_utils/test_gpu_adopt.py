"""gpu_adopt (the service_adopt module's path), on real processes of this host: the pins
(PID:START_TIME), what a scope may take, the verification of the move, and the ladder's SIGKILL
at once for SIGTERM-ignoring processes. systemd's scope itself (StartTransientUnit, its stop)
runs in the lab: the adopt and podman Molecule scenarios, tests/integration/test_security.py
(a command line past 128 KiB), test_runner.py and make demo (SIGTERM-ignoring ranks). Carries
what tests/unit/roles/inference_service/test_adopt.py proved of the role's old files/adopt.py."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import signal
import subprocess
import sys

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act, gpu_adopt, gpu_observe, gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever, gpu_say

WAIT = "import os, signal, sys, time\n%s\nprint('ready', flush=True)\ntime.sleep(60)\n"


def started(code='', args=()):
    proc = subprocess.Popen([sys.executable, '-c', WAIT % code] + list(args), stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b'ready'   # its handlers (and children) are in place
    return proc


def start_of(pid):
    return gpu_observe.read_identity(pid).start_time


@pytest.fixture
def procs():
    made = []
    yield lambda *a, **k: made.append(started(*a, **k)) or made[-1]
    for proc in made:
        proc.kill()
        proc.wait()


# --- the roots: every PID with its start time ---------------------------------------------------

def test_roots_map_pids_to_start_times_and_a_bad_entry_is_named():
    assert gpu_adopt.parse_roots({'42': 8812345, 7: '99', '9': None}) == [(7, 99), (9, None), (42, 8812345)]
    with pytest.raises(ValueError, match="'x' is not a PID"):
        gpu_adopt.parse_roots({'x': 1})
    with pytest.raises(ValueError, match="start time of PID 42 is 'soon'"):
        gpu_adopt.parse_roots({'42': 'soon'})
    with pytest.raises(ValueError, match='must map each PID'):
        gpu_adopt.parse_roots(['42:1'])


def test_a_root_without_a_start_time_refuses_the_whole_adoption_and_plans_nothing(procs):
    server = procs()
    adoption = gpu_adopt.Adoption('sglang-adopted', 5, [(server.pid, start_of(server.pid)), (4242, None)],
                                  actor=Refusing())
    out = adoption.run()
    assert 'no start time was recorded for PID 4242' in out['error'] and 'nothing was adopted or stopped' in out['error']
    assert out['procs'] == [] and out['scope'] is None and adoption.planned == {}
    assert server.poll() is None


# --- what the scope may take -----------------------------------------------------------------------

class Seen(object):
    def __init__(self, start_time=100, kthread=False, cgroup='0::/user.slice/user-0.slice/session-4.scope',
                 state='sleeping'):
        self.start_time, self.kthread, self.state = start_time, kthread, state
        self.owner = gpu_owner.owner_from_cgroup(cgroup)


@pytest.mark.parametrize('pid, start, seen, code', [
    (0, 100, Seen(), gpu_adopt.NEVER),
    (1, 100, Seen(), gpu_adopt.NEVER),
    (77, 100, Seen(), gpu_adopt.NEVER),                 # this module's own tree
    (50, 100, None, gpu_adopt.GONE),
    (50, 100, Seen(state='zombie'), gpu_adopt.GONE),
    (50, 100, Seen(state='zombie-leader'), None),        # its threads still hold what it holds
    (50, 100, Seen(start_time=101), gpu_adopt.REUSED),
    (50, 100, Seen(kthread=True), gpu_adopt.KTHREAD),
    (50, 100, Seen(cgroup='0::/system.slice/jupyter.service'), gpu_adopt.OWNED),
    (50, 100, Seen(cgroup='0::/system.slice/docker-%s.scope' % ('a' * 64)), gpu_adopt.OWNED),
    (50, 100, Seen(cgroup='0::/kubepods.slice/kubepods-pod1.slice/x'), gpu_adopt.OWNED),
    (50, 100, Seen(cgroup='0::/lxc.payload.g1/system.slice/sglang.service'), gpu_adopt.OWNED),
    (50, 100, Seen(cgroup='0::/user.slice/user-1000.slice/user@1000.service/app.slice/sglang.service'),
     gpu_adopt.OWNED),
    (50, 100, Seen(), None),                             # a login session (setsid nohup over SSH)
    (50, 100, Seen(cgroup='0::/system.slice/run-u5.scope'), None),
    (50, 100, Seen(cgroup='0::/'), None),
    (50, None, Seen(start_time=555), None),              # a descendant: found now, no recorded start
])
def test_only_what_no_owner_stops_is_adopted(pid, start, seen, code):
    assert gpu_adopt.refusal(pid, start, seen, own_tree={77}) == code


def test_an_owned_process_is_named_with_its_owner_escaped():
    owner = gpu_owner.owner_from_cgroup('0::/system.slice/jupyter.service')
    assert gpu_adopt.sentence(gpu_adopt.OWNED, 14, owner) == (
        'PID 14 belongs to service jupyter.service, which stops it: left to that owner, not adopted')


def test_the_plan_takes_each_root_still_its_process_and_every_descendant(procs):
    # A launcher with two ranks (its children), and an orphan root: as the seeds' servers.
    launcher = procs("kids = [__import__('subprocess').Popen(['sleep', '60']) for _ in range(2)]")
    orphan = procs()
    moved_on = procs()
    kids = sorted(gpu_observe.descendants_of(launcher.pid))
    assert len(kids) == 2
    roots = [(launcher.pid, start_of(launcher.pid)), (orphan.pid, start_of(orphan.pid)),
             (moved_on.pid, start_of(moved_on.pid) - 1), (1, 1), (os.getpid(), start_of(os.getpid()))]
    adoption = gpu_adopt.Adoption('sglang-adopted', 5, sorted(roots), actor=Refusing())
    out = adoption.run(check_mode=True)
    assert out['error'] is None and out['scope'] is None
    assert sorted(adoption.planned) == sorted([launcher.pid, orphan.pid] + kids)
    assert dict((p['pid'], p['root']) for p in out['procs']) == dict(
        [(launcher.pid, True), (orphan.pid, True)] + [(k, False) for k in kids])
    assert all(p['start_time'] == start_of(p['pid']) for p in out['procs'])
    assert dict((s['pid'], s['reason_code']) for s in out['not_adopted_codes']) == {
        moved_on.pid: gpu_adopt.REUSED, 1: gpu_adopt.NEVER, os.getpid(): gpu_adopt.NEVER}
    assert 'PID %d is now another process (start time changed): left alone' % moved_on.pid in out['not_adopted']
    assert all(p.poll() is None for p in (launcher, orphan, moved_on))    # check mode: nothing touched


def test_a_command_line_past_128_kib_is_adopted_by_its_numbers_and_returned_cut_short(procs):
    big = procs(args=['%0100d' % i for i in range(1500)])
    assert len(gpu_observe.read_process(big.pid).cmdline) > 128 * 1024
    out = gpu_adopt.Adoption('sglang-adopted', 5, [(big.pid, start_of(big.pid))], actor=Refusing()).run(True)
    (entry,) = out['procs']
    assert entry['pid'] == big.pid and len(entry['cmdline']) == gpu_adopt.CMDLINE_CHARS


# --- the move's verification ---------------------------------------------------------------------

def test_a_scope_member_is_a_planned_process_or_one_forked_since_never_a_reused_number():
    planned = {(10, 500), (11, 501)}
    chains = {10: [(10, 500), (1, 1)],
              12: [(12, 900), (11, 501), (1, 1)],    # forked by a planned rank since the plan
              13: [(13, 950), (1, 1)],               # a stranger
              14: [(14, 960), (10, 499), (1, 1)]}    # its parent took a planned number since
    assert gpu_adopt.strangers(chains, planned) == [13, 14]


class Refusing(object):
    """systemd's side where there is none (this host is no systemd host): refuses the scope
    (busctl fails), so a test that gets this far shows the plan went on to act; a scope's stop
    succeeds and the scope reads down 0.1 s later."""

    recording = False

    def __init__(self):
        self.calls = []

    def run(self, argv, timeout, as_user=None, ends=()):
        self.calls.append(tuple(argv))
        if argv[0] == 'busctl':
            return gpu_say.step(gpu_lever.COMMAND_FAILED, rc=1, output='no systemd here'), False
        return gpu_say.step(gpu_lever.COMMAND_OK, rc=0, output=''), True

    def wait_until(self, predicate, timeout, max_interval=None):
        return True, 0.1


STOP_SCOPE = ('systemctl', 'stop', '--no-block', '--', 'sglang-adopted-1.scope')


def test_a_refused_scope_fails_naming_it_and_signals_nothing(procs):
    server = procs()
    actor = Refusing()
    out = gpu_adopt.Adoption('sglang-adopted', 5, [(server.pid, start_of(server.pid))], actor=actor).run()
    assert out['error'].startswith('systemd refused the scope sglang-adopted-') and 'no systemd here' in out['error']
    assert actor.calls == [tuple(gpu_adopt.scope_argv(out['scope'], [server.pid], 5,
                                                      'adopted by gpuops.reclaim: sglang-adopted'))]
    assert [a['step'] for a in out['actions']] == ['start_scope'] and out['killed_at_once'] == []
    assert out['left'] == [server.pid] and server.poll() is None


# --- the ladder's rule: SIGKILL at once when SigIgn holds SIGTERM ------------------------------------

def test_sigterm_ignoring_members_get_sigkill_at_once_and_the_others_the_scopes_stop(procs):
    ignoring = procs('signal.signal(signal.SIGTERM, signal.SIG_IGN)')
    handling = procs('signal.signal(signal.SIGTERM, lambda *_: None)')   # SigCgt: it gets its grace
    plain = procs()
    actor = Refusing()
    adoption = gpu_adopt.Adoption('sglang-adopted', 5, [], actor=actor)
    adoption.planned = dict((p.pid, start_of(p.pid)) for p in (ignoring, handling, plain))
    adoption._end('sglang-adopted-1.scope')      # pylint: disable=protected-access
    assert ignoring.wait(timeout=10) == -signal.SIGKILL
    assert handling.poll() is None and plain.poll() is None
    assert [k['pid'] for k in adoption.out['killed_at_once']] == [ignoring.pid]
    steps = [(a['step'], a['target'], a['result']) for a in adoption.out['actions']]
    assert steps == [('adopt_sigkill', ignoring.pid, gpu_act.SENT),
                     ('stop_scope', 'sglang-adopted-1.scope', 'stopped in 0.10 s')]
    sigkill, stop = adoption.out['actions']
    assert sigkill['at_s'] <= stop['at_s'] and 'took_s' in stop
    assert actor.calls == [STOP_SCOPE] and adoption.out['stopped'] is True


def test_when_every_member_ignored_sigterm_the_emptied_scope_needs_no_stop(procs):
    ignore = 'signal.signal(signal.SIGTERM, signal.SIG_IGN)'
    ranks = [procs(ignore), procs(ignore)]
    actor = Refusing()
    adoption = gpu_adopt.Adoption('sglang-adopted', 5, [], actor=actor)
    adoption.planned = dict((p.pid, start_of(p.pid)) for p in ranks)
    adoption._end('sglang-adopted-1.scope')      # pylint: disable=protected-access
    assert all(p.wait(timeout=10) == -signal.SIGKILL for p in ranks)
    assert sorted(k['pid'] for k in adoption.out['killed_at_once']) == sorted(p.pid for p in ranks)
    assert actor.calls == [] and adoption.out['stopped'] is True


def test_a_member_whose_number_was_reused_is_never_signalled(procs):
    ignoring = procs('signal.signal(signal.SIGTERM, signal.SIG_IGN)')
    adoption = gpu_adopt.Adoption('sglang-adopted', 5, [], actor=Refusing())
    adoption.planned = {ignoring.pid: start_of(ignoring.pid) - 1}     # planned as another process
    adoption._end('sglang-adopted-1.scope')      # pylint: disable=protected-access
    assert ignoring.poll() is None
    (sigkill, _stop) = adoption.out['actions']
    assert sigkill['result'] == gpu_act.REUSED and adoption.out['killed_at_once'] == []


class Stopping(Refusing):
    """An actor whose scope stop exits `rc` with `output`, after which the scope reads down
    (`down`) or still deactivating at the bound."""

    def __init__(self, rc, output, down):
        Refusing.__init__(self)
        self.answer = (rc, output, down)

    def run(self, argv, timeout, as_user=None, ends=()):
        self.calls.append(tuple(argv))
        rc, output, _down = self.answer
        return gpu_say.step(gpu_lever.COMMAND_FAILED if rc else gpu_lever.COMMAND_OK, rc=rc, output=output), rc == 0

    def wait_until(self, predicate, timeout, max_interval=None):
        return (True, 0.1) if self.answer[2] else (False, timeout)


def test_the_scopes_stop_is_read_from_its_code_never_its_words(procs):
    plain = procs()           # a member that outlives the stop (the actor stops nothing)
    cases = [
        ((0, '', True), gpu_say.step(gpu_lever.UNIT_STOPPED, waited=0.1), True),
        ((0, '', False), gpu_say.step(gpu_lever.UNIT_STOPPING, timeout=35), False),
        # Words that say a stop, a code that says it failed: the code decides (before,
        # result.startswith('stopped') read such words as stopped).
        ((5, 'stopped? no: Unit sglang-adopted-1.scope not loaded.', True),
         gpu_say.step(gpu_lever.STOP_FAILED, output='stopped? no: Unit sglang-adopted-1.scope not loaded.'), False),
    ]
    for answer, said, stopped in cases:
        actor = Stopping(*answer)
        adoption = gpu_adopt.Adoption('sglang-adopted', 5, [], actor=actor)
        adoption.planned = {plain.pid: start_of(plain.pid)}
        adoption._end('sglang-adopted-1.scope')      # pylint: disable=protected-access
        assert actor.calls == [STOP_SCOPE]
        assert adoption.out['stopped'] is stopped, said
        assert adoption.out['error'] == (None if stopped else 'systemctl stop sglang-adopted-1.scope: %s' % said)
        assert adoption.out['actions'][-1]['result'] == str(said)
        assert adoption.out['actions'][-1]['code'] == said.code
        assert not isinstance(adoption.out['actions'][-1]['result'], gpu_say.Said)
    assert plain.poll() is None


def test_a_stopped_adoption_carries_its_code_beside_its_words(procs):
    server = procs()
    out = gpu_adopt.Adoption('sglang-adopted', 5, [(server.pid, start_of(server.pid)), (4242, None)],
                             actor=Refusing()).run()
    assert out['error_code'] == 'no_start_time' and out['error'].startswith('no start time was recorded')
    assert server.poll() is None
    done = gpu_adopt.Adoption('sglang-adopted', 5, [], actor=Refusing()).run()
    assert done['error'] is None and done['error_code'] is None
