# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Act: the only code that changes the host, through three verbs: run a command (an owner's
stop: the argv of a gpu_lever.Lever; a reset step), signal a holder, wait (poll) for what the
caller judges.

The ladder (gpu_flow), the owner families (gpu_family_*) and adoption (gpu_adopt) say what to
do through an actor: HostActor does it, RecordingActor (check mode) only records what it would
do; both answer with the same results, so check mode runs the very sequence a real run does.
Nothing here judges an outcome (a unit down, a program staying down): the family that pulled
the lever does, from the command's rc and output and from what it polls.

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
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import ProcessGone, read_identity

# A signal's outcome (gpu_lever's step codes).
SENT, GONE, REUSED = gpu_lever.SENT, gpu_lever.GONE, gpu_lever.REUSED
SIGNAL_NAMES = {signal.SIGTERM: 'SIGTERM', signal.SIGKILL: 'SIGKILL', signal.SIGCONT: 'SIGCONT',
                signal.SIGSTOP: 'SIGSTOP'}


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
# saw a release up to three contexts' time late. A command (systemctl is-active, a supervisor's
# status) keeps COMMAND_POLL_S.
FAST_POLL_S = 0.05
COMMAND_POLL_S = 0.25


def wait_for(predicate, timeout, clock=time.monotonic, first_interval=0.02, max_interval=COMMAND_POLL_S):
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


class HostActor(object):
    """Acts on the host and says what happened."""

    recording = False
    # What the surveys are to leave out as ended (RecordingActor's, in check mode): nothing here,
    # the kernel's own answer is read.
    ended = frozenset()

    def __init__(self, clock=time.monotonic):
        self.clock = clock

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

    def wait_until(self, predicate, timeout, max_interval=FAST_POLL_S):
        """(value, waited_s): `predicate` polled until truthy or `timeout` passes (wait_for);
        COMMAND_POLL_S between polls that run a command."""
        return wait_for(predicate, timeout, clock=self.clock, max_interval=max_interval)

    @staticmethod
    def run(argv, timeout, as_user=None, ends=()):
        """(result, changed) of one command that changes the host: a family's Lever's argv, a
        reset step, adoption's scope. `as_user`: subprocess keywords that run it as a user
        (gpu_observe.user_manager_call's or as_user's); `ends`: the holders it ends when it
        succeeds (check mode counts them ended). The result's `facts` carry `rc` and `output`
        for the caller to judge; changed means rc 0."""
        rc, out = run_command(argv, timeout, **(as_user or {}))
        if rc == 0:
            return say.step(gpu_lever.COMMAND_OK, rc=rc, output=out), True
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
    def wait_until(predicate, timeout, max_interval=FAST_POLL_S):
        return False, 0.0

    def run(self, argv, timeout, as_user=None, ends=()):
        """Records the command; what it would end counts as ended from then on."""
        self.ended.update((h.pid, h.start_time) for h in ends)
        return say.step(gpu_lever.WOULD_RUN, argv=argv), True

    @staticmethod
    def state_of(holder):
        return 'gone'
