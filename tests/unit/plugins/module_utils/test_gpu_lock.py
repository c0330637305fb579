"""gpu_lock: one gpu_reclaim per host; the second waits (bounded) and says for whom."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import subprocess
import sys
import time

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lock

HOLD = r"""
import sys, time
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_lock import HostLock
with HostLock(5, path=sys.argv[1]):
    print('held', flush=True)
    time.sleep(float(sys.argv[2]))
    print(time.time(), flush=True)   # the last moment it surely holds the lock
"""


def holder(path, seconds):
    """Another process holding the lock for `seconds`; returns once it holds it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen([sys.executable, '-c', HOLD, path, str(seconds)],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == 'held'
    return proc


def test_free_lock_is_taken_at_once(tmp_path):
    with gpu_lock.HostLock(1, path=str(tmp_path / 'l')) as lock:
        assert lock.report() == {'path': str(tmp_path / 'l'), 'waited_s': lock.waited_s, 'waited_for': None}
        assert open(str(tmp_path / 'l')).read().startswith('PID %d since ' % os.getpid())


def test_second_run_waits_for_the_first_then_proceeds(tmp_path):
    path = str(tmp_path / 'l')
    first = holder(path, 1.0)
    with gpu_lock.HostLock(20, path=path, poll_s=0.02) as lock:
        acquired_at = time.time()
        assert acquired_at >= float(first.stdout.readline()), 'got the lock while the first still held it'
        # It waited, and for the first: the lock named it while the second polled.
        assert lock.waited_s > 0
        assert lock.held_by.startswith('PID %d since ' % first.pid)
    first.wait()


def test_bounded_wait_fails_naming_the_holder(tmp_path):
    path = str(tmp_path / 'l')
    first = holder(path, 30)
    try:
        with pytest.raises(gpu_lock.LockTimeout) as caught:
            gpu_lock.HostLock(0.5, path=path, poll_s=0.05).acquire()
        # It gave up while the holder (30 s) still held the lock: bounded by its timeout, not
        # by the holder.
        assert first.poll() is None
        assert 'PID %d since' % first.pid in str(caught.value)
        assert 'lock_timeout=0.5s' in str(caught.value)
        assert 'nothing was signalled' in str(caught.value)
    finally:
        first.kill()
        first.wait()


def test_a_released_lock_leaves_no_name_for_a_later_waiter(tmp_path):
    path = str(tmp_path / 'l')
    with gpu_lock.HostLock(1, path=path):
        pass
    assert open(path).read() == ''


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    path = str(tmp_path / 'l')
    first = holder(path, 30)
    first.kill()
    first.wait()
    with gpu_lock.HostLock(0.5, path=path) as lock:
        assert lock.held_by is None


def test_lock_path_picks_a_writable_directory(tmp_path):
    assert gpu_lock.lock_path((str(tmp_path / 'missing'), str(tmp_path))) == str(tmp_path / gpu_lock.LOCK_NAME)


# A holder that is not a gpu_reclaim run (flock(1), a script) writes nothing into the file.
SILENT_HOLD = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print('held', flush=True)
time.sleep(30)
"""


def test_a_holder_that_wrote_nothing_is_named_from_proc_locks(tmp_path):
    path = str(tmp_path / 'l')
    first = subprocess.Popen([sys.executable, '-c', SILENT_HOLD, path], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == 'held'
        with open('/proc/%d/comm' % first.pid) as comm:
            name = comm.read().strip()
        with pytest.raises(gpu_lock.LockTimeout) as caught:
            gpu_lock.HostLock(0.3, path=path, poll_s=0.05).acquire()
        assert 'another run, PID %d (%s), has held the host lock' % (first.pid, name) in str(caught.value)
    finally:
        first.kill()
        first.wait()


def _flock_holder_from(tmp_path, listing):
    """_flock_holder of a real file against a written /proc/locks listing ({dev} and {ino} filled in)."""
    path = tmp_path / 'l'
    path.write_text('')
    st = os.stat(str(path))
    locks = tmp_path / 'locks'
    locks.write_text(listing.format(dev='%02x:%02x' % (os.major(st.st_dev), os.minor(st.st_dev)), ino=st.st_ino))
    proc = tmp_path / 'proc'
    (proc / '4242').mkdir(parents=True)
    # A real stat line (this process's), as if it were flock(1)'s PID 4242.
    stat = open('/proc/self/stat').read()
    (proc / '4242' / 'stat').write_text('4242 (flock) ' + stat[stat.rindex(')') + 2:])
    fd = os.open(str(path), os.O_RDONLY)
    try:
        return gpu_lock._flock_holder(fd, str(locks), str(proc))
    finally:
        os.close(fd)


def test_flock_holder_reads_only_a_flock_held_on_this_file(tmp_path):
    assert _flock_holder_from(tmp_path, (
        "1: POSIX  ADVISORY  WRITE 77 {dev}:{ino} 0 EOF\n"        # fcntl locks never block flock(2)
        "2: FLOCK  ADVISORY  WRITE 88 {dev}:{ino}9 0 EOF\n"       # another file
        "3: FLOCK  ADVISORY  WRITE 4242 {dev}:{ino} 0 EOF\n"
        "3: -> FLOCK  ADVISORY  WRITE 99 {dev}:{ino} 0 EOF\n")) == 'PID 4242 (flock)'


def test_flock_holder_is_none_for_a_holder_outside_our_pid_namespace_or_a_garbled_line(tmp_path):
    assert _flock_holder_from(tmp_path, (
        "1: FLOCK  ADVISORY  WRITE 0 {dev}:{ino} 0 EOF\n"
        "1: FLOCK  ADVISORY  WRITE -1 {dev}:{ino} 0 EOF\n"
        "2: FLOCK  ADVISORY  WRITE x {dev}:{ino} 0 EOF\n"
        "3: FLOCK\n")) is None


def test_flock_holder_names_a_pid_whose_stat_is_gone_by_its_number(tmp_path):
    assert _flock_holder_from(tmp_path, "1: FLOCK  ADVISORY  WRITE 5151 {dev}:{ino} 0 EOF\n") == 'PID 5151'
