"""gpu_act's safety rules, on real processes of this host."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act as act
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import read_identity

from .holders import make_holder

COLLECTIONS = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', '.build', 'collections'))


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(['sleep', '300'])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize('pid', [0, 1, -1, -4242])
def test_never_signals_init_zero_or_negative_pids(pid):
    assert act.send_signal(pid, 123, signal.SIGTERM).startswith('refused')


def test_never_signals_itself_or_a_protected_pid(sleeper):
    start = read_identity(sleeper.pid)[0]
    assert act.send_signal(os.getpid(), read_identity(os.getpid())[0], signal.SIGKILL).startswith('refused')
    assert act.send_signal(sleeper.pid, start, signal.SIGKILL, never={sleeper.pid}).startswith('refused')
    assert act.send_signal(sleeper.pid, None, signal.SIGKILL).startswith('refused')
    assert sleeper.poll() is None


def test_signals_the_process_it_identified(sleeper):
    start = read_identity(sleeper.pid)[0]
    assert act.send_signal(sleeper.pid, start, signal.SIGKILL) == 'sent'
    assert sleeper.wait(timeout=10) == -signal.SIGKILL


def test_a_process_with_another_start_time_is_not_signalled(sleeper):
    start = read_identity(sleeper.pid)[0]
    assert act.send_signal(sleeper.pid, start - 1, signal.SIGKILL) == 'reused'
    assert sleeper.poll() is None


def test_a_gone_process_is_reported_gone():
    proc = subprocess.Popen(['true'])
    start = read_identity(proc.pid)[0] if read_identity(proc.pid) else 1
    proc.wait()
    assert act.send_signal(proc.pid, start, signal.SIGKILL) == 'gone'


# Inside a fresh PID namespace, ns_last_pid makes the next fork reuse the PID of a process
# that was detected and then died: the race between detection and signal, forced.
PID_REUSE = textwrap.dedent('''
    import os, signal, subprocess, sys, time
    sys.path.insert(0, %r)
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act as act
    from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import read_identity
    first = subprocess.Popen(['sleep', '300'])
    pid, start = first.pid, read_identity(first.pid)[0]
    first.kill(); first.wait()
    # Start times count clock ticks since boot: poll until the clock is past the first's, so
    # the second's start time differs.
    ticks = os.sysconf('SC_CLK_TCK')
    while float(open('/proc/uptime').read().split()[0]) * ticks < start + 1:
        time.sleep(0.005)
    with open('/proc/sys/kernel/ns_last_pid', 'w') as f:
        f.write(str(pid - 1))
    second = subprocess.Popen(['sleep', '300'])
    assert second.pid == pid, (second.pid, pid)
    assert read_identity(pid)[0] != start, 'the same start time: the test cannot tell them apart'
    result = act.send_signal(pid, start, signal.SIGKILL)
    # A SIGKILL sent by send_signal would already be the process's fate (the kernel fixes a
    # fatal signal's exit code when it is sent); SIGTERM now ends it, and its exit status
    # says which signal came first: -15 when send_signal sent nothing.
    second.terminate()
    print(result, second.wait())
''') % COLLECTIONS


def test_a_reused_pid_is_not_signalled():
    try:
        out = subprocess.run(['unshare', '--pid', '--fork', '--mount-proc', sys.executable, '-c', PID_REUSE],
                             capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        pytest.skip('unshare (util-linux) is not installed: cannot force PID reuse')
    if out.returncode != 0 and 'Operation not permitted' in out.stderr:
        pytest.skip('no permission for a new PID namespace here (needs root): %s' % out.stderr.strip())
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ['reused', '-15']


def test_wait_for_returns_as_soon_as_the_condition_holds():
    calls = []
    value, waited = act.wait_for(lambda: calls.append(1) or len(calls) >= 3, timeout=30)
    assert value is True and len(calls) == 3


def test_wait_for_gives_up_at_the_timeout():
    value, waited = act.wait_for(lambda: False, timeout=0.2)
    assert value is False and waited >= 0.2


def _holder(proc, start=None):
    return make_holder(pid=proc.pid, start_time=read_identity(proc.pid)[0] if start is None else start)


def _no_polling(*_args, **_kwargs):
    raise AssertionError('wait_gone polled /proc where the kernel offers pidfds')


@pytest.mark.skipif(not hasattr(os, 'pidfd_open'), reason='this Python (before 3.9) has no os.pidfd_open')
def test_wait_gone_is_told_of_each_exit_by_its_pidfd(sleeper, monkeypatch):
    """A process that exits (here: a child left a zombie, unreaped) is reported gone, one that
    lives is not, and a holder whose start time no longer matches counts as gone at once; no
    /proc polling on the way."""
    monkeypatch.setattr(act, 'wait_for', _no_polling)
    short = subprocess.Popen(['sleep', '0.3'])
    try:
        holders = [_holder(sleeper), _holder(short), _holder(sleeper, start=1)]
        gone_at = act.HostActor().wait_gone(holders[:2], timeout=3)
        assert sorted(gone_at) == [short.pid]
        assert sleeper.poll() is None
        assert list(act.HostActor().wait_gone(holders[2:], timeout=30)) == [sleeper.pid]
    finally:
        short.wait()


def test_wait_gone_polls_proc_without_pidfds(sleeper, monkeypatch):
    """Where the kernel or Python has no pidfds, the same answers come from polling /proc."""
    def no_pidfds(pid):
        raise OSError(38, 'Function not implemented')
    monkeypatch.setattr(act.os, 'pidfd_open', no_pidfds, raising=False)
    short = subprocess.Popen(['sleep', '0.3'])
    try:
        gone_at = act.HostActor().wait_gone([_holder(sleeper), _holder(short)], timeout=3)
        assert sorted(gone_at) == [short.pid]
        assert sleeper.poll() is None
    finally:
        short.wait()


def test_check_mode_counts_what_a_supervisors_stop_ends_as_ended():
    actor = act.RecordingActor()
    holder = make_holder(pid=4242, start_time=77)
    result, changed = actor.run(['supervisorctl', 'stop', 'worker'], 35, ends=[holder])
    assert (result.code, changed) == (lever.WOULD_RUN, True) and actor.ended == {(4242, 77)}


def test_a_commands_rc_and_output_come_back_as_facts_for_the_family_to_judge():
    result, changed = act.HostActor().run(['sh', '-c', 'echo nope; exit 3'], 10)
    assert (result.code, changed, result.facts['rc'], result.facts['output']) == (lever.COMMAND_FAILED, False, 3, 'nope')
    result, changed = act.HostActor().run(['true'], 10)
    assert (result.code, changed, result.facts['rc']) == (lever.COMMAND_OK, True, 0)


def test_signal_names_cover_the_signals_the_ladder_sends():
    assert set(act.SIGNAL_NAMES) >= {signal.SIGTERM, signal.SIGKILL, signal.SIGCONT, signal.SIGSTOP}
