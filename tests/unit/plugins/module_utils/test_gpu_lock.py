"""gpu_lock: one gpu_reclaim per host; the second waits (bounded) and says for whom."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import subprocess
import sys
import time

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lock
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text

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


@pytest.fixture(autouse=True)
def private_tmp(tmp_path):
    tmp_path.chmod(0o700)     # the lock's directory must be this user's alone


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


def test_the_host_lock_is_in_a_directory_only_root_can_enter():
    assert gpu_lock.LOCK_PATH == '/run/gpuops/gpu-reclaim.lock'
    assert gpu_lock.HostLock(1).path == gpu_lock.LOCK_PATH
    assert not gpu_lock.LOCK_PATH.startswith(('/run/lock/', '/var/lock/', '/tmp/'))


# --- issue 22 item 3: nobody but the run's own user (root) can hold or replace the lock ----------

def private(tmp_path, name='d'):
    folder = tmp_path / name
    folder.mkdir(mode=0o700)
    folder.chmod(0o700)
    return folder


def test_a_missing_directory_is_made_0700_and_the_file_0600(tmp_path):
    path = tmp_path / 'gpuops' / 'l'
    tmp_path.chmod(0o700)
    with gpu_lock.HostLock(1, path=str(path)):
        assert oct(os.stat(str(path.parent)).st_mode & 0o777) == '0o700'
        assert oct(os.stat(str(path)).st_mode & 0o777) == '0o600'
        assert os.stat(str(path.parent)).st_uid == os.geteuid()


@pytest.mark.parametrize('mode', [0o755, 0o750, 0o711, 0o1777, 0o701])
def test_a_directory_others_can_enter_is_refused_naming_it(tmp_path, mode):
    folder = private(tmp_path)
    folder.chmod(mode)
    with pytest.raises(gpu_lock.LockUnsafe) as caught:
        gpu_lock.HostLock(1, path=str(folder / 'l')).acquire()
    assert str(caught.value).startswith('the host lock %s directory is owned by uid %d with mode %04o'
                                        % (folder, os.geteuid(), mode)), caught.value
    assert 'signalled nothing' in str(caught.value)
    assert not (folder / 'l').exists(), 'nothing may be created in a refused directory'


def test_a_directory_owned_by_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip('chown to another user needs root')
    folder = private(tmp_path)
    os.chown(str(folder), 1000, 1000)
    with pytest.raises(gpu_lock.LockUnsafe) as caught:
        gpu_lock.HostLock(1, path=str(folder / 'l')).acquire()
    assert 'directory is owned by uid 1000 with mode 0700 (it must be uid 0' in str(caught.value)


def test_a_directory_that_is_a_link_is_not_followed(tmp_path):
    target = private(tmp_path, 'elsewhere')
    os.symlink(str(target), str(tmp_path / 'd'))
    with pytest.raises(gpu_lock.LockUnsafe) as caught:
        gpu_lock.HostLock(1, path=str(tmp_path / 'd' / 'l')).acquire()
    assert 'the host lock %s directory is a symbolic link' % (tmp_path / 'd') in str(caught.value)
    assert os.listdir(str(target)) == []


def test_a_lock_file_that_is_a_link_is_not_followed(tmp_path):
    folder = private(tmp_path)
    victim = tmp_path / 'victim'
    victim.write_text('keep me')
    os.symlink(str(victim), str(folder / 'l'))
    with pytest.raises(gpu_lock.LockUnsafe) as caught:
        gpu_lock.HostLock(1, path=str(folder / 'l')).acquire()
    assert 'the host lock %s file is a symbolic link' % (folder / 'l') in str(caught.value)
    assert victim.read_text() == 'keep me'


def test_a_lock_file_owned_by_another_user_or_not_a_file_is_refused(tmp_path):
    folder = private(tmp_path)
    os.mkfifo(str(folder / 'l'))
    with pytest.raises(gpu_lock.LockUnsafe) as caught:
        gpu_lock.HostLock(1, path=str(folder / 'l')).acquire()
    assert 'file is not a regular file owned by uid %d' % os.geteuid() in str(caught.value)
    if os.geteuid() == 0:
        os.unlink(str(folder / 'l'))
        (folder / 'l').write_text('')
        os.chown(str(folder / 'l'), 1000, 1000)
        with pytest.raises(gpu_lock.LockUnsafe) as caught:
            gpu_lock.HostLock(1, path=str(folder / 'l')).acquire()
        assert 'owner uid 1000' in str(caught.value)


def test_a_run_that_is_not_root_takes_no_host_lock(monkeypatch):
    monkeypatch.setattr(os, 'geteuid', lambda: 1000)
    lock = gpu_lock.host_lock(5)
    with lock:
        pass
    assert lock.report() == {'path': None, 'waited_s': 0.0, 'waited_for': None}
    monkeypatch.setattr(os, 'geteuid', lambda: 0)
    assert isinstance(gpu_lock.host_lock(5), gpu_lock.HostLock)


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


def test_a_holders_title_is_escaped_in_its_name(tmp_path):
    path = tmp_path / 'l'
    path.write_text('')
    st = os.stat(str(path))
    locks = tmp_path / 'locks'
    locks.write_text('1: FLOCK  ADVISORY  WRITE 4343 %02x:%02x:%d 0 EOF\n'
                     % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    stat = open('/proc/self/stat').read()
    (tmp_path / 'proc' / '4343').mkdir(parents=True)
    (tmp_path / 'proc' / '4343' / 'stat').write_text('4343 (x\nGPU 0: free) ' + stat[stat.rindex(')') + 2:])
    fd = os.open(str(path), os.O_RDONLY)
    try:
        assert gpu_lock._flock_holder(fd, str(locks), str(tmp_path / 'proc')) == 'PID 4343 (%s)' % escape_text('x\nGPU 0: free')
    finally:
        os.close(fd)
