"""NvmlBackend.read_health and NvidiaBackend.read_xids (issue 30 item 6): the real pynvml
against the stand-in driver (tests/fakegpu), each read bounded."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import json
import os
import subprocess
import sys
import time

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_nvidia
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe

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
