# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One gpu_reclaim at a time per host: a flock(2) on a file under /run/lock.

A pipeline and a drift timer may both reclaim the same node; two ladders interleaving their
signals and verdicts would report each other's work. The second run waits (bounded) for the
first, then surveys what the first left, so it reports what it found after it.

The file is not the reclaim_timer role's lock (/run/lock/gpuops-reclaim.lock), which its run
script holds around a whole ansible-playbook run: taking that one here would wait on our own
caller. That lock keeps whole runs apart; this one keeps ladders apart, whoever started them.

flock(2) locks belong to the open file description: the kernel drops the lock when the
holder exits, however it exits, so a killed run never leaves a stale lock behind.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import fcntl
import os
import time

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe

LOCK_DIRS = ('/run/lock', '/var/lock', '/tmp')
LOCK_NAME = 'gpuops-gpu-reclaim.lock'


class LockTimeout(Exception):
    """Another run kept the host lock for longer than the caller would wait."""


def lock_path(dirs=LOCK_DIRS):
    """The first writable lock directory's lock file (the same on every run of a host)."""
    for folder in dirs:
        if os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK):
            return os.path.join(folder, LOCK_NAME)
    return os.path.join(dirs[-1], LOCK_NAME)


def _holder_of(fd):
    """Who holds the lock: what a gpu_reclaim holder wrote into the file ('PID N since ...'),
    else the flock holder /proc/locks names ('PID N (comm)': flock(1), say, writes nothing),
    else None."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 200).decode('utf-8', 'replace').strip()
    except OSError:
        text = ''
    return text or _flock_holder(fd)


def _flock_holder(fd, proc_locks='/proc/locks', proc='/proc'):
    """'PID N (comm)' of the flock(2) lock on fd's file, from /proc/locks, or None.

    Its lines read 'ID: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE START END', major and minor
    in hex; the PID is in our PID namespace, and 0 or -1 when the holder is outside it.
    """
    try:
        st = os.fstat(fd)
        with open(proc_locks) as listing:
            lines = listing.read().splitlines()
    except (IOError, OSError):
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] != 'FLOCK':
            continue    # fcntl locks never block flock(2); '-> FLOCK' lines are waiters
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(':')
            held = (int(major, 16), int(minor, 16), int(inode))
            same_file = held == (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        except ValueError:
            continue
        if same_file and pid > 0:
            try:
                return 'PID %d (%s)' % (pid, gpu_observe.read_stat(pid, proc).comm)
            except gpu_observe.ProcError:
                return 'PID %d' % pid
    return None


class HostLock(object):
    """with HostLock(timeout_s) as lock: ... ; lock.waited_s and lock.held_by say what waiting there was."""

    def __init__(self, timeout_s, path=None, clock=time.monotonic, poll_s=0.1):
        self.timeout_s = timeout_s
        self.path = path or lock_path()
        self.clock = clock
        self.poll_s = poll_s
        self.fd = None
        self.held = False
        self.waited_s = 0.0
        self.held_by = None       # who held it when we first had to wait, or None

    def acquire(self):
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM):
                raise
            # A lock file made by root is still lockable read-only by another user.
            self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        started = self.clock()
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    self.release()
                    raise
            if self.held_by is None:
                self.held_by = _holder_of(self.fd) or 'another process'
            waited = self.clock() - started
            if waited >= self.timeout_s:
                self.release()
                raise LockTimeout(
                    'another run, %s, has held the host lock %s for more than '
                    'lock_timeout=%ss; nothing was signalled by this run. Let it finish, or raise '
                    'lock_timeout.' % (self.held_by, self.path, self.timeout_s))
            time.sleep(min(self.poll_s, max(0.0, self.timeout_s - waited)))
        self.held = True
        self.waited_s = round(self.clock() - started, 3)
        try:
            os.ftruncate(self.fd, 0)
            os.lseek(self.fd, 0, os.SEEK_SET)
            os.write(self.fd, ('PID %d since %s\n' % (
                os.getpid(), time.strftime('%Y-%m-%dT%H:%M:%S%z'))).encode())
        except OSError:
            pass  # opened read-only: the lock holds all the same, it only cannot say who
        return self

    def release(self):
        if self.fd is not None:
            if self.held:
                try:
                    os.ftruncate(self.fd, 0)   # no stale "PID N" for a later waiter to misread
                except OSError:
                    pass
            os.close(self.fd)     # closing the only fd of the description drops the flock
            self.fd = None
            self.held = False

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False

    def report(self):
        """The `host_lock` result key."""
        return {'path': self.path, 'waited_s': self.waited_s, 'waited_for': self.held_by}
