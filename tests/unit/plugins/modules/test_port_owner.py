"""The port_owner module: its options (bad input named, nothing read) and what it returns, with
a real listener of this test; its RETURN documents every key it returns."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import socket

import pytest
import yaml

from ansible_collections.gpuops.reclaim.plugins.modules import port_owner

from . import module_run


def run(capsys, **args):
    return module_run.run(port_owner, capsys, **args)


@pytest.mark.parametrize('args, named', [
    (dict(port=0), 'port 0 is not a TCP port'),
    (dict(port=70000), 'port 70000 is not a TCP port'),
    (dict(port=30000, unit='sglang*.service'), "unit 'sglang*.service' is not a systemd service or scope name"),
    (dict(port=30000, unit='sglang'), "unit 'sglang' is not"),
])
def test_bad_input_fails_naming_the_value(capsys, args, named):
    out = run(capsys, **args)
    assert out['failed'] is True and named in out['msg'] and 'nothing was read' in out['msg'], out['msg']


def test_a_real_listener_is_returned_with_every_documented_key(capsys):
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    sock.listen()
    port = sock.getsockname()[1]
    try:
        out = run(capsys, port=port, host='127.0.0.1', unit='sglang.service', _ansible_check_mode=True)
    finally:
        sock.close()
    assert out['changed'] is False and out['listening'] is True
    (me,) = [o for o in out['owners'] if o['pid'] == os.getpid()]
    assert me['in_unit'] is False and me['uid'] == os.getuid()
    doc = yaml.safe_load(port_owner.RETURN)
    assert set(out) - {'changed', 'invocation'} == set(doc)
    assert set(me) == set(doc['owners']['contains'])


@pytest.mark.parametrize('container, named', [
    ({'runtime': '/usr/bin/lxc', 'id': 'c' * 64}, "container runtime '/usr/bin/lxc' is neither docker nor podman"),
    ({'runtime': 'docker', 'id': 'sglang'}, "container id 'sglang' is not a full container ID"),
    ({'runtime': '/usr/bin/docker', 'id': 'C' * 64}, "container id '%s' is not a full container ID" % ('C' * 64)),
])
def test_a_bad_container_fails_naming_it(capsys, container, named):
    out = run(capsys, port=30000, unit='sglang.service', container=container)
    assert out['failed'] is True and named in out['msg'] and 'nothing was read' in out['msg'], out['msg']
