"""Real processes whose exit the tests watch: one whose exit takes a while after SIGKILL, as a
CUDA rank's does after its context is released (tests/gpu s12, run13: 31-48 ms), and one whose
main thread has exited while another thread runs."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import platform
import select
import subprocess
import sys
import time

# Touched anonymous memory the kernel frees in the exit, after every thread is marked exiting:
# 256 MiB took 50 ms to free on the 2-core lab machine, 1 GiB 205 ms.
SLOW_EXIT_MIB = 1024

_TOUCH = '''
import mmap, sys, time
area = mmap.mmap(-1, %d << 20)
for offset in range(0, len(area), 4096):
    area[offset] = 1
sys.stdout.write('ready\\n')
sys.stdout.flush()
time.sleep(300)
'''

# exit(2), not exit_group(2): only the calling thread ends (asm/unistd_64.h; asm-generic).
SYS_EXIT = {'x86_64': 60, 'aarch64': 93}.get(platform.machine())

_LEADER_EXITS = '''
import ctypes, sys, threading, time
threading.Thread(target=time.sleep, args=(300,)).start()
sys.stdout.write('ready\\n')
sys.stdout.flush()
ctypes.CDLL(None).syscall(%d, 0)
'''


def _ready(argv):
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b'ready\n'
    return proc


def slow_exit(mib=SLOW_EXIT_MIB):
    """A live process that has touched `mib` MiB: after SIGKILL it is exiting for a while."""
    return _ready([sys.executable, '-c', _TOUCH % mib])


def leader_exited():
    """A process whose main thread has called exit(2) while another thread sleeps; None where
    this machine's exit(2) number is not known here."""
    if SYS_EXIT is None:
        return None
    proc = _ready([sys.executable, '-c', _LEADER_EXITS % SYS_EXIT])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open('/proc/%d/stat' % proc.pid) as handle:
            if handle.read().rsplit(')', 1)[1].split()[0] == 'Z':
                return proc
        time.sleep(0.01)
    raise AssertionError('the main thread of PID %d did not exit' % proc.pid)


def exited(proc):
    """Whether the process has ended (its pidfd is readable); it is not reaped."""
    fd = os.pidfd_open(proc.pid)
    try:
        return bool(select.select([fd], [], [], 0)[0])
    finally:
        os.close(fd)


def end(proc):
    try:
        proc.kill()
    except OSError:
        pass
    proc.wait()
