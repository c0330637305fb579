"""gpu_observe's /proc readers: named fields, typed errors (gone, access denied), on real processes."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import parse_stat


def test_parse_stat_survives_names_with_spaces_and_parens():
    raw = b'123 (a) b (c) S 1 123 123 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 98765 0 0'
    stat = parse_stat(raw)
    assert (stat.comm, stat.state, stat.ppid, stat.start_time, stat.flags) == (
        'a) b (c', 'sleeping', 1, 98765, 4194560)
    zombie_leader = raw.replace(b' S ', b' Z ').replace(b' 20 0 1 0 ', b' 20 0 3 0 ')
    assert parse_stat(zombie_leader).state == 'zombie-leader'
    assert parse_stat(raw.replace(b' S ', b' Z ')).state == 'zombie'


def test_identity_of_a_live_process_has_named_fields():
    identity = observe.read_identity(os.getpid())
    assert identity.state in ('running', 'sleeping') and identity.start_time > 0


def test_a_gone_process_raises_process_gone_everywhere():
    child = subprocess.Popen(['true'])
    child.wait()
    with pytest.raises(observe.ProcessGone) as err:
        observe.read_identity(child.pid)
    assert err.value.pid == child.pid
    with pytest.raises(observe.ProcessGone):
        observe.read_process(child.pid)


def test_a_stat_cut_short_is_a_process_that_went(tmp_path):
    (tmp_path / '42').mkdir()
    (tmp_path / '42' / 'stat').write_bytes(b'')
    with pytest.raises(observe.ProcessGone):
        observe.read_stat(42, proc=str(tmp_path))


def test_an_access_error_is_typed_by_errno():
    assert isinstance(observe._proc_error(PermissionError(13, 'denied'), 7, 'fd'), observe.AccessDenied)
    assert isinstance(observe._proc_error(FileNotFoundError(2, 'gone'), 7, 'fd'), observe.ProcessGone)
    other = observe._proc_error(OSError(5, 'EIO'), 7, 'maps')
    assert not isinstance(other, (observe.ProcessGone, observe.AccessDenied)) and other.what == 'maps'


def test_scan_finds_an_open_device_node_by_prefix(tmp_path):
    node = tmp_path / 'nvidia3'
    node.write_bytes(b'')
    with open(str(node), 'rb'):
        procs, unreadable = observe.scan_processes((str(tmp_path) + '/nvidia',))
    mine = procs[os.getpid()]
    assert mine.dev_fds == {str(node)} and mine.name and mine.start_time
    assert all(entry[0] != os.getpid() for entry in unreadable)


def test_a_listed_only_scan_reads_the_given_pids_and_no_other(tmp_path):
    node = tmp_path / 'nvidia3'
    node.write_bytes(b'')
    prefix = (str(tmp_path) + '/nvidia',)
    with open(str(node), 'rb'):
        holder = subprocess.Popen(['sleep', '30'])
        try:
            # this test process and the child (which inherited nothing) both exist; only the
            # child is asked for, and a PID of 0 is never read
            procs, _unused = observe.scan_processes(prefix, extra_pids=[holder.pid, 0], only_extra=True)
            assert set(procs) == {holder.pid} and procs[holder.pid].dev_fds == set()
            procs, _unused = observe.scan_processes(prefix, extra_pids=[holder.pid])
            assert os.getpid() in procs and procs[os.getpid()].dev_fds == {str(node)}
        finally:
            holder.kill()
            holder.wait()


def test_children_of_lists_a_new_child_and_a_gone_parent_raises():
    child = subprocess.Popen(['sleep', '30'])
    try:
        assert child.pid in observe.children_of(os.getpid())
    finally:
        child.kill()
        child.wait()
    with pytest.raises(observe.ProcessGone):
        observe.children_of(child.pid)


def _wait(predicate, timeout=10):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_read_exe_names_the_program_by_path_and_inode_and_a_gone_process_raises():
    sleeper = subprocess.Popen(['sleep', '30'])
    try:
        exe = observe.read_exe(sleeper.pid)
        real = os.stat(shutil.which('sleep'))
        assert (exe.dev, exe.ino) == (real.st_dev, real.st_ino)
        assert os.path.basename(exe.path) == os.path.basename(os.path.realpath(shutil.which('sleep')))
    finally:
        sleeper.kill()
        sleeper.wait()
    with pytest.raises(observe.ProcessGone):
        observe.read_exe(sleeper.pid)


def test_a_fork_without_exec_runs_its_parents_program_and_is_flagged_until_it_execs():
    # bash forks a subshell for `( ... )` and the subshell forks again for `sleep`: the subshell
    # never execs, so it runs bash with PF_FORKNOEXEC set; `sleep` has exec'd.
    shell = subprocess.Popen(['bash', '-c', '(sleep 30; true); true'])
    try:
        assert _wait(lambda: len(observe.descendants_of(shell.pid)) == 2)
        tree = observe.descendants_of(shell.pid)
        subshell = [pid for pid, parent in tree.items() if parent == shell.pid][0]
        sleeper = [pid for pid, parent in tree.items() if parent == subshell][0]
        assert list(tree) == [subshell, sleeper], 'parents come before their children'
        # The second fork is seen before its exec under load (final CI at c16706d: comm 'bash',
        # running, flag set): wait until it runs sleep.
        assert _wait(lambda: observe.read_stat(sleeper).comm == 'sleep')
        assert observe.read_exe(subshell) == observe.read_exe(shell.pid)
        assert observe.read_stat(subshell).flags & observe.FORKNOEXEC_FLAG
        assert not observe.read_stat(sleeper).flags & observe.FORKNOEXEC_FLAG
        assert not observe.read_stat(shell.pid).flags & observe.FORKNOEXEC_FLAG
    finally:
        for pid in observe.descendants_of(shell.pid):
            os.kill(pid, signal.SIGKILL)
        shell.kill()
        shell.wait()
    assert observe.descendants_of(shell.pid) == {}


def test_a_traced_process_names_its_tracer():
    if not shutil.which('strace'):
        pytest.skip('strace is not installed here: tests/integration/test_gpu_reclaim.py::'
                    'test_traced_holder_is_named_with_its_tracer_and_gets_sigkill_at_once covers a real '
                    'tracer over SSH in the lab')
    tracer = subprocess.Popen(['strace', '-o', '/dev/null', 'sleep', '30'])
    kids = []
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            kids = observe.children_of(tracer.pid)
            if kids and observe.read_process(kids[0]).tracer_pid == tracer.pid:
                break
            time.sleep(0.05)
        assert kids and observe.read_process(kids[0]).tracer_pid == tracer.pid
    finally:
        for pid in kids:
            os.kill(pid, signal.SIGKILL)
        tracer.kill()
        tracer.wait()


# --- what the trust boundary reads (gpu_trust) ------------------------------------------------

# /proc/self/mountinfo of a lab node (Debian 12, systemd 252, hybrid layout), cut to its cgroups.
LAB_MOUNTINFO = """\
53 104 0:49 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:12 - tmpfs tmpfs ro,size=4096k,nr_inodes=1024,mode=755
54 53 0:36 / /sys/fs/cgroup/pids ro,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,pids
56 53 0:30 / /sys/fs/cgroup/cpu,cpuacct ro,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
62 53 0:38 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:21 - cgroup2 cgroup rw
63 53 0:37 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:22 - cgroup cgroup rw,name=systemd
70 53 0:40 /sub /mnt/elsewhere rw - cgroup2 cgroup rw
"""


def test_cgroup_mounts_of_a_hybrid_lab_node(tmp_path):
    path = tmp_path / "mountinfo"
    path.write_text(LAB_MOUNTINFO)
    assert observe.cgroup_mounts(str(path)) == {
        "": "/sys/fs/cgroup/unified", "name=systemd": "/sys/fs/cgroup/systemd",
        "pids": "/sys/fs/cgroup/pids", "cpu,cpuacct": "/sys/fs/cgroup/cpu,cpuacct"}


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to uid 1000 needs root (chown)")
def test_cgroup_dir_uids_reads_each_directory_down_the_path(tmp_path):
    # alice's delegated subtree: user@1000.service and below are hers, as on a lab node.
    root = tmp_path / "unified"
    alice = root / "user.slice" / "user-1000.slice" / "user@1000.service" / "app.slice" / "victim.service"
    alice.mkdir(parents=True)
    for path in (alice, alice.parent, alice.parent.parent):
        os.chown(str(path), 1000, 1000)
    text = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/victim.service\n1:cpu:/\n"
    got = observe.cgroup_dir_uids(text, {"": str(root)})
    path = "/user.slice/user-1000.slice/user@1000.service/app.slice/victim.service"
    assert got == {("", path): [0, 0, 0, 1000, 1000, 1000]}
    gone = observe.cgroup_dir_uids("0::/system.slice/gone.service\n", {"": str(root)})
    assert gone == {("", "/system.slice/gone.service"): [0, None, None]}
    # A path outside this cgroup namespace is never followed out of the mount.
    outside = observe.cgroup_dir_uids("0::/../../etc\n", {"": str(root)})
    assert outside == {("", "/../../etc"): [0, None, None, None]}


def test_status_uids_and_exe_owner_of_a_real_process():
    proc = observe.read_process(os.getpid())
    assert proc.uids == (os.getuid(), os.geteuid(), os.getresuid()[2], os.getuid())
    assert proc.uid == os.getuid()
    assert proc.exe_uid == os.stat(os.path.realpath("/proc/self/exe")).st_uid


def test_read_cgroup_is_what_a_description_holds():
    own = os.getpid()
    assert observe.read_cgroup(own) == observe.read_process(own).cgroup
    gone = subprocess.Popen(['true'])
    gone.wait()
    with pytest.raises(observe.ProcessGone):
        observe.read_cgroup(gone.pid)


# --- readers for the inference_service role's modules (port_owner, service_adopt) -------------------

SIGWAIT = "import signal, sys, time\n%s\nprint('ready', flush=True)\ntime.sleep(60)\n"


def test_sigterm_ignored_is_read_from_sigign_and_a_handler_or_none_is_not():
    # The ladder's SIGKILL-at-once rule, as the role's adoption applies it.
    made = []
    for code in ("signal.signal(signal.SIGTERM, signal.SIG_IGN)", "signal.signal(signal.SIGTERM, lambda *_: None)", ""):
        made.append(subprocess.Popen([sys.executable, '-c', SIGWAIT % code], stdout=subprocess.PIPE))
        assert made[-1].stdout.readline().strip() == b'ready'
    try:
        assert [observe.read_sigterm_ignored(p.pid) for p in made] == [True, False, False]
    finally:
        for proc in made:
            proc.kill()
            proc.wait()
    with pytest.raises(observe.ProcessGone):        # gone: a typed error, no claim
        observe.read_sigterm_ignored(made[0].pid)


def test_a_sigterm_handler_is_read_from_sigcgt_of_real_processes():
    # Issue 32 item 7: a namespace's init with no handler never sees SIGTERM; SigCgt says which.
    made = []
    for code in ("signal.signal(signal.SIGTERM, signal.SIG_IGN)", "signal.signal(signal.SIGTERM, lambda *_: None)", ""):
        made.append(subprocess.Popen([sys.executable, '-c', SIGWAIT % code], stdout=subprocess.PIPE))
        assert made[-1].stdout.readline().strip() == b'ready'
    try:
        seen = [observe.read_process(p.pid) for p in made]
        assert [(p.ignores_sigterm, p.handles_sigterm) for p in seen] == [(True, False), (False, True), (False, False)]
    finally:
        for proc in made:
            proc.kill()
            proc.wait()


def test_unified_cgroup_is_cgroup2_mounted_at_the_root_itself(tmp_path):
    assert observe.unified_cgroup(str(tmp_path)) is False
    (tmp_path / 'cgroup.controllers').write_text('cpu memory pids\n')
    assert observe.unified_cgroup(str(tmp_path)) is True


def test_cgroup_procs_reads_the_systemd_hierarchy_of_the_host(tmp_path):
    for hierarchy, pids in (('v2', '10\n11\n'), ('systemd', '20\n')):
        scope = tmp_path / hierarchy / 'system.slice' / 'a-1.scope'
        scope.mkdir(parents=True)
        (scope / 'cgroup.procs').write_text(pids)
    mounts = {'': str(tmp_path / 'v2'), 'name=systemd': str(tmp_path / 'systemd')}
    assert observe.cgroup_procs('/system.slice/a-1.scope', unified=True, mounts=mounts) == [10, 11]
    assert observe.cgroup_procs('/system.slice/a-1.scope', unified=False, mounts=mounts) == [20]
    assert observe.cgroup_procs('/system.slice/gone.scope', unified=True, mounts=mounts) is None
    assert observe.cgroup_procs('/system.slice/a-1.scope', unified=False, mounts={'': str(tmp_path / 'v2')}) == [10, 11]


def test_tcp_listeners_reads_listen_sockets_by_port_and_address(tmp_path):
    header = '  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n'
    (tmp_path / 'net').mkdir()
    # 127.0.0.1:30000 LISTEN (inode 111), 0.0.0.0:30000 ESTABLISHED (222), 10.0.0.5:8000 LISTEN (333)
    (tmp_path / 'net' / 'tcp').write_text(header + (
        '   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1\n'
        '   1: 00000000:7530 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 222 1\n'
        '   2: 0500000A:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 333 1\n'))
    # [::]:30000 LISTEN (444)
    (tmp_path / 'net' / 'tcp6').write_text(header + (
        '   0: 00000000000000000000000000000000:7530 00000000000000000000000000000000:0000 0A '
        '00000000:00000000 00:00000000 00000000  1000        0 444 1\n'))
    proc = str(tmp_path)
    assert observe.tcp_listeners(30000, '0.0.0.0', proc) == {'socket:[111]', 'socket:[444]'}
    assert observe.tcp_listeners(30000, '127.0.0.1', proc) == {'socket:[111]', 'socket:[444]'}
    assert observe.tcp_listeners(30000, '10.0.0.9', proc) == {'socket:[444]'}     # only the v6 wildcard
    assert observe.tcp_listeners(8000, '10.0.0.5', proc) == {'socket:[333]'}
    assert observe.tcp_listeners(8000, '10.0.0.6', proc) == set()


def test_supervisor_chains_of_siblings_read_their_parent_once(monkeypatch):
    # Holders under one parent (ranks of a launcher): with the survey's `links`, each process is
    # read once, and every chain is what it is without them.
    children = [subprocess.Popen(['sleep', '30']) for _unused in range(3)]
    try:
        alone = [observe.supervisor_chain(c.pid) for c in children]
        reads = []
        real = observe._supervisor_link   # pylint: disable=protected-access
        monkeypatch.setattr(observe, '_supervisor_link', lambda pid, proc, kind: reads.append(pid) or real(pid, proc, kind))
        links = {}
        shared = [observe.supervisor_chain(c.pid, links=links) for c in children]
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert shared == alone and all(chain[1].pid == os.getpid() for chain in shared)
    assert sorted(reads) == sorted(set(reads)) and reads.count(os.getpid()) == 1, reads


def _maps_line_by_line(raw, node_paths):
    """The reading maps_device_paths replaced, kept as the reference: every line split off."""
    found = set()
    for path in node_paths:
        needle = b' ' + path.encode()
        for line in raw.split(b'\n'):
            index = line.find(needle)
            if index >= 0:
                found.add(line[index + 1:].decode('utf-8', 'replace').strip())
    return found


def test_maps_device_paths_reads_what_a_line_by_line_reading_reads():
    import random
    rng = random.Random(19)
    shapes = (b'7f00-7f01 rw-s 00000000 00:05 %d                 /dev/nvidia%d',
              b'7f00-7f01 rw-s 00000000 00:05 %d /dev/nvidiactl%d (deleted)',
              b'7f00-7f01 r-xp 00000000 08:01 %d /usr/lib/libcuda.so.%d',
              b'7f00-7f01 rw-p 00000000 00:00 %d /tmp/a /dev/nvidia%d',      # a user's file named so
              b'%d /dev/nvidia-uvm%d')
    for _trial in range(2000):
        lines = [rng.choice(shapes) % (rng.randint(1, 999), rng.randint(0, 7)) for _unused in range(rng.randint(0, 40))]
        raw = b'\n'.join(lines) + (b'\n' if rng.random() < 0.5 else b'')
        paths = rng.choice([('/dev/nvidia',), ('/dev/nvidia', '/dev/nvidia-uvm'), ('/dev/dri',)])
        assert observe.maps_device_paths(raw, paths) == _maps_line_by_line(raw, paths)
    assert observe.maps_device_paths(b'1 /dev/nvidia3', ('/dev/nvidia',)) == {'/dev/nvidia3'}   # no newline at the end
    assert observe.maps_device_paths(b'', ('/dev/nvidia',)) == set()
