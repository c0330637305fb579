"""gpu_nvidia.NvmlBackend's driver session: one nvmlInit per ladder run, not one per read."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import subprocess
import types

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act as act
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_flow as flow
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_nvidia


class _Driver(object):
    """A pynvml with one idle GPU that counts nvmlInit/nvmlShutdown and refuses a query outside
    a session, as the real library does (NVML_ERROR_UNINITIALIZED)."""

    NVMLError = type('NVMLError', (Exception,), {})
    nvmlMemory_v2 = 2

    def __init__(self):
        self.inits = self.shutdowns = 0
        self.calls = []
        self.holder = None     # a PID charged 1 GiB while it lives

    def _held(self):
        return self.holder is not None and os.path.exists('/proc/%d' % self.holder) and \
            open('/proc/%d/stat' % self.holder).read().split(') ')[1][0] != 'Z'

    @property
    def open(self):
        return self.inits > self.shutdowns

    def _query(self, what, value):
        if not self.open:
            raise self.NVMLError('Uninitialized')
        self.calls.append(what)
        return value

    def nvmlInit(self):
        self.inits += 1
        self.calls.append('init')

    def nvmlShutdown(self):
        self.shutdowns += 1
        self.calls.append('shutdown')

    def nvmlDeviceGetCount(self):
        return self._query('count', 1)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self._query('handle', index)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        used = (1 << 30) if self._held() else 0
        return self._query('memory', types.SimpleNamespace(used=used, reserved=0, total=80 << 30))

    def nvmlDeviceGetPersistenceMode(self, handle):
        return self._query('persistence', 1)

    def nvmlDeviceGetMinorNumber(self, handle):
        return self._query('minor', 0)

    def nvmlDeviceGetUUID(self, handle):
        return self._query('uuid', 'GPU-0')

    def nvmlDeviceGetName(self, handle):
        return self._query('name', 'stand-in')

    def nvmlDeviceGetPciInfo(self, handle):
        return self._query('pci', types.SimpleNamespace(busId='00000000:01:00.0'))

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        listed = [types.SimpleNamespace(pid=self.holder, usedGpuMemory=1 << 30)] if self._held() else []
        return self._query('compute', listed)


@pytest.fixture
def driver(monkeypatch):
    fake = _Driver()
    monkeypatch.setattr(gpu_nvidia, 'pynvml', fake)
    return fake


def test_each_read_has_its_own_session_by_default(driver, tmp_path):
    backend = gpu_nvidia.NvmlBackend(str(tmp_path))
    backend.read_gpus(5)
    backend.read_gpus(5)
    assert (driver.inits, driver.shutdowns) == (2, 2)


def test_a_held_session_is_initialised_once_and_ended_once(driver, tmp_path):
    backend = gpu_nvidia.NvmlBackend(str(tmp_path))
    backend.hold_session()
    for _read in range(3):
        assert [g.used_mib for g in backend.read_gpus(5)] == [0]
    assert (driver.inits, driver.shutdowns) == (1, 0)
    backend.end_session(5)
    assert (driver.inits, driver.shutdowns) == (1, 1)
    backend.end_session(5)   # twice: nothing more to end
    backend.read_gpus(5)     # after the end, a read has its own session again
    assert (driver.inits, driver.shutdowns) == (2, 2)


def test_a_ladder_run_reads_in_one_session_and_ends_it(driver, tmp_path):
    """A holder (an orphaned sleep with the device open, not this test's child) is signalled and the GPUs read again
    until free: every read in the one session the run opened, ended when it returns."""
    (tmp_path / 'nvidia0').write_text('')
    driver.holder = int(subprocess.check_output(
        ['sh', '-c', 'exec 3<"$1"; sleep 300 >/dev/null 2>&1 & echo $!', 'sh', str(tmp_path / 'nvidia0')]))
    try:
        surveyor = flow.Surveyor(dev_dir=str(tmp_path), backend=gpu_nvidia.NvmlBackend(str(tmp_path)))
        result = flow.Ladder(surveyor, term_timeout=5, release_timeout=5).run()
    finally:
        if driver._held():
            os.kill(driver.holder, 9)
    assert result['free'] is True, (result.get('msg'), result['actions'])
    assert [a['step'] for a in result['actions']][:1] == ['sigterm']
    assert driver.calls.count('memory') >= 2
    assert (driver.inits, driver.shutdowns) == (1, 1) and not driver.open


def test_the_session_ends_before_a_reset(driver, tmp_path):
    """nvidia-smi --gpu-reset refuses while any process has the device open: the ladder's own
    NVML session too. Every reset command runs with NVML shut down."""
    backend = gpu_nvidia.NvmlBackend(str(tmp_path))
    surveyor = flow.Surveyor(dev_dir=str(tmp_path), backend=backend)
    ran = []

    class Actor(act.RecordingActor):
        def run(self, argv, timeout, as_user=None, ends=()):
            ran.append((argv[1:], driver.open))
            return act.RecordingActor.run(self, argv, timeout)

    ladder = flow.Ladder(surveyor, allow_reset=True, actor=Actor())
    ladder.started = 0.0
    backend.hold_session()
    held = surveyor.survey()
    held.rows[0]['free'] = False
    assert driver.open
    ladder._reset(held)
    assert ran and [opened for _argv, opened in ran] == [False] * len(ran), ran
    assert ['--gpu-reset', '-i', '0'] in [argv for argv, _opened in ran]


def test_a_hung_read_leaves_nothing_to_wait_for_at_the_end(driver, tmp_path, monkeypatch):
    """A read that outlives nvml_timeout is still stuck in the driver: ending the session would
    wait on it again, so the failure comes after one nvml_timeout, not two."""
    backend = gpu_nvidia.NvmlBackend(str(tmp_path))
    backend.hold_session()
    backend.read_gpus(5)

    def hung(*_args):
        raise gpu_nvidia.NvmlTimeout('NVML did not answer')
    monkeypatch.setattr(gpu_nvidia, 'bounded', hung)
    with pytest.raises(gpu_nvidia.NvmlTimeout):
        backend.read_gpus(5)
    backend.end_session(5)
    assert driver.shutdowns == 0 and not backend.held
