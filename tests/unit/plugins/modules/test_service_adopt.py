"""The service_adopt module: bad input is named and changes nothing; check mode plans the
adoption of a real process tree and touches nothing; its RETURN documents every key."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import subprocess

import pytest
import yaml

from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import read_identity
from ansible_collections.gpuops.reclaim.plugins.modules import service_adopt

from . import module_run


def run(capsys, **args):
    return module_run.run(service_adopt, capsys, **args)


@pytest.fixture
def server():
    proc = subprocess.Popen(['sleep', '300'])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize('args, named', [
    (dict(scope='sglang adopted', roots={}), "scope 'sglang adopted' cannot name a systemd scope"),
    (dict(scope='sglang*', roots={}), "scope 'sglang*' cannot name"),
    (dict(scope='sglang-adopted', roots={}, stop_timeout=0), 'stop_timeout 0.0 must be above 0'),
    (dict(scope='sglang-adopted', roots={}, stop_timeout=86400), 'stop_timeout 86400.0 must be above 0 and at most 3600'),
    (dict(scope='sglang-adopted', roots={'4242x': 1}), "roots: '4242x' is not a PID"),
    (dict(scope='sglang-adopted', roots={'4242': 'later'}), "the start time of PID 4242 is 'later'"),
])
def test_bad_input_fails_naming_the_value_and_changes_nothing(capsys, server, args, named):
    out = run(capsys, **args)
    assert out['failed'] is True and named in out['msg'] and 'nothing was adopted or stopped' in out['msg'], out['msg']
    assert server.poll() is None


def test_a_root_without_its_start_time_fails_naming_it(capsys, server):
    out = run(capsys, scope='sglang-adopted', roots={str(server.pid): None})
    assert out['failed'] is True and 'no start time was recorded for PID %d' % server.pid in out['msg']
    assert out['changed'] is False and out['procs'] == [] and server.poll() is None


def test_check_mode_plans_the_tree_and_touches_nothing_with_every_documented_key(capsys, server):
    start = read_identity(server.pid).start_time
    with open('/proc/%d/cgroup' % server.pid) as handle:
        cgroup = handle.read()
    out = run(capsys, scope='sglang-adopted', roots={str(server.pid): start}, _ansible_check_mode=True)
    assert out.get('failed') is not True, out
    assert out['changed'] is True and out['scope'] is None and out['actions'] == []
    assert [(p['pid'], p['start_time'], p['root']) for p in out['procs']] == [(server.pid, start, True)]
    with open('/proc/%d/cgroup' % server.pid) as handle:
        assert handle.read() == cgroup
    assert server.poll() is None
    doc = yaml.safe_load(service_adopt.RETURN)
    assert set(out) - {'changed', 'invocation'} == set(doc)
    assert set(out['procs'][0]) == set(doc['procs']['contains'])
