# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Act: the only code that changes the host: signals, unit stops, GPU resets.

The ladder (gpu_flow) says what to do through an actor: HostActor does it, RecordingActor
(check mode) only records what it would do; both answer with the same Action objects, so
check mode runs the very sequence a real run does.

Every signal goes to a process re-identified by (PID, start time) at the moment of sending,
through a pidfd where the kernel offers one, so a PID reused since detection is never hit.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import select
import signal
import subprocess
import time

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_supervisor as supervisors
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import (
    ProcessGone, read_identity, supervisor_status, user_manager_call)

# A signal's outcome (gpu_lever's step codes).
SENT, GONE, REUSED = gpu_lever.SENT, gpu_lever.GONE, gpu_lever.REUSED
SIGNAL_NAMES = {signal.SIGTERM: 'SIGTERM', signal.SIGKILL: 'SIGKILL', signal.SIGCONT: 'SIGCONT',
                signal.SIGSTOP: 'SIGSTOP'}
# Every command this module runs is bounded; systemctl answers in milliseconds when healthy.
SYSTEMCTL_TIMEOUT_S = 30


class Action(object):
    """One step of the ladder: what, on which target, what happened, whether it changed the
    host (in check mode: whether it would), when (seconds since the ladder started) and how
    long it took."""

    __slots__ = ('what', 'target', 'result', 'changed', 'at_s', 'took_s', 'details')

    def __init__(self, what, target, result, changed, at_s=None, took_s=None, **details):
        self.what = what
        self.target = target
        self.result = result
        self.changed = changed
        self.at_s = at_s
        self.took_s = took_s
        self.details = details

    def as_result(self):
        # The step code goes with the sentence (issue 32 item 3): the role and the tests read
        # `code`, never `result`'s words.
        entry = {'step': self.what, 'target': self.target, 'result': _text(self.result),
                 'code': self.result.code if isinstance(self.result, say.Said) else None, 'changed': self.changed, 'at_s': self.at_s}
        if self.took_s is not None:
            entry['took_s'] = self.took_s
        entry.update(self.details)
        return entry


def _text(result):
    """A result as plain text (a gpu_say.Said is one, with its code)."""
    return str(result) if isinstance(result, str) else result


def signal_refusal(pid, start_time, never=frozenset()):
    """Why PID must not be signalled now: GONE, REUSED or a gpu_lever.SIGNAL_REFUSALS code, or
    None."""
    if not isinstance(pid, int) or pid <= 1:
        return gpu_lever.PID_NEVER
    if pid == os.getpid() or pid in never:
        return gpu_lever.PID_PROTECTED
    if start_time is None:
        return gpu_lever.NO_START_TIME
    try:
        identity = read_identity(pid)
    except ProcessGone:
        return GONE
    if identity.start_time != start_time:
        return REUSED
    if identity.state == 'zombie':
        return GONE
    return None


def send_signal(pid, start_time, signum, never=frozenset()):
    """Signal PID only if it is still the process first seen with `start_time`.

    Returns a gpu_say.Said whose `code` is SENT, GONE (exited), REUSED (another process has the
    PID now) or a gpu_lever.SIGNAL_REFUSALS code (a PID this module must never signal, or may
    not as this user); its text is 'sent', 'gone', 'reused' or 'refused: <why>'.
    """
    return say.step(signal_code(pid, start_time, signum, never), pid=pid)


def signal_code(pid, start_time, signum, never=frozenset()):
    """send_signal's code."""
    pidfd = None
    if hasattr(os, 'pidfd_open') and isinstance(pid, int) and pid > 1:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return GONE
        except OSError:
            pidfd = None  # kernel without pidfds: fall back to kill(2) right after the check
    try:
        # With a pidfd open, this check is race-free: the fd pins the process it was opened on,
        # so if /proc shows the recorded start time now, the fd refers to that same process.
        refusal = signal_refusal(pid, start_time, never)
        if refusal:
            return refusal
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signum)
            else:
                os.kill(pid, signum)
        except ProcessLookupError:
            return GONE
        except PermissionError:
            # Another user's process and this module is not root: no other lever from here.
            return gpu_lever.NOT_PERMITTED
        return SENT
    finally:
        if pidfd is not None:
            os.close(pidfd)


class _NoPidfds(Exception):
    """This Python or kernel offers no pidfds: waits poll /proc instead."""


def open_pidfd(pid, start_time):
    """A pidfd of the process first seen with `start_time` (the caller closes it), or None when
    that process is gone (exited, a zombie, or its PID reused). Raises _NoPidfds where the
    kernel (before 5.3) or Python (before 3.9) has none.

    The fd pins the process it was opened on: when /proc shows the recorded start time after
    the open, the fd refers to that very process, and it becomes readable when it exits."""
    if not hasattr(os, 'pidfd_open'):
        raise _NoPidfds()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except OSError:
        raise _NoPidfds()
    if is_alive(pid, start_time):
        return fd
    os.close(fd)
    return None


def is_alive(pid, start_time):
    """True while the process first seen with `start_time` exists and is not a zombie."""
    try:
        identity = read_identity(pid)
    except ProcessGone:
        return False
    return identity.start_time == start_time and identity.state != 'zombie'


# The longest pause between two polls of what costs a /proc read or a driver query (a holder's
# exit, the GPU's memory): the driver tears contexts down one after another, about 70 ms each
# (24 SIGKILLed contexts of 1 GiB freed in 1.66 s on one H200, FIELD_NOTES), so a pause of 0.25 s
# saw a release up to three contexts' time late. A command (systemctl show) keeps 0.25 s.
FAST_POLL_S = 0.05


def wait_for(predicate, timeout, clock=time.monotonic, first_interval=0.02, max_interval=0.25):
    """Poll `predicate` with a growing interval until it returns truthy or `timeout` passes.

    Returns (value, waited_s). Polling, not sleeping a guessed time: the result is known as
    soon as the kernel or the driver is done.
    """
    started = clock()
    interval = first_interval
    while True:
        value = predicate()
        waited = clock() - started
        if value or waited >= timeout:
            return value, waited
        time.sleep(min(interval, max(0.0, timeout - waited)))
        interval = min(interval * 2, max_interval)


def run_command(argv, timeout, **keywords):
    """(rc, output) of a bounded command; 124 when it timed out, 127 when it could not start.
    `keywords` go to subprocess.run (user, group, env: run it as a user)."""
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                             check=False, universal_newlines=True, **keywords)
    except subprocess.TimeoutExpired:
        return 124, say.cli_unfinished(argv, timeout)
    except OSError as exc:
        return 127, str(exc)
    return out.returncode, out.stdout.strip()


def _unit_inactive(unit, manager=gpu_owner.SYSTEM_MANAGER, keywords=None):
    """`manager`: whose manager (gpu_lever.UNITS' row); `keywords` run systemctl as that user."""
    code, state = run_command(gpu_lever.unit_argv(manager, 'is_active', unit), timeout=SYSTEMCTL_TIMEOUT_S,
                              **(keywords or {}))
    return state in ('inactive', 'failed', 'unknown') or (code != 0 and state not in ('deactivating', 'active'))


def _as_user(supervisor):
    """subprocess keywords that run a user's supervisor CLI (pm2) as that user, with its home."""
    import pwd
    entry = pwd.getpwuid(supervisor['uid'])
    return {'user': entry.pw_uid, 'group': entry.pw_gid, 'extra_groups': [], 'cwd': '/',
            'env': {'HOME': entry.pw_dir, 'PM2_HOME': supervisor.get('home') or entry.pw_dir + '/.pm2',
                    'PATH': os.environ.get('PATH', '/usr/bin:/bin')}}


class HostActor(object):
    """Acts on the host and says what happened."""

    recording = False
    # What the surveys are to leave out as ended (RecordingActor's, in check mode): nothing here,
    # the kernel's own answer is read.
    ended = frozenset()

    def __init__(self, clock=time.monotonic):
        self.clock = clock

    def stop_unit(self, unit, timeout):
        """Stop a systemd unit so that Restart= cannot bring its processes back.

        `--no-block` queues the stop; the state is then polled, bounded by `timeout`, instead
        of blocking for the unit's own TimeoutStopSec (90 s by default).
        """
        rc, out = run_command(gpu_lever.unit_argv(gpu_owner.SYSTEM_MANAGER, 'stop', unit), timeout=SYSTEMCTL_TIMEOUT_S)
        if rc != 0:
            return say.step(gpu_lever.STOP_FAILED, output=out), False
        done, waited = wait_for(lambda: _unit_inactive(unit), timeout, clock=self.clock)
        if done:
            return say.step(gpu_lever.UNIT_STOPPED, waited=waited), True
        return say.step(gpu_lever.UNIT_STOPPING, timeout=timeout), True

    def stop_user_unit(self, uid, unit, timeout):
        """Stop a unit of user `uid`'s own manager, as that user (`systemctl --user stop`, her
        manager's private socket: gpu_observe.user_manager_call), polled like stop_unit."""
        call = user_manager_call(uid)
        if call is None:
            return say.step(gpu_lever.MANAGER_NOT_RUNNING, uid=uid), False
        rc, out = run_command(gpu_lever.unit_argv(gpu_owner.USER_MANAGER, 'stop', unit),
                              timeout=SYSTEMCTL_TIMEOUT_S, **call[1])
        if rc != 0:
            return say.step(gpu_lever.STOP_FAILED, output=out), False
        done, waited = wait_for(lambda: _unit_inactive(unit, gpu_owner.USER_MANAGER, call[1]), timeout,
                                clock=self.clock)
        if done:
            return say.step(gpu_lever.UNIT_STOPPED, waited=waited, uid=uid), True
        return say.step(gpu_lever.UNIT_STOPPING, timeout=timeout), True

    def stop_supervised(self, owner, holders, grace, status_timeout):
        """Stop one program through its own supervisor (gpu_supervisor's row: `supervisorctl
        stop`, `sv force-stop`, `s6-svc -d`, `pm2 stop`, pm2's as its user), then poll the
        supervisor's status until it says the program is down by request and the holders are
        gone (bounded by grace + 30 s), then for STAY_DOWN_S more that nothing starts it again.
        Returns (result, changed, error): error {'code', 'text'} (gpu_supervisor's codes) when it
        failed or the program came back; nothing is signalled from here."""
        sup = owner['supervisor']
        row = supervisors.SUPERVISORS[owner['runtime']]
        as_user = _as_user(sup) if row['as_user'] else {}
        stop = supervisors.argv(owner['runtime'], 'stop', sup, owner['id'], grace)
        bound = grace + 30
        rc, out = run_command(stop, timeout=bound, **as_user)
        said = ' '.join(stop)
        if rc in (124, 127):
            code = supervisors.CLI_TIMEOUT if rc == 124 else supervisors.CLI_MISSING
            return (say.step(gpu_lever.STOP_FAILED, output=out), False, {'code': code, 'text': say.cli_said(stop, out)})
        if rc != 0 and row['kill']:
            run_command(supervisors.argv(owner['runtime'], 'kill', sup, owner['id']), timeout=bound, **as_user)
        state = {}

        def read():
            code, text = supervisor_status(supervisors.argv(owner['runtime'], 'status', sup, owner['id']),
                                           status_timeout, sup['uid'] if row['as_user'] else None, sup.get('home'))
            entries = supervisors.parse_status(row['parse'], text) if code in ('ok',) or code.startswith('rc=') else None
            state['error'] = None if entries is not None else {
                'code': code if code in (supervisors.CLI_MISSING, supervisors.CLI_TIMEOUT) else supervisors.CLI_FAILED,
                'text': say.status_after_stop(text)}
            state['entries'] = entries
            return entries

        def down():
            # The program down by its supervisor's word: a holder below it that outlives it (a
            # launcher's child) is an orphan the supervisor no longer restarts, for the signals.
            entries = read()
            return state['error'] is not None or supervisors.is_down(owner['runtime'], entries, owner['id'])

        _done, waited = wait_for(down, bound, clock=self.clock)
        if state.get('error'):
            return say.step(gpu_lever.STOP_FAILED, output=state['error']['text']), rc == 0, state['error']
        if not supervisors.is_down(owner['runtime'], state.get('entries'), owner['id']):
            text = say.not_down(stop, rc, out, bound)
            return say.step(gpu_lever.STOP_FAILED, output=text), rc == 0, {'code': supervisors.STOP_FAILED, 'text': text}
        # Stays down: its supervisor's word (down by request) is checked against what it does.
        back, watched = wait_for(lambda: read() is None or supervisors.running_pid(
            owner['runtime'], state['entries'], owner['id']), supervisors.STAY_DOWN_S, clock=self.clock)
        if back:
            pid = supervisors.running_pid(owner['runtime'], state.get('entries'), owner['id'])
            text = (say.program_back(pid, watched) if pid
                    else (state.get('error') or {}).get('text', say.STATUS_FAILED))
            return say.step(gpu_lever.STOP_FAILED, output=text), True, {
                'code': supervisors.CAME_BACK if pid else supervisors.CLI_FAILED, 'text': text}
        left = self.alive(holders)
        return (say.step(gpu_lever.SUPERVISED_STOPPED, waited=waited, command=said, watched=watched,
                         left=[h.pid for h in left]), True, None)

    @staticmethod
    def start_scope(scope, pids, stop_timeout, description):
        """Move `pids` into a new transient scope unit `scope` (systemd's StartTransientUnit,
        through busctl: systemctl cannot make a scope of running processes), so that stopping
        it ends them the way a unit's stop does: SIGTERM to every member, SIGKILL after
        `stop_timeout` seconds (TimeoutStopUSec). systemd takes numbers here, not pidfds: the
        caller verifies afterwards who the scope holds."""
        argv = (['busctl', 'call', 'org.freedesktop.systemd1', '/org/freedesktop/systemd1',
                 'org.freedesktop.systemd1.Manager', 'StartTransientUnit', 'ssa(sv)a(sa(sv))', scope, 'fail', '3',
                 'Description', 's', description,
                 'TimeoutStopUSec', 't', '%d' % int(stop_timeout * 1000000),
                 'PIDs', 'au', '%d' % len(pids)] + ['%d' % pid for pid in pids] + ['0'])
        rc, out = run_command(argv, timeout=SYSTEMCTL_TIMEOUT_S)
        if rc == 0:
            return say.step(gpu_lever.SCOPE_STARTED), True
        return say.step(gpu_lever.COMMAND_FAILED, rc=rc, output=out), False

    @staticmethod
    def signal(holder, signum, never):
        """(result, changed) of sending `signum` to the holder, re-identified first."""
        result = send_signal(holder.pid, holder.start_time, signum, never)
        return result, result.code == SENT

    @staticmethod
    def alive(holders):
        return [h for h in holders if is_alive(h.pid, h.start_time)]

    def wait_gone(self, holders, timeout):
        """Wait until every holder is gone or `timeout` passes; returns {pid: clock time it was
        first seen gone} for those that went.

        Through pidfds where the kernel offers them: poll(2) on a process's pidfd returns the
        moment it has exited (after the driver tore its context down), where polling /proc every
        FAST_POLL_S saw the last of 8 SIGKILLed ranks up to 50 ms late (tests/gpu s12, run8:
        several ranks 'exited after SIGKILL in 0.67 s' in the same poll)."""
        if not holders:
            return {}
        try:
            return self._wait_gone_pidfds(holders, timeout)
        except _NoPidfds:
            return self._wait_gone_polling(holders, timeout)

    def _wait_gone_pidfds(self, holders, timeout):
        gone_at, fds = {}, {}
        try:
            for holder in holders:
                fd = open_pidfd(holder.pid, holder.start_time)
                if fd is None:
                    gone_at[holder.pid] = self.clock()
                else:
                    fds[fd] = holder.pid
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            started = self.clock()
            while len(gone_at) < len(holders):
                left = timeout - (self.clock() - started)
                if left <= 0:
                    break
                for fd, _event in poller.poll(int(left * 1000) + 1):
                    poller.unregister(fd)
                    gone_at[fds[fd]] = self.clock()
            return gone_at
        finally:
            for fd in fds:
                os.close(fd)

    def _wait_gone_polling(self, holders, timeout):
        gone_at = {}

        def all_gone():
            for holder in holders:
                if holder.pid not in gone_at and not is_alive(holder.pid, holder.start_time):
                    gone_at[holder.pid] = self.clock()
            return len(gone_at) == len(holders)

        wait_for(all_gone, timeout, clock=self.clock, max_interval=FAST_POLL_S)
        return gone_at

    def wait_until(self, predicate, timeout):
        return wait_for(predicate, timeout, clock=self.clock, max_interval=FAST_POLL_S)

    @staticmethod
    def run(argv, timeout):
        """(result, changed) of one command that changes the host (a reset step)."""
        rc, out = run_command(argv, timeout)
        if rc == 0:
            return say.step(gpu_lever.COMMAND_OK), True
        return say.step(gpu_lever.COMMAND_FAILED, rc=rc, output=out), False

    @staticmethod
    def state_of(holder):
        try:
            return read_identity(holder.pid).state
        except ProcessGone:
            return 'gone'


class RecordingActor(object):
    """Check mode: answers like HostActor, records what it would do, changes nothing.

    What it would end counts as ended from then on (a SIGKILL ends any process not stuck in
    the kernel), so the ladder walks on to the next step as a real run would; waits return at
    once, since nothing they could wait for happens.
    """

    recording = True

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.ended = set()        # (pid, start_time) a real run would have ended
        self._termed = set()       # (pid, start_time) it would have sent SIGTERM

    @staticmethod
    def stop_unit(unit, timeout):
        return say.step(gpu_lever.WOULD_STOP_UNIT, timeout=timeout), True

    @staticmethod
    def stop_user_unit(uid, unit, timeout):
        return say.step(gpu_lever.WOULD_STOP_UNIT, timeout=timeout, uid=uid), True

    def stop_supervised(self, owner, holders, grace, status_timeout):
        self.ended.update((h.pid, h.start_time) for h in holders)
        return say.step(gpu_lever.WOULD_STOP_SUPERVISED, argv=supervisors.argv(
            owner['runtime'], 'stop', owner['supervisor'], owner['id'], grace)), True, None

    def signal(self, holder, signum, never):
        key = (holder.pid, holder.start_time)
        refusal = signal_refusal(holder.pid, holder.start_time, never)
        if refusal:
            return say.step(refusal, pid=holder.pid), False
        if key in self.ended:
            return say.step(GONE), False
        name = SIGNAL_NAMES.get(signum, str(signum))
        if signum == signal.SIGKILL:
            self.ended.add(key)
            if key in self._termed:
                return say.step(gpu_lever.WOULD_KILL_AFTER_TERM, signal=name), True
        if signum == signal.SIGTERM:
            self._termed.add(key)
        return say.step(gpu_lever.WOULD_SIGNAL, signal=name), True

    def alive(self, holders):
        live = [h for h in holders if (h.pid, h.start_time) not in self.ended]
        return [h for h in live if is_alive(h.pid, h.start_time)]

    def wait_gone(self, holders, timeout):
        now = self.clock()
        return dict((h.pid, now) for h in holders if (h.pid, h.start_time) in self.ended)

    @staticmethod
    def wait_until(predicate, timeout):
        return False, 0.0

    @staticmethod
    def run(argv, timeout):
        return say.step(gpu_lever.WOULD_RUN, argv=argv), True

    @staticmethod
    def state_of(holder):
        return 'gone'
