# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Observe: what the kernel (/proc) says about the processes that hold GPUs, and the shapes
the GPU backends (gpu_vendor) report the driver's view in.

Nothing here changes the host. /proc readers raise ProcessGone or AccessDenied and return
named fields. A scan skips processes that vanish mid-scan and records, not fails on, entries
it may not read. Driver calls are bounded (`bounded`): a wedged driver must produce a clear
failure, never a hung play.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import os
import pwd
import subprocess
import threading
import time

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say

_KTHREAD_FLAG = 0x00200000  # PF_KTHREAD in /proc/PID/stat field 9
FORKNOEXEC_FLAG = 0x00000040  # PF_FORKNOEXEC: forked and not (yet) exec'd; cleared by execve
_SIGTERM_BIT = 1 << (15 - 1)  # SIGTERM's bit in /proc/PID/status SigIgn and SigCgt

STATE_NAMES = {
    'R': 'running', 'S': 'sleeping', 'D': 'disk-sleep', 'Z': 'zombie', 'T': 'stopped',
    't': 'tracing-stop', 'X': 'dead', 'x': 'dead', 'K': 'wakekill', 'W': 'waking',
    'P': 'parked', 'I': 'idle',
}


class ObserveError(Exception):
    """The GPUs cannot be observed at all (no backend, the driver failed or timed out)."""


class NvmlTimeout(ObserveError):
    """A driver query did not answer within nvml_timeout."""


class ProcError(Exception):
    """A /proc entry of one process could not be read."""

    def __init__(self, pid, what, reason=''):
        Exception.__init__(self, 'PID %s: %s %s' % (pid, what, reason))
        self.pid = pid
        self.what = what
        self.reason = reason


class ProcessGone(ProcError):
    """The process exited (or was never there)."""


class AccessDenied(ProcError):
    """The process exists but this user may not read that entry."""


# Fields of /proc/PID/stat this collection uses (proc(5) numbering in the comments).
Stat = collections.namedtuple('Stat', 'comm state ppid start_time flags')
# A process's identity: a reused PID has a later start time.
Identity = collections.namedtuple('Identity', 'start_time state')
# The program a process runs: /proc/PID/exe's target and the (device, inode) of that file.
Exe = collections.namedtuple('Exe', 'path dev ino')


class GpuState(object):
    """One GPU as the driver reports it."""

    def __init__(self, index, uuid, name, pci_bus_id, minor, total_mib, used_mib, reserved_mib,
                 processes, persistence_mode=None, nodes=()):
        self.index = index
        self.uuid = uuid
        self.name = name
        self.pci_bus_id = pci_bus_id
        self.minor = minor
        self.nodes = tuple(nodes)         # this GPU's own device node paths (the backend knows them)
        self.total_mib = total_mib
        self.used_mib = used_mib          # excluding driver-reserved memory (as nvidia-smi shows)
        self.reserved_mib = reserved_mib
        self.processes = processes        # list of (pid, mib or None), compute + graphics + MPS
        self.persistence_mode = persistence_mode


# One GPU's health as its driver answers it (issue 30 item 6); gpu_health judges it. A value
# is None where that read gave no answer, and `unread` maps the read's name (HEALTH_READS) to
# (code, text): UNSUPPORTED (the GPU has no such counter: retired pages on Ampere and later),
# READ_FAILED, READ_HUNG (no answer within the bound), READ_SKIPPED (an earlier read hung).
# `remapped_rows` is (correctable, uncorrectable, pending, failed) as NVML counts them;
# `took_ms` maps each read to its time.
GpuHealth = collections.namedtuple(
    'GpuHealth', 'index lost remapped_rows ecc_volatile_uncorrected retired_pages_pending '
                 'recovery_action unread took_ms')
HEALTH_READS = ('driver', 'remapped_rows', 'ecc_volatile_uncorrected', 'retired_pages_pending',
                'recovery_action')
XID_READ = 'xid'
UNSUPPORTED = 'not_supported'
READ_FAILED = 'failed'
READ_HUNG = 'hung'
READ_SKIPPED = 'skipped'
# One Xid the kernel log holds: when (epoch seconds), the GPU's PCI address as (domain, bus,
# device), the Xid number and the rest of the driver's line.
XidEvent = collections.namedtuple('XidEvent', 'at pci xid text')


def pci_address(bus_id):
    """(domain, bus, device) of a PCI bus id such as 00000000:18:00.0, or None."""
    try:
        domain, bus, rest = bus_id.split(':')
        return (int(domain, 16), int(bus, 16), int(rest.split('.')[0], 16))
    except (AttributeError, ValueError):
        return None


def skipped_health(index, why):
    """The record of a GPU whose reads were not made (`why`: an earlier read hung)."""
    return GpuHealth(index, None, None, None, None, None,
                     dict((read, (READ_SKIPPED, why)) for read in HEALTH_READS), {})


def take_health(backend, indices, timeout, xid_since=None, xid_log=None):
    """The health of GPUs `indices` through `backend` (read_health, read_xids), each read
    bounded by `timeout`. Once one read hangs, the others are not made (a hung driver would
    make each wait its whole bound), so the whole costs one bound at most per source.
    Returns ({index: GpuHealth}, [XidEvent] or None, (code, text) or None: why the Xids were
    not read)."""
    records = {}
    hung = None
    backend.hold_session()
    try:
        for index in indices:
            if hung is not None:
                records[index] = skipped_health(index, hung)
                continue
            records[index] = record = backend.read_health(index, timeout)
            hung = next((text for code, text in record.unread.values() if code == READ_HUNG), None)
    finally:
        if hung is None:
            backend.end_session(timeout)
    xids, unread = None, None
    started = time.time()
    try:
        xids = backend.read_xids(xid_since, timeout, xid_log)
    except NvmlTimeout as exc:
        unread = (READ_HUNG, str(exc))
    except ObserveError as exc:
        unread = (READ_FAILED, str(exc))
    took = round((time.time() - started) * 1000.0, 3)
    for record in records.values():
        record.took_ms[XID_READ] = took     # one read of the log for every GPU
    return records, xids, unread


class ProcState(object):
    """One process as /proc reports it, with what it holds under the device directory."""

    __slots__ = ('pid', 'start_time', 'name', 'cmdline', 'uid', 'user', 'state', 'ppid', 'wchan',
                 'cgroup', 'pidns', 'nspid', 'kthread', 'ignores_sigterm', 'tracer_pid', 'dev_fds',
                 'dev_maps', 'unreadable', 'uids', 'exe_uid', 'cgroup_uids', 'handles_sigterm')

    def __init__(self, pid):
        self.pid = pid
        self.start_time = None
        self.name = ''
        self.cmdline = ''
        self.uid = None
        self.user = None
        self.state = 'unknown'
        self.ppid = None
        self.wchan = None
        self.cgroup = ''
        self.pidns = None
        self.nspid = None
        self.kthread = False
        self.ignores_sigterm = False
        self.handles_sigterm = False    # SigCgt holds SIGTERM: a handler of its own (issue 32 item 7)
        self.tracer_pid = None
        self.dev_fds = set()
        self.dev_maps = set()
        self.unreadable = []
        self.uids = None         # (real, effective, saved, filesystem) from status
        self.exe_uid = None      # owner of the file /proc/PID/exe points to; None unreadable
        # (hierarchy, cgroup path) -> owner uid of the hierarchy's root directory and of each
        # directory down the path (None where unreadable): cgroup_dir_uids
        self.cgroup_uids = None


class Snapshot(object):
    """Everything one scan saw, taken as close together in time as possible."""

    def __init__(self, gpus, procs, backend, own_pid, own_pidns, unreadable, nvml_missing_pids,
                 taken_at, infrastructure=(), related_names=None, scan='full', deep=False):
        self.gpus = gpus                      # list of GpuState, all GPUs of the host
        self.procs = procs                    # pid -> ProcState for every process that matters
        self.backend = backend
        self.own_pid = own_pid
        self.own_pidns = own_pidns
        self.unreadable = unreadable          # list of (pid, what, reason)
        self.nvml_missing_pids = nvml_missing_pids  # NVML-listed PIDs with no /proc entry here
        self.taken_at = taken_at
        self.infrastructure = tuple(infrastructure)  # the backend's daemon names: never signalled
        # pid -> name of the parents and tracers of `procs` that are not in `procs` themselves
        self.related_names = related_names or {}
        # 'full': every process was read; 'listed': only the processes the driver lists
        self.scan = scan
        self.deep = deep                      # every process's maps were read too


def bounded(fn, timeout, timeout_message):
    """Run fn() in a worker thread; after `timeout` seconds raise NvmlTimeout(timeout_message).

    A ctypes call into a hung driver cannot be interrupted; a daemon thread lets the module
    report the hang and exit while the call stays stuck.
    """
    box = {}

    def target():
        try:
            box['value'] = fn()
        except BaseException as exc:  # pylint: disable=broad-except
            box['error'] = exc

    worker = threading.Thread(target=target, name='driver-call')
    worker.daemon = True
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise NvmlTimeout(timeout_message)
    if 'error' in box:
        raise box['error']
    return box.get('value')


def which(program):
    for folder in os.environ.get('PATH', '/usr/bin:/bin').split(os.pathsep):
        candidate = os.path.join(folder, program)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


# ---------------------------------------------------------------------------------------------
# /proc
# ---------------------------------------------------------------------------------------------

def _read(path):
    with open(path, 'rb') as handle:
        return handle.read()


def _proc_error(exc, pid, what):
    """The typed error for an OSError reading /proc/PID/<what>."""
    if isinstance(exc, (FileNotFoundError, ProcessLookupError)):
        return ProcessGone(pid, what)
    if isinstance(exc, PermissionError):
        return AccessDenied(pid, what, str(exc))
    return ProcError(pid, what, str(exc))


def _read_entry(base, pid, what):
    try:
        return _read('%s/%s' % (base, what))
    except OSError as exc:
        raise _proc_error(exc, pid, what)


def parse_stat(raw):
    """Stat(comm, state name, ppid, start_time in ticks, flags) from /proc/PID/stat text,
    robust to odd names.

    A zombie whose other threads still run (its main thread called exit(2) alone) is
    'zombie-leader', not 'zombie': it still holds what the threads hold, nobody can reap it,
    and a signal to its PID still reaches the whole thread group.
    """
    text = raw.decode('utf-8', 'replace')
    open_paren, close_paren = text.index('('), text.rindex(')')
    comm = text[open_paren + 1:close_paren]
    fields = text[close_paren + 2:].split()
    # fields[0] is field 3 (state); field N is fields[N - 3]
    state, threads = fields[0], int(fields[17])
    name = 'zombie-leader' if state == 'Z' and threads > 1 else STATE_NAMES.get(state, state)
    return Stat(comm, name, int(fields[1]), int(fields[19]), int(fields[6]))


def read_stat(pid, proc='/proc'):
    """Stat of one process; raises ProcessGone (also for a stat that vanished mid-read)."""
    raw = _read_entry('%s/%d' % (proc, pid), pid, 'stat')
    try:
        return parse_stat(raw)
    except (ValueError, IndexError):
        raise ProcessGone(pid, 'stat', 'empty or cut short: the process exited while read')


def read_identity(pid, proc='/proc'):
    """Identity(start time in clock ticks since boot, state name); raises ProcessGone.

    PID plus start time is a process's identity: a reused PID has a later start time.
    """
    stat = read_stat(pid, proc)
    return Identity(stat.start_time, stat.state)


def _pids(proc):
    try:
        names = os.listdir(proc)
    except OSError as exc:
        raise ObserveError('cannot list %s: %s' % (proc, exc))
    return [int(name) for name in names if name.isdigit()]


def _device_fds(base, pid, node_paths):
    """Paths of device nodes (starting with one of `node_paths`) that the process at `base`
    (/proc/PID or /proc/PID/task/TID) has open; raises ProcessGone or AccessDenied.

    readlinkat() relative to an open /proc/PID/fd directory skips re-resolving the
    /proc/PID/fd prefix for every descriptor, which is where a naive scan spends its time.
    """
    try:
        dir_fd = os.open(base + '/fd', os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise _proc_error(exc, pid, 'fd')
    found = set()
    try:
        for name in os.listdir(dir_fd):
            try:
                target = os.readlink(name, dir_fd=dir_fd)
            except OSError:
                continue  # closed between listdir and readlink
            if target.startswith(node_paths):
                found.add(target)
    except OSError as exc:
        raise _proc_error(exc, pid, 'fd')
    finally:
        os.close(dir_fd)
    return found


def _device_maps(base, pid, node_paths):
    """Paths of device nodes the process at `base` maps; raises ProcessGone or AccessDenied."""
    return maps_device_paths(_read_entry(base, pid, 'maps'), node_paths)


def maps_device_paths(raw, node_paths):
    """Paths of device nodes (starting with one of `node_paths`) in /proc/PID/maps text `raw`:
    from each line's first ' PATH' on. Jumps from one occurrence to the next, a line at a time,
    never splitting the text: a CUDA rank maps about 1,000 lines of which a few dozen are device
    nodes (tests/gpu s12's profile, run21: splitting every line was a third of a survey's /proc
    time on 8 ranks)."""
    found = set()
    for path in node_paths:
        needle = b' ' + path.encode()
        index = raw.find(needle)
        while index >= 0:
            end = raw.find(b'\n', index)
            if end < 0:
                end = len(raw)
            found.add(raw[index + 1:end].decode('utf-8', 'replace').strip())
            index = raw.find(needle, end)
    return found


def _status_fields(raw):
    """(uids, nspid, ignores_sigterm, tracer_pid or None, handles_sigterm) from /proc/PID/status
    text; uids are (real, effective, saved, filesystem)."""
    uids = nspid = tracer = None
    ignores_sigterm = handles_sigterm = False
    for line in raw.decode('utf-8', 'replace').splitlines():
        if line.startswith('Uid:'):
            uids = tuple(int(x) for x in line.split()[1:5])
        elif line.startswith('NSpid:'):
            nspid = [int(x) for x in line.split()[1:]]
        elif line.startswith('SigIgn:'):
            ignores_sigterm = bool(int(line.split()[1], 16) & _SIGTERM_BIT)
        elif line.startswith('SigCgt:'):
            handles_sigterm = bool(int(line.split()[1], 16) & _SIGTERM_BIT)
        elif line.startswith('TracerPid:'):
            tracer = int(line.split()[1]) or None
    return uids, nspid, ignores_sigterm, tracer, handles_sigterm


def _fill_details(info, proc):
    """Identity, state and ownership of one process; raises ProcessGone when it vanished.

    Entries other than stat that cannot be read are listed in info.unreadable.
    """
    pid = info.pid
    base = '%s/%d' % (proc, pid)
    stat = read_stat(pid, proc)
    info.name, info.ppid, info.start_time, info.state = stat.comm, stat.ppid, stat.start_time, stat.state
    info.kthread = bool(stat.flags & _KTHREAD_FLAG)

    def optional(what, parse):
        try:
            return parse(_read_entry(base, pid, what))
        except ProcessGone:
            raise
        except (ProcError, ValueError):
            info.unreadable.append(what)
            return None

    cmdline = optional('cmdline', lambda raw: raw.replace(b'\0', b' ').decode('utf-8', 'replace').strip())
    info.cmdline = cmdline or ''
    status = optional('status', _status_fields)
    if status:
        info.uids, info.nspid, info.ignores_sigterm, info.tracer_pid, info.handles_sigterm = status
        info.uid = info.uids[0] if info.uids else None
    try:
        # stat follows the link to the executable itself: who owns the file that runs.
        info.exe_uid = os.stat(base + '/exe').st_uid
    except OSError:
        info.exe_uid = None     # a kernel thread, gone, or not ours to read: never root's
    if info.uid is not None:
        try:
            info.user = pwd.getpwuid(info.uid).pw_name
        except KeyError:
            info.user = str(info.uid)
    info.cgroup = optional('cgroup', lambda raw: raw.decode('utf-8', 'replace')) or ''
    info.cgroup_uids = cgroup_dir_uids(info.cgroup)
    try:
        info.pidns = os.readlink(base + '/ns/pid')
    except OSError:
        info.unreadable.append('ns/pid')
    if stat.state == 'disk-sleep':
        info.wchan = optional('wchan', lambda raw: raw.decode('utf-8', 'replace').strip() or None)


def cgroup_mounts(mountinfo='/proc/self/mountinfo'):
    """Hierarchy -> where this process sees it mounted: '' for cgroup v2, 'name=systemd', and
    each v1 controller set ('cpu,cpuacct'), as /proc/PID/cgroup names them. Only mounts of a
    hierarchy's root ('/'): a path of /proc/PID/cgroup is relative to that root."""
    mounts = {}
    try:
        lines = _read(mountinfo).decode('utf-8', 'replace').splitlines()
    except OSError:
        return mounts
    for line in lines:
        fields = line.split()
        if ' - ' not in line or len(fields) < 5 or fields[3] != '/':
            continue
        after = line.split(' - ', 1)[1].split()
        if len(after) < 3 or after[0] not in ('cgroup', 'cgroup2'):
            continue
        point = fields[4].replace('\\040', ' ')
        if after[0] == 'cgroup2':
            mounts.setdefault('', point)
            continue
        options = after[2].split(',')
        named = [o for o in options if o.startswith('name=')]
        known = ('cpu', 'cpuacct', 'cpuset', 'memory', 'devices', 'freezer', 'net_cls', 'blkio',
                 'perf_event', 'net_prio', 'hugetlb', 'pids', 'rdma', 'misc')
        controllers = [o for o in options if o in known]
        key = named[0] if named else ','.join(controllers)
        if key:
            mounts.setdefault(key, point)
    return mounts


_MOUNTS = {}


def cgroup_dir_uids(text, mounts=None):
    """(hierarchy, path) -> [owner uid of the hierarchy's root directory, then of each
    directory down the path] for each line of a /proc/PID/cgroup text whose hierarchy is
    mounted here; None for a directory that could not be read (gone, outside this cgroup
    namespace). gpu_owner.named_by_root decides from it who named each cgroup."""
    if mounts is None:
        if 'mounts' not in _MOUNTS:
            _MOUNTS['mounts'] = cgroup_mounts()
        mounts = _MOUNTS['mounts']
    found = {}
    for hierarchy, path in gpu_owner.cgroup_entries(text):
        point = mounts.get(hierarchy)
        if point is None:
            continue
        uids, current = [], point
        parts = gpu_owner.path_parts(path)
        for part in [None] + parts:
            if part in ('.', '..'):
                uids.append(None)
                break
            if part is not None:
                current = os.path.join(current, part)
            try:
                uids.append(os.lstat(current).st_uid)
            except OSError:
                uids.append(None)
                break
        uids += [None] * (len(parts) + 1 - len(uids))
        found[(hierarchy, path)] = uids
    return found


def scan_processes(node_paths, proc='/proc', deep=False, extra_pids=(), only_extra=False):
    """Every process that has a device node starting with one of `node_paths` open or mapped.

    Maps are read for processes with device fds and for `extra_pids` (the ones the driver
    lists); with `deep`, for every process, which also finds a process that closed its fds but
    kept its mappings. With `only_extra`, only `extra_pids` are read (the cheap scan: no other
    process is looked at). Processes that exit mid-scan are skipped. Returns (procs,
    unreadable), unreadable a list of (pid, what, reason).
    """
    node_paths = tuple(node_paths)
    procs, unreadable = {}, []
    extra = set(extra_pids)
    for pid in (sorted(p for p in extra if p > 0) if only_extra else _pids(proc)):
        base = '%s/%d' % (proc, pid)
        try:
            fds, maps = _devices(base, pid, node_paths, deep or pid in extra, unreadable)
            if not fds and not maps and pid not in extra:
                continue
            info = ProcState(pid)
            info.dev_fds, info.dev_maps = fds, maps
            _fill_details(info, proc)
            if info.state == 'zombie-leader' and not fds and not maps:
                info.dev_fds, info.dev_maps = _thread_devices(base, pid, node_paths)
        except ProcessGone:
            continue
        procs[pid] = info
    return procs, unreadable


def _devices(base, pid, node_paths, read_maps, unreadable):
    """(fds, maps) of one process; an entry it may not read is recorded and counts as empty."""
    def read(reader, what):
        try:
            return reader(base, pid, node_paths)
        except ProcessGone:
            raise
        except ProcError as exc:
            unreadable.append((pid, what, exc.reason))
            return set()

    fds = read(_device_fds, 'fd')
    if not fds and not read_maps:
        return fds, set()
    return fds, read(_device_maps, 'maps')


def _thread_devices(base, pid, node_paths):
    """A zombie leader's own fd table is gone: read its live threads' view instead."""
    try:
        tids = [t for t in os.listdir(base + '/task') if t != str(pid)]
    except OSError:
        return set(), set()
    for tid in tids:
        task = '%s/task/%s' % (base, tid)
        try:
            return _device_fds(task, pid, node_paths), _device_maps(task, pid, node_paths)
        except ProcError:
            continue
    return set(), set()


def read_process(pid, proc='/proc'):
    """Details of one process that holds nothing (an ancestor, a zombie's parent); raises
    ProcessGone."""
    info = ProcState(pid)
    _fill_details(info, proc)
    return info


def read_cgroup(pid, proc='/proc'):
    """/proc/PID/cgroup text of one process ('' when this user may not read it); raises
    ProcessGone. All that the module's own ancestors are read for (gpu_survey.Surveyor's
    protected units and containers): describing each fully (7 reads, a passwd look-up, the
    cgroup directories' owners) took 0.24 ms a process on an H200 host (tests/gpu s12 run9's
    profile: 8 ranks in 1.95 ms), twice per ancestor per run, before the first signal."""
    try:
        return _read_entry('%s/%d' % (proc, pid), pid, 'cgroup').decode('utf-8', 'replace')
    except ProcessGone:
        raise
    except ProcError:
        return ''


def read_sigterm_ignored(pid, proc='/proc'):
    """Whether the SigIgn mask of /proc/PID/status holds SIGTERM now; raises ProcessGone or
    AccessDenied. A handler is SigCgt, not SigIgn: such a process gets its grace."""
    raw = _read_entry('%s/%d' % (proc, pid), pid, 'status')
    return _status_fields(raw)[2]


def unified_cgroup(root='/sys/fs/cgroup'):
    """systemd runs the unified hierarchy: cgroup2 is mounted at /sys/fs/cgroup itself (its
    cgroup.controllers is there). gpu_owner.systemd_path picks a process's path with it."""
    return os.path.exists(os.path.join(root, 'cgroup.controllers'))


# The addresses that clash with any other on the same port (a wildcard bind).
_WILDCARDS = ('0.0.0.0', '::', '')


def _tcp_address(hexaddr):
    """The local address of a /proc/net/tcp{,6} line: dotted IPv4 (kept as little-endian hex
    there), '::' for the v6 wildcard, else 'v6:HEX' (compared only with wildcards)."""
    if len(hexaddr) == 8:
        return '.'.join(str(int(hexaddr[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return '::' if set(hexaddr) == set('0') else 'v6:' + hexaddr


def tcp_listeners(port, host, proc='/proc'):
    """The inodes ('socket:[N]', as /proc/PID/fd links name them) of the LISTEN sockets on
    `port` that clash with binding `host`: a listener clashes unless both sides name different
    specific addresses. From /proc/net/tcp and tcp6 of this network namespace (no ss or lsof
    needed); a table that cannot be read counts as empty."""
    inodes = set()
    for table in ('net/tcp', 'net/tcp6'):
        try:
            lines = _read('%s/%s' % (proc, table)).decode('ascii', 'replace').splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != '0A':   # 0A: TCP_LISTEN
                continue
            addr, _sep, lport = fields[1].rpartition(':')
            try:
                if int(lport, 16) != port:
                    continue
            except ValueError:
                continue
            local = _tcp_address(addr)
            if host in _WILDCARDS or local in _WILDCARDS or local == host:
                inodes.add('socket:[%s]' % fields[9])
    return inodes


def cgroup_procs(group, unified=None, mounts=None):
    """PIDs the kernel lists in cgroup `group` (a unit's ControlGroup) of the hierarchy systemd
    keeps processes in (v2 on a unified host, else name=systemd); None when that directory
    cannot be read. Exited processes are no longer listed (they leave their cgroup at exit)."""
    mounts = cgroup_mounts() if mounts is None else mounts
    unified = unified_cgroup() if unified is None else unified
    order = ('', 'name=systemd') if unified else ('name=systemd', '')
    for hierarchy in order:
        point = mounts.get(hierarchy)
        if point is None or not group:
            continue
        try:
            raw = _read(os.path.join(point, group.lstrip('/'), 'cgroup.procs'))
        except OSError:
            return None
        return sorted(int(word) for word in raw.split())
    return None


def ancestors(pid, proc='/proc'):
    """PIDs from `pid` up to PID 1: the module itself, the shell and SSH session that run it."""
    chain = []
    seen = set()
    while pid and pid not in seen:
        seen.add(pid)
        chain.append(pid)
        try:
            pid = read_stat(pid, proc).ppid
        except ProcError:
            break
    return chain


_UNIT_PROPERTIES = ['-p', 'Restart', '-p', 'ActiveState', '-p', 'ControlGroup', '-p', 'MainPID']
# What a manager says of a unit (systemctl show): Restart=, ActiveState, ControlGroup and MainPID
# (None where not given; issue 32 item 4: a named record, not positions).
UnitFacts = collections.namedtuple('UnitFacts', 'restart active control_group main_pid')
UnitFacts.__new__.__defaults__ = (None, None, None, None)
NO_UNIT = UnitFacts()


def _unit_facts(argv, timeout, **as_user):
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                             check=False, universal_newlines=True, **as_user)
    except (OSError, subprocess.SubprocessError):
        return NO_UNIT
    values = dict(line.split('=', 1) for line in out.stdout.splitlines() if '=' in line)
    main = values.get('MainPID', '')
    return UnitFacts(values.get('Restart'), values.get('ActiveState'), values.get('ControlGroup') or None,
                     int(main) if main.isdigit() and int(main) > 0 else None)


def unit_restart_policy(unit, timeout=10):
    """UnitFacts (Restart=, ActiveState, ControlGroup, MainPID or None) of a system unit, or Nones where
    systemd is not running. A name systemd's grammar refuses (a glob) is never passed to
    systemctl."""
    if not gpu_owner.valid_unit_name(unit) or not os.path.isdir('/run/systemd/system') \
            or not which('systemctl'):
        return NO_UNIT
    return _unit_facts(['systemctl', 'show'] + _UNIT_PROPERTIES + ['--', unit], timeout)


def user_manager_call(uid):
    """How to reach user `uid`'s own systemd manager: (environment, subprocess keywords that
    run the command as that user), or None when her manager does not run.

    systemctl runs as the user and talks to her manager's private socket
    ($XDG_RUNTIME_DIR/systemd/private): it may then do only what she may. `systemctl --user
    -M USER@` needs her D-Bus session bus (dbus-user-session), which a Debian 12 lab node
    lacks ("Transport endpoint is not connected", measured); the private socket needs nothing.
    """
    try:
        entry = pwd.getpwuid(uid)
    except (KeyError, TypeError, OverflowError):
        return None
    runtime = '/run/user/%d' % uid
    if not os.path.exists(runtime + '/systemd/private') or not which('systemctl'):
        return None
    env = {'XDG_RUNTIME_DIR': runtime, 'PATH': os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin'),
           'LANG': 'C'}
    return env, {'user': entry.pw_uid, 'group': entry.pw_gid, 'extra_groups': [], 'env': env,
                 'cwd': '/'}


def user_unit_facts(uid, unit, timeout=10):
    """UnitFacts (Restart=, ActiveState, ControlGroup, MainPID) of a unit of user `uid`'s own manager,
    asked as that user; Nones when her manager does not run or the name fails systemd's grammar."""
    call = user_manager_call(uid) if gpu_owner.valid_unit_name(unit) and uid else None
    if call is None:
        return NO_UNIT
    return _unit_facts(['systemctl', '--user', 'show'] + _UNIT_PROPERTIES + ['--', unit], timeout,
                       **call[1])


def unit_state(argv, timeout, keywords=None):
    """(rc, output) of `systemctl is-active` (gpu_lever.unit_argv's 'is_active'), bounded: rc
    124 when it timed out, 127 when it could not start. `keywords` run it as a user
    (user_manager_call's)."""
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                             check=False, universal_newlines=True, **(keywords or {}))
    except subprocess.TimeoutExpired:
        return 124, say.cli_unfinished(argv, timeout)
    except OSError as exc:
        return 127, str(exc)
    return out.returncode, out.stdout.strip()


def runtime_details(owner, timeout=10):
    """What a container's, pod's or guest's runtime says about it (gpu_owner.parse_inspect):
    its readable name, restart policy, pod. Only `cli_error` ({'code': gpu_owner.CLI_MISSING,
    CLI_TIMEOUT or CLI_FAILED, 'text'}) when the runtime's CLI is not on this host, fails or
    does not answer within `timeout` seconds: the owner is then named by its id; empty for a
    runtime this module has no CLI for."""
    row = gpu_lever.RUNTIMES.get(owner.runtime) or {}
    argv = gpu_lever.runtime_argv(owner.runtime, 'inspect', owner) if owner.id else None
    if not argv or not row.get('cli'):
        return {}
    if not which(row['cli']):
        return {'cli_error': {'code': gpu_owner.CLI_MISSING, 'text': say.cli_not_on_path(row['cli'])}}
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                             check=False, universal_newlines=True)
    except subprocess.TimeoutExpired:
        return {'cli_error': {'code': gpu_owner.CLI_TIMEOUT, 'text': say.cli_no_answer(argv, timeout)}}
    except OSError as exc:
        return {'cli_error': {'code': gpu_owner.CLI_MISSING, 'text': say.cli_not_started(argv, exc)}}
    if out.returncode != 0:
        return {'cli_error': {'code': gpu_owner.CLI_FAILED, 'text': say.cli_failed(
            argv, 'rc=%d' % out.returncode, (out.stderr or out.stdout).strip())}}
    details = gpu_owner.parse_inspect(row['parse'], out.stdout)
    # The runtime's word that this id is the holder's: the cgroup of the init PID it gives
    # (gpu_trust.confirm compares its container id with the holder's).
    pid = details.get('pid')
    if isinstance(pid, int) and pid > 1:
        try:
            details['init_cgroup'] = _read_entry('/proc/%d' % pid, pid, 'cgroup').decode('utf-8', 'replace')
        except ProcError:
            pass
    return details


def take_snapshot(backend, nvml_timeout, proc='/proc', deep=False, listed_only=False, deep_when=None):
    """One observation of the GPUs (through `backend`, a gpu_backend.GpuBackend) and of every
    process that holds them; with `listed_only`, of the processes the driver lists only
    (gpu_decide.full_scan_code says when that is enough). `deep_when(gpus)`, asked once the
    driver has answered, makes the scan deep from the start (one pass over /proc) when the
    driver's numbers already show memory that no listed process is charged with."""
    started = time.time()
    gpus = backend.read_gpus(nvml_timeout)
    if not deep and not listed_only and deep_when is not None:
        deep = bool(deep_when(gpus))
    nvml_pids = set(entry[0] for gpu in gpus for entry in gpu.processes)
    procs, unreadable = scan_processes(backend.node_paths(), proc=proc, deep=deep, extra_pids=nvml_pids,
                                       only_extra=listed_only and not deep)
    # Driver-listed PIDs that the scan could not read are either gone, impossible, or outside
    # this PID namespace; a PID of 0 or above pid_max can never resolve.
    missing = sorted(pid for pid in nvml_pids if pid not in procs)
    try:
        own_pidns = os.readlink('%s/self/ns/pid' % proc)
    except OSError:
        own_pidns = None
    return Snapshot(gpus=gpus, procs=procs, backend=backend.name, own_pid=os.getpid(),
                    own_pidns=own_pidns, unreadable=unreadable, nvml_missing_pids=missing,
                    taken_at=started, infrastructure=backend.infrastructure,
                    related_names=_related_names(procs, proc),
                    scan='listed' if listed_only and not deep else 'full', deep=deep)


def _related_names(procs, proc):
    """Names of the scanned processes' parents (a zombie's reaper) and tracers that the scan
    did not keep."""
    names = {}
    for info in procs.values():
        for pid in (info.ppid, info.tracer_pid):
            if pid and pid not in procs and pid not in names:
                try:
                    names[pid] = read_stat(pid, proc).comm
                except ProcError:
                    names[pid] = None
    return names


def read_exe(pid, proc='/proc'):
    """Exe(path, dev, ino) of the program the process runs; raises ProcessGone (also for a
    zombie or a kernel thread, which run none) or AccessDenied (another user's process, without
    root). The path of a program replaced on disk since ends in ' (deleted)'; its (dev, ino)
    still name the file the process runs."""
    link = '%s/%d/exe' % (proc, pid)
    try:
        path = os.readlink(link)
        info = os.stat(link)
    except OSError as exc:
        raise _proc_error(exc, pid, 'exe')
    return Exe(path, info.st_dev, info.st_ino)


def descendants_of(pid, proc='/proc', limit=4096):
    """{descendant PID: its parent PID} for every live descendant of `pid`, parents before
    their children, at most `limit` of them; empty when `pid` is gone."""
    found = {}
    queue = [pid]
    while queue and len(found) < limit:
        parent = queue.pop(0)
        try:
            children = children_of(parent, proc)
        except ProcError:
            continue
        for child in children:
            if child not in found and child != pid:
                found[child] = parent
                queue.append(child)
    return found


def children_of(pid, proc='/proc'):
    """PIDs of the children of `pid` (every thread's), from /proc/PID/task/TID/children;
    raises ProcessGone. Where the kernel lacks that file, a scan of every process's stat."""
    base = '%s/%d/task' % (proc, pid)
    try:
        tids = os.listdir(base)
    except OSError as exc:
        raise _proc_error(exc, pid, 'task')
    if tids and not os.path.exists('%s/%s/children' % (base, tids[0])):
        return _children_by_scan(pid, proc)
    children = set()
    for tid in tids:
        try:
            children.update(int(c) for c in _read('%s/%s/children' % (base, tid)).split())
        except FileNotFoundError:
            continue  # that thread exited
        except OSError as exc:
            raise _proc_error(exc, pid, 'task/children')
    read_stat(pid, proc)  # still there (a zombie's threads are gone too)
    return sorted(children)


def _children_by_scan(pid, proc):
    found = []
    for other in _pids(proc):
        try:
            if read_stat(other, proc).ppid == pid:
                found.append(other)
        except ProcError:
            continue
    return found


# ---------------------------------------------------------------------------------------------
# Supervisors (gpu_supervisor): the facts its rows match, and their status commands
# ---------------------------------------------------------------------------------------------

def _safe_dir(path):
    """True when `path` is a directory owned by root and not group- or world-writable."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    return info.st_uid == 0 and not info.st_mode & 0o022 and os.path.isdir(path)


def _pm2_home(base, uid):
    """($PM2_HOME of a process, whether its pm2.pid names the process): pm2 writes its God
    Daemon's PID there. Read only for a process whose home is known."""
    try:
        env = dict(item.split(b'=', 1) for item in _read(base + '/environ').split(b'\0') if b'=' in item)
    except OSError:
        return None, False
    home = env.get(b'PM2_HOME') or (env.get(b'HOME', b'').rstrip(b'/') + b'/.pm2' if env.get(b'HOME') else None)
    if not home:
        return None, False
    home = home.decode('utf-8', 'replace')
    try:
        info = os.stat(home + '/pm2.pid')
        text = _read(home + '/pm2.pid').decode('ascii', 'replace').strip()
    except OSError:
        return home, False
    return home, info.st_uid == uid and text == base.rsplit('/', 1)[1]


def supervisor_chain(pid, proc='/proc', depth=None, links=None):
    """gpu_supervisor.Links of `pid` and its ancestors, nearest first, at most
    gpu_supervisor.MAX_DEPTH above it, ending at PID 1 or a process that cannot be read. argv
    is read for root processes only; pm2's pid file only for a `node`. The walk ends at the first
    ancestor in another cgroup than `pid`'s (a supervisor's programs share its unit's). `links`
    (a dict the caller keeps for one survey) keeps each process's Link, so holders that share
    ancestors read each once."""
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_supervisor
    depth = gpu_supervisor.MAX_DEPTH if depth is None else depth
    links = {} if links is None else links
    chain = []
    while pid and pid > 1 and len(chain) <= depth:
        if pid not in links:
            links[pid] = _supervisor_link(pid, proc, gpu_supervisor.Link)
        if links[pid] is None:
            break
        chain.append(links[pid])
        pid = links[pid].ppid
        if chain[-1].cgroup != chain[0].cgroup:
            break
    return chain


def _supervisor_link(pid, proc, link_type):
    """One process as supervisor_chain needs it (a gpu_supervisor.Link), or None when it cannot
    be read."""
    base = '%s/%d' % (proc, pid)
    try:
        info = read_process(pid, proc)
        exe = os.readlink(base + '/exe')
    except (ProcError, OSError):
        return None
    argv = cwd = home = None
    cwd_root = pm2 = False
    if info.uids and all(uid == 0 for uid in info.uids):
        try:
            argv = [a.decode('utf-8', 'replace') for a in _read(base + '/cmdline').split(b'\0')[:-1]]
        except OSError:
            argv = None
    try:
        cwd = os.readlink(base + '/cwd')
        cwd_root = _safe_dir(cwd) and _safe_dir(os.path.join(cwd, 'supervise'))
    except OSError:
        cwd = None
    if os.path.basename(exe) in ('node', 'nodejs') and info.uid is not None:
        home, pm2 = _pm2_home(base, info.uid)
    return link_type(pid, info.start_time, info.ppid, exe, info.exe_uid, info.uids, info.cgroup, argv, cwd,
                     cwd_root, pm2, home)


def as_user(uid, home=None):
    """subprocess keywords that run a user's supervisor CLI (pm2) as user `uid`, with her home
    (PM2_HOME `home`, else ~/.pm2); None when no such user."""
    try:
        entry = pwd.getpwuid(uid)
    except (KeyError, TypeError, OverflowError):
        return None
    return {'user': entry.pw_uid, 'group': entry.pw_gid, 'extra_groups': [], 'cwd': '/',
            'env': {'HOME': entry.pw_dir, 'PM2_HOME': home or entry.pw_dir + '/.pm2',
                    'PATH': os.environ.get('PATH', '/usr/bin:/bin')}}


def supervisor_status(argv, timeout, uid=None, home=None):
    """(code, output) of a supervisor's status command, bounded: code 'ok', 'rc=N' (it exited N:
    `supervisorctl status` exits 3 when a program is not running, so the output decides), or
    gpu_owner's CLI_MISSING, CLI_TIMEOUT with what went wrong. Run as user `uid` (with PM2_HOME
    `home`) when given: pm2's daemon is that user's."""
    if not which(argv[0]):
        return gpu_owner.CLI_MISSING, say.cli_not_on_path(argv[0])
    keywords = {}
    if uid:
        keywords = as_user(uid, home)
        if keywords is None:
            return gpu_owner.CLI_FAILED, say.cli_no_user(uid)
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                             check=False, universal_newlines=True, **keywords)
    except subprocess.TimeoutExpired:
        return gpu_owner.CLI_TIMEOUT, say.cli_no_answer(argv, timeout)
    except OSError as exc:
        return gpu_owner.CLI_MISSING, say.cli_not_started(argv, exc)
    return ('ok' if out.returncode == 0 else 'rc=%d' % out.returncode), out.stdout.strip()
