"""gpu_access: does this module see every process (CAP_SYS_PTRACE, hidepid)?"""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_access as access

ROOT_STATUS = 'Name:\tpython3\nCapEff:\t000001ffffffffff\n'
USER_STATUS = 'Name:\tpython3\nCapEff:\t0000000000000000\n'
MOUNTINFO = (
    '22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n'
    '23 1 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw,hidepid=invisible\n'
)


def test_capabilities_decide_blindness():
    assert access.parse_cap_eff(ROOT_STATUS) & (1 << access.CAP_SYS_PTRACE)
    assert access.parse_cap_eff(USER_STATUS) == 0
    assert access.parse_cap_eff('Name:\tx\n') == 0


def test_hidepid_is_read_from_the_proc_mount_only():
    assert access.parse_hidepid(MOUNTINFO) == 'invisible'
    assert access.parse_hidepid(MOUNTINFO.replace(',hidepid=invisible', '')) is None
    assert access.parse_hidepid(MOUNTINFO, proc='/sys') is None


def test_blind_sentence_says_run_as_root_first_and_never_advises_reset():
    blind = access.ProcAccess(euid=1000, user='lab', can_read_all=False, hidepid='2')
    text = blind.sentence()
    assert blind.blind
    assert text.startswith('Run as root (become: true): ')
    assert 'lab (UID 1000)' in text and 'hidepid=2' in text
    assert 'no evidence of a leaked context' in text
    assert 'reset' not in text and 'reboot' not in text


def test_root_is_not_blind():
    root = access.ProcAccess(euid=0, user='root', can_read_all=True, hidepid=None)
    assert not root.blind and root.sentence() is None


PROBE = ("from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_access as a; "
         "x = a.read_access(); print(x.euid, x.user, x.blind)")


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root and /usr/bin/python3 to compare root with the user nobody")
def test_read_access_as_root_and_as_nobody():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    as_root = subprocess.run([sys.executable, '-c', PROBE], env=env, capture_output=True, text=True,
                             check=True).stdout.split()
    assert as_root == ['0', 'root', 'False']
    # nobody runs the system python (the venv's may live under /root, out of its reach) on a
    # copy of gpu_access in a tree it may read: the checkout may sit in a 0700 directory
    # (/root's clones), where nobody cannot import the collection, and so may pytest's own
    # tmp_path (/tmp/pytest-of-root is 0700). gpu_access needs only the standard library.
    with tempfile.TemporaryDirectory(prefix='gpuops-nobody-') as readable:
        package = os.path.join(readable, 'ansible_collections', 'gpuops', 'reclaim', 'plugins', 'module_utils')
        os.makedirs(package)
        shutil.copy(access.__file__, os.path.join(package, 'gpu_access.py'))
        for top, dirs, files in os.walk(readable):
            os.chmod(top, 0o755)
            for name in files:
                os.chmod(os.path.join(top, name), 0o644)
        as_nobody = subprocess.run(['/usr/bin/python3', '-c', PROBE], env=dict(os.environ, PYTHONPATH=readable),
                                   capture_output=True, text=True, check=True, user='nobody', cwd='/').stdout.split()
    assert as_nobody[1:] == ['nobody', 'True']


# --- gpu_decide when the module is blind (not root) -----------------------------------------------

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide  # noqa: E402
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say  # noqa: E402

from .observations import FREE_MIB, diagnosed, gpu, proc, snap  # noqa: E402

BLIND = access.ProcAccess(euid=1000, user='lab', can_read_all=False, hidepid=None).sentence()


def test_blind_diagnosis_says_run_as_root_first_and_never_reset():
    # hidepid: the root holder NVML lists does not even show in /proc.
    hidden = snap([gpu(0, used=1000, processes=[(777, 1000)]), gpu(1, used=500)], [], missing=[777])
    holders, _clients, unconfirmed = decide.classify(hidden, [], set(), {}, FREE_MIB)
    rows = decide.gpu_table(hidden, holders, [0, 1], 128)
    diagnosis = diagnosed(hidden, holders, unconfirmed, rows, blind_sentence=BLIND)
    assert diagnosis[0] == BLIND
    assert diagnosis[1:] == [
        'GPU 0: NVML lists PID 777 (1000 MiB), which this module cannot see: run as root (become: true).',
        'GPU 1: 500 MiB used with no process visible to this module: run as root (become: true) to see '
        'its holders.']
    msg = say.failure_message(rows, [], 1.0, allow_reset=False, blind_sentence=BLIND)
    assert msg.startswith(BLIND)
    for text in diagnosis[1:] + [msg[len(BLIND):]]:
        assert 'reset' not in text and 'reboot' not in text, text


def test_unreadable_listed_process_is_a_holder_not_a_foreign_pid():
    # No hidepid: the root holder shows, but its fds and maps are unreadable to this user.
    s = snap([gpu(0, used=1000, processes=[(777, 1000)])], [proc(777)])
    s.unreadable = [(777, 'fd', 'Permission denied'), (777, 'maps', 'Permission denied')]
    holders, _clients, unconfirmed = decide.classify(s, [], set(), {}, FREE_MIB)
    assert unconfirmed == []
    assert [(h.pid, h.context_gpus, h.evidence) for h in holders] == [(777, [0], ['nvml'])]
    rows = decide.gpu_table(s, holders, [0], 128)
    msg = say.failure_message(rows, [holders[0].left(None, 'survived the ladder')], 1.0, False, blind_sentence=BLIND)
    assert 'PID 777 (python3) sleeping: run as root (become: true) to signal it' in msg
    assert 'reset' not in msg[len(BLIND):]


def test_unreadable_process_while_not_blind_names_a_security_policy_not_root():
    # Root with CAP_SYS_PTRACE, yet a process's fds are refused (a real H200 VM refused even
    # root its sandbox init, PID 1): "run as root" would send the operator nowhere.
    s = snap([gpu(0, used=0)], [proc(1)])
    s.unreadable = [(1, 'fd', 'Permission denied')]
    rows = decide.gpu_table(s, [], [0], 128)
    sentences = diagnosed(s, [], [], rows)
    text = [t for t in sentences if 'Could not read' in t]
    assert len(text) == 1 and '(1)' in text[0] and 'security policy' in text[0], sentences
    assert 'run as root' not in text[0]
