"""gpu_listen (what the port_owner module reports): who listens on a port and whether each
listener is the unit's own server. Real listeners of this test's own process; the squatter, the
unit and the runtimes run in the lab (tests/integration/test_security.py, the Molecule
scenarios). Carries what tests/unit/roles/inference_service/test_port_owner.py proved of the
role's old files/port_owner.py (issue 22 item 4)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import socket
import subprocess
import sys

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_listen, gpu_observe, gpu_owner

ID = 'c' * 64


def listening(host='127.0.0.1', family=socket.AF_INET):
    sock = socket.socket(family)
    sock.bind((host, 0))
    sock.listen()
    return sock


def test_a_real_listener_is_found_with_its_uid_and_cgroup_and_is_not_in_a_unit_it_does_not_belong_to():
    sock = listening()
    port = sock.getsockname()[1]
    try:
        out = gpu_listen.listeners(port, '127.0.0.1', unit='no-such-unit.service')
    finally:
        sock.close()
    assert out['listening'] is True and out['port'] == port and out['unit'] == 'no-such-unit.service'
    (me,) = [o for o in out['owners'] if o['pid'] == os.getpid()]
    assert me['uid'] == os.getuid() and me['in_unit'] is False
    assert me['start_time'] == gpu_observe.read_identity(os.getpid()).start_time
    with open('/proc/self/cgroup') as handle:
        assert me['cgroup'] == gpu_owner.systemd_path(handle.read(), gpu_observe.unified_cgroup())
    assert me['reason_code'] in (gpu_listen.OUTSIDE, gpu_listen.NO_UNIT)
    assert me['label'].startswith('PID %d (uid %d, ' % (os.getpid(), os.getuid())), me['label']


def test_a_closed_port_has_no_listener_and_a_specific_address_clashes_only_with_itself_or_a_wildcard():
    sock = listening()
    port = sock.getsockname()[1]
    try:
        assert gpu_listen.listeners(port, '192.0.2.1')['listening'] is False   # both specific, different (192.0.2.1: TEST-NET-1, never a lab address)
        assert gpu_listen.listeners(port, '0.0.0.0')['listening'] is True       # a wildcard clashes
        assert gpu_listen.listeners(port, '127.0.0.1')['listening'] is True
    finally:
        sock.close()
    gone = gpu_listen.listeners(port, '0.0.0.0')
    assert gone['listening'] is False and gone['owners'] == []


def test_a_v6_wildcard_listener_clashes_with_any_v4_address():
    if not socket.has_ipv6:
        pytest.skip('this host has no IPv6 sockets')
    try:
        sock = listening('::', socket.AF_INET6)
    except OSError as exc:
        pytest.skip('cannot bind :: here: %s' % exc)
    port = sock.getsockname()[1]
    try:
        out = gpu_listen.listeners(port, '10.1.2.3')
    finally:
        sock.close()
    assert out['listening'] is True and os.getpid() in [o['pid'] for o in out['owners']]


BIG = ("import socket, sys, time\n"
       "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
       "print(s.getsockname()[1], flush=True)\n"
       "time.sleep(60)\n")


def test_a_listener_whose_command_line_is_past_128_kib_is_named_whole_and_its_label_is_bounded_and_escaped():
    # 1,500 words of 100 bytes, as test_security's hand-started server: argv takes it, one
    # argument (a shell line holding it) could not (MAX_ARG_STRLEN, 128 KiB).
    words = ['%0100d' % i for i in range(1500)] + ['tail\x1b[2J']
    proc = subprocess.Popen([sys.executable, '-c', BIG] + words, stdout=subprocess.PIPE)
    try:
        port = int(proc.stdout.readline())
        out = gpu_listen.listeners(port, '127.0.0.1')
    finally:
        proc.kill()
        proc.wait()
    (entry,) = [o for o in out['owners'] if o['pid'] == proc.pid]
    assert len(entry['cmdline']) > 150000 and entry['cmdline'].endswith('tail\x1b[2J'), len(entry['cmdline'])
    # The -c program's newlines come first in its command line: escaped, the label stays one line.
    assert '\n' not in entry['label'] and 'time\\ns = socket' in entry['label'], entry['label']
    assert len(entry['label']) < 400, len(entry['label'])
    assert entry['label'].startswith('PID %d (uid %d, ' % (proc.pid, os.getuid()))


UNIT = '/system.slice/sglang.service'
SCOPE = '/system.slice/docker-%s.scope' % ID


@pytest.mark.parametrize('path, container, code', [
    (UNIT, None, gpu_listen.IN_UNIT),
    (UNIT + '/libpod-payload-' + ID, None, gpu_listen.IN_UNIT),      # podman --cgroups=split under the unit
    ('/system.slice/sglang.service-evil', None, gpu_listen.OUTSIDE),
    ('/user.slice/user-1000.slice/user@1000.service/app.slice/sglang.service', None, gpu_listen.OUTSIDE),
    # The unit's docker container: in docker's scope, never in the unit's cgroup. It counts only
    # in the cgroup docker confirmed for the container the unit's own docker run made.
    (SCOPE, SCOPE, gpu_listen.UNIT_CONTAINER),
    (SCOPE + '/worker', SCOPE, gpu_listen.UNIT_CONTAINER),
    ('/system.slice/docker-%s.scope' % ('d' * 64), SCOPE, gpu_listen.OUTSIDE),   # another container
    (SCOPE, None, gpu_listen.OUTSIDE),                                           # not confirmed
])
def test_a_listener_is_the_units_only_in_its_control_group_or_its_confirmed_container(path, container, code):
    assert gpu_listen.verdict(path, UNIT, container) == code


def test_without_a_unit_control_group_or_a_container_nothing_is_the_units():
    assert gpu_listen.verdict(UNIT, None) == gpu_listen.NO_UNIT
    assert gpu_listen.verdict(UNIT, None, SCOPE) == gpu_listen.OUTSIDE


def test_a_container_its_runtime_cannot_confirm_is_named_with_the_command_and_no_listener_is_in_it():
    # No such container here (no docker CLI, no daemon, or no container of that ID: the same answer).
    # The confirmed case runs in the lab: the docker Molecule scenario.
    sock = listening()
    port = sock.getsockname()[1]
    try:
        out = gpu_listen.listeners(port, '127.0.0.1', unit='sglang.service', container=('docker', ID))
    finally:
        sock.close()
    assert out['container'] == {'id': ID, 'error': '`docker inspect --type container -- %s` gave nothing (no such '
                                'container, or the CLI missing, failing or not answering within 10s)' % ID}
    (me,) = [o for o in out['owners'] if o['pid'] == os.getpid()]
    assert me['in_container'] is False and me['in_unit'] is False
