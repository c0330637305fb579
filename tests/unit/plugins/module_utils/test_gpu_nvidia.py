"""gpu_nvidia.NvmlBackend's driver session: one nvmlInit per ladder run, not one per read; and
NvmlBackend.read_health and read_xids (issue 30 item 6): the real pynvml against the stand-in
driver (tests/fakegpu), each read bounded."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import json
import os
import subprocess
import sys
import time
import types

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act as act
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_flow as flow
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_nvidia
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe


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


# --- health and Xids through the stand-in driver (issue 30 item 6) -------------------------------

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTIONS = os.path.join(HERE, '..', '..', '..', '..', '.build', 'collections')

# take_health in a process that loads the stand-in (pynvml dlopens libnvidia-ml.so.1 at init).
PROBE = r"""
import json, sys, time
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_nvidia, gpu_observe
timeout, xid_log = float(sys.argv[1]), sys.argv[2] or None
backend = gpu_nvidia.NvmlBackend()
started = time.monotonic()
records, xids, unread = gpu_observe.take_health(backend, [0, 1], timeout, xid_log=xid_log)
print(json.dumps({"took_s": time.monotonic() - started,
                  "records": {i: r._asdict() for i, r in records.items()},
                  "xids": [x._asdict() for x in xids] if xids is not None else None, "unread": unread}))
"""


@pytest.fixture
def root(tmp_path, stand_in_lib):
    from fakegpulib.testing import FakeGpuRoot  # pylint: disable=import-outside-toplevel
    r = FakeGpuRoot(tmp_path / 'root')
    r.setup('--gpus', '2')
    yield r
    r.cleanup()


def take(root, timeout=5.0, xid_log=''):
    env = dict(root.env, PYTHONPATH=COLLECTIONS)
    out = subprocess.run([sys.executable, '-c', PROBE, str(timeout), xid_log], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    got = json.loads(out.stdout)
    got['records'] = dict((int(i), r) for i, r in got['records'].items())
    return got


def test_healthy_stand_in_reads_as_the_measured_h100(root):
    got = take(root)
    for index in (0, 1):
        rec = got['records'][index]
        assert rec['lost'] is False and rec['remapped_rows'] == [0, 0, 0, 0]
        assert rec['ecc_volatile_uncorrected'] == 0 and rec['recovery_action'] == 0
        assert rec['retired_pages_pending'] is None
        assert rec['unread'] == {'retired_pages_pending': ['not_supported', 'GPU %d: retired_pages_pending: Not Supported' % index]}
        assert set(rec['took_ms']) == set(observe.HEALTH_READS) | {observe.XID_READ}


def test_each_fault_reaches_the_record(root):
    root.fakegpu('fault', '--gpu', '1', 'row-remap-pending')
    root.fakegpu('fault', '--gpu', '1', 'ecc', '3')
    root.fakegpu('fault', '--gpu', '1', 'recovery-action', '4')
    root.fakegpu('fault', '--gpu', '1', 'retired-pending')
    rec = take(root)['records'][1]
    assert (rec['remapped_rows'], rec['ecc_volatile_uncorrected'], rec['recovery_action'],
            rec['retired_pages_pending'], rec['unread']) == ([0, 0, 1, 0], 3, 4, True, {})


def test_a_lost_gpu_is_lost_and_the_survey_still_reads_the_others(root):
    root.fakegpu('fault', '--gpu', '0', 'lost')
    got = take(root)
    assert got['records'][0]['lost'] is True and got['records'][0]['unread'] == {}
    assert got['records'][1]['lost'] is False
    env = dict(root.env, PYTHONPATH=COLLECTIONS)
    out = subprocess.run([sys.executable, '-c', 'from ansible_collections.gpuops.reclaim.plugins.module_utils import '
                          'gpu_nvidia; print([(g.index, g.uuid != "") for g in gpu_nvidia.NvmlBackend().read_gpus(5)])'],
                         env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == '[(0, False), (1, True)]'


def test_a_hung_read_is_named_within_its_bound_and_the_rest_are_skipped(root):
    root.fakegpu('fault', '--gpu', '0', 'hang-health', '60')
    started = time.monotonic()
    got = take(root, timeout=1.0)
    assert time.monotonic() - started < 10     # one bound, not one per read or per GPU
    rec0, rec1 = got['records'][0], got['records'][1]
    assert rec0['unread']['remapped_rows'][0] == 'hung'
    assert 'nvml_timeout=1.0s' in rec0['unread']['remapped_rows'][1]
    assert all(rec0['unread'][read][0] == 'skipped' for read in
               ('ecc_volatile_uncorrected', 'retired_pages_pending', 'recovery_action'))
    assert all(code == 'skipped' for code, _text in rec1['unread'].values())


def test_xids_are_read_from_the_stand_ins_log(root):
    root.fakegpu('xid', '--gpu', '1', '79', '--at', '1000')
    root.fakegpu('xid', '--gpu', '0', '48', '--at', '2000')
    got = take(root, xid_log=os.path.join(root.path, 'var/log/fakegpu/kernel.log'))
    assert [(x['xid'], x['pci'], x['at']) for x in got['xids']] == [(79, [0, 0x2a, 0], 1000.0), (48, [0, 0x18, 0], 2000.0)]
    assert got['unread'] is None


LINES = """\
1765000000.100000 node kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.159.04
1765000001.200000 node kernel: NVRM: Xid (PCI:0000:18:00): 48, pid=4242, name=python3, An uncorrectable double bit error
1765000002.300000 node kernel: NVRM: Xid (PCI:0000:2a:00.0): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
garbage NVRM: Xid (PCI:0000:2a:00): 79, no time
"""


def test_parse_xid_lines_keeps_driver_lines_since_the_given_time():
    events = gpu_nvidia.parse_xid_lines(LINES)
    assert [(e.xid, e.pci, e.at) for e in events] == [(48, (0, 0x18, 0), 1765000001.2), (79, (0, 0x2a, 0), 1765000002.3)]
    assert events[0].text == 'pid=4242, name=python3, An uncorrectable double bit error'
    assert [e.xid for e in gpu_nvidia.parse_xid_lines(LINES, since=1765000002)] == [79]


def test_an_xid_log_others_may_write_is_refused(tmp_path):
    log = tmp_path / 'kernel.log'
    log.write_text(LINES)
    os.chmod(str(log), 0o666)
    with pytest.raises(observe.ObserveError, match='only root'):
        gpu_nvidia.NvmlBackend().read_xids(None, 5, str(log))
    os.chmod(str(log), 0o644)
    assert len(gpu_nvidia.NvmlBackend().read_xids(None, 5, str(log))) == 2
    with pytest.raises(observe.ObserveError, match='cannot read xid_log'):
        gpu_nvidia.NvmlBackend().read_xids(None, 5, str(tmp_path / 'missing'))


def test_journalctl_is_bounded(tmp_path, monkeypatch):
    """A journalctl that hangs (the journal is busy) is named within the bound."""
    fake = tmp_path / 'journalctl'
    fake.write_text('#!/bin/sh\nexec sleep 30\n')
    fake.chmod(0o755)
    monkeypatch.setenv('PATH', '%s:%s' % (tmp_path, os.environ['PATH']))
    started = time.monotonic()
    with pytest.raises(observe.NvmlTimeout, match='did not answer within nvml_timeout=0.5s'):
        gpu_nvidia.NvmlBackend().read_xids(None, 0.5, None)
    assert time.monotonic() - started < 5
