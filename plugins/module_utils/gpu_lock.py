# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One gpu_reclaim at a time per host: a flock(2) on /run/gpuops/gpu-reclaim.lock.

A pipeline and a drift timer may both reclaim the same node; two ladders interleaving their
signals and verdicts would report each other's work. The second run waits (bounded) for the
first, then surveys what the first left, so it reports what it found after it.

The lock lives in a directory only root can enter (issue 22): in a world-writable one
(/run/lock, where it was) any local user could hold it with `flock FILE sleep infinity`, and
every root run would then fail after lock_timeout, the reclaim timer's runs included. flock(2)
works on a file opened read-only, so a readable file is as good as a writable one to such a
user: the directory is 0700, not merely closed to writes. The directory and the file are
opened without following links and checked (owner, mode, type) through the open descriptors,
so nothing a user made beforehand is followed or trusted; anything else fails naming the path.

A run that is not root takes no host lock: it cannot enter the directory, it can signal only
its own user's processes, and a lock any user could take is what this replaces. Its
`host_lock` result says so (path null).

The file is not the reclaim_timer role's run lock (/run/gpuops/reclaim-run.lock), which its run
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
import stat
import time

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text

LOCK_DIR = '/run/gpuops'
LOCK_NAME = 'gpu-reclaim.lock'
LOCK_PATH = os.path.join(LOCK_DIR, LOCK_NAME)


class LockTimeout(Exception):
    """Another run kept the host lock for longer than the caller would wait."""


class LockUnsafe(Exception):
    """The lock's directory or file is not root's alone: someone else could hold or replace it."""


def _unsafe(path, what, remove):
    return LockUnsafe(
        'the host lock %s %s: another user could hold or replace the lock, so this run took no lock '
        'and signalled nothing. Remove it (rm -rf -- %s) and run again: gpu_reclaim makes it anew, '
        'owned by root, mode 0700.' % (path, what, remove))


def open_private_dir(path, uid, create=True):
    """An O_DIRECTORY fd of `path`, made 0700 when missing; LockUnsafe unless it is a real
    directory (not a link), owned by `uid`, with no access for group or others."""
    if create:
        try:
            os.mkdir(path, 0o700)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _unsafe(path, 'directory is a symbolic link or not a directory', path)
        raise
    st = os.fstat(fd)
    if st.st_uid != uid or st.st_mode & 0o077:
        os.close(fd)
        raise _unsafe(path, 'directory is owned by uid %d with mode %04o (it must be uid %d, mode 0700)'
                      % (st.st_uid, stat.S_IMODE(st.st_mode), uid), path)
    return fd


def open_lock_file(dir_fd, path, uid):
    """The lock file in the directory dir_fd, created 0600 or opened without following a link;
    LockUnsafe unless it is a regular file owned by `uid`."""
    name = os.path.basename(path)
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _unsafe(path, 'file is a symbolic link', path)
        if exc.errno in (errno.EISDIR, errno.ENXIO, errno.EACCES):
            raise _unsafe(path, 'file is not a regular file this run may write (%s)' % os.strerror(exc.errno), path)
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
        os.close(fd)
        raise _unsafe(path, 'file is not a regular file owned by uid %d (owner uid %d, mode %o)'
                      % (uid, st.st_uid, st.st_mode), path)
    return fd


def _holder_of(fd):
    """Who holds the lock: what a gpu_reclaim holder wrote into the file ('PID N since ...'),
    else the flock holder /proc/locks names ('PID N (comm)': flock(1), say, writes nothing),
    else None."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = escape_text(os.read(fd, 200).decode('utf-8', 'replace').strip())
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
                # comm is the holder's own title: escaped, it cannot add a line to the message.
                return 'PID %d (%s)' % (pid, escape_text(gpu_observe.read_stat(pid, proc).comm))
            except gpu_observe.ProcError:
                return 'PID %d' % pid
    return None


class HostLock(object):
    """with HostLock(timeout_s) as lock: ... ; lock.waited_s and lock.held_by say what waiting there was.

    `path` (tests) puts the lock elsewhere; its directory is held to the same rules, for the
    user this process runs as."""

    def __init__(self, timeout_s, path=None, clock=time.monotonic, poll_s=0.1):
        self.timeout_s = timeout_s
        self.path = path or LOCK_PATH
        self.clock = clock
        self.poll_s = poll_s
        self.fd = None
        self.held = False
        self.waited_s = 0.0
        self.held_by = None       # who held it when we first had to wait, or None

    def acquire(self):
        uid = os.geteuid()
        dir_fd = open_private_dir(os.path.dirname(self.path), uid)
        try:
            self.fd = open_lock_file(dir_fd, self.path, uid)
        finally:
            os.close(dir_fd)
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
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.write(self.fd, ('PID %d since %s\n' % (os.getpid(), time.strftime('%Y-%m-%dT%H:%M:%S%z'))).encode())
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


class NoHostLock(object):
    """What a run that is not root takes instead: nothing (see the module's docstring)."""

    waited_s = 0.0
    held_by = None
    path = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def report(self):
        return {'path': None, 'waited_s': 0.0, 'waited_for': None}


def host_lock(timeout_s):
    """The host lock for this run: HostLock as root, NoHostLock otherwise."""
    return HostLock(timeout_s) if os.geteuid() == 0 else NoHostLock()
