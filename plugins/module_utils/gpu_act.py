# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Act: the only code that changes the host: signals, unit stops, GPU resets.

Every signal goes to a process re-identified by (PID, start time) at the moment of sending,
through a pidfd where the kernel offers one, so a PID reused since detection is never hit.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import signal
import subprocess
import time

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import read_identity

SENT, GONE, REUSED, REFUSED = 'sent', 'gone', 'reused', 'refused'


def send_signal(pid, start_time, signum, never=frozenset()):
    """Signal PID only if it is still the process first seen with `start_time`.

    Returns 'sent', 'gone' (exited), 'reused' (another process has the PID now) or
    'refused: <why>' (a PID this module must never signal).
    """
    if not isinstance(pid, int) or pid <= 1:
        return '%s: PID %r is never signalled' % (REFUSED, pid)
    if pid == os.getpid() or pid in never:
        return '%s: PID %d is protected' % (REFUSED, pid)
    if start_time is None:
        return '%s: PID %d has no recorded start time' % (REFUSED, pid)
    pidfd = None
    if hasattr(os, 'pidfd_open'):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return GONE
        except OSError:
            pidfd = None  # kernel without pidfds: fall back to kill(2) right after the check
    try:
        # With a pidfd open, this check is race-free: the fd pins the process it was opened on,
        # so if /proc shows the recorded start time now, the fd refers to that same process.
        identity = read_identity(pid)
        if identity is None:
            return GONE
        if identity[0] != start_time:
            return REUSED
        if identity[1] == 'zombie':
            return GONE
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signum)
            else:
                os.kill(pid, signum)
        except ProcessLookupError:
            return GONE
        return SENT
    finally:
        if pidfd is not None:
            os.close(pidfd)


def is_alive(pid, start_time):
    """True while the process first seen with `start_time` exists and is not a zombie."""
    identity = read_identity(pid)
    return identity is not None and identity[0] == start_time and identity[1] != 'zombie'


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


def _run(argv, timeout):
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                             check=False, universal_newlines=True)
    except subprocess.TimeoutExpired:
        return 124, '%s did not finish within %ss' % (' '.join(argv), timeout)
    except OSError as exc:
        return 127, str(exc)
    return out.returncode, out.stdout.strip()


def stop_unit(unit, timeout, clock=time.monotonic):
    """Stop a systemd unit so that Restart= cannot bring its processes back.

    `--no-block` queues the stop; we then poll its state ourselves, bounded by `timeout`,
    instead of blocking for the unit's own TimeoutStopSec (90 s by default).
    """
    rc, out = _run(['systemctl', 'stop', '--no-block', '--', unit], timeout=30)
    if rc != 0:
        return 'failed: %s' % out

    def inactive():
        code, state = _run(['systemctl', 'is-active', '--', unit], timeout=10)
        return state in ('inactive', 'failed', 'unknown') or (code != 0 and state != 'deactivating'
                                                              and state != 'active')
    done = wait_for(inactive, timeout, clock=clock)[0]
    return 'stopped' if done else 'stopping (still deactivating after %ss)' % timeout


def stop_container(owner, grace):
    """Stop a container through its runtime (`podman stop -t GRACE ID`, never a removal), so
    that its restart policy cannot bring its processes back and its init is reached.

    The runtime sends the container's stop signal, waits up to `grace` seconds, then SIGKILLs;
    the command returns once the container has exited.
    """
    argv = gpu_owner.runtime_argv(owner['runtime'], 'stop', owner, grace=grace)
    if not argv:
        return 'refused: %s containers are never stopped by this module' % owner['runtime']
    rc, out = _run(argv, timeout=grace + 30)
    return 'stopped' if rc == 0 else 'failed (rc=%d): %s' % (rc, out)


def reset_gpu(index, persistence_mode, timeout):
    """nvidia-smi --gpu-reset on one GPU, with persistence mode off for the reset and restored.

    Returns (ok, steps) where steps is a list of (what, rc, output).
    """
    steps = []
    if persistence_mode:
        rc, out = _run(['nvidia-smi', '-pm', '0', '-i', str(index)], timeout)
        steps.append(('persistence_off', rc, out))
    rc, out = _run(['nvidia-smi', '--gpu-reset', '-i', str(index)], timeout)
    steps.append(('reset', rc, out))
    ok = rc == 0
    if persistence_mode:
        prc, pout = _run(['nvidia-smi', '-pm', '1', '-i', str(index)], timeout)
        steps.append(('persistence_on', prc, pout))
    return ok, steps
