# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Observe: what the driver (NVML) and the kernel (/proc) say about GPUs and their holders.

Nothing here changes the host. Every NVML call is bounded by a timeout, because a wedged
driver must produce a clear failure, never a hung play. Processes that vanish mid-scan are
skipped; /proc entries that cannot be read are recorded, not fatal.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import pwd
import subprocess
import threading
import time

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner

try:
    import pynvml
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except ImportError as exc:  # the caller reports it with missing_required_lib
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = exc

MIB = 1024 * 1024
# NVML reports "not available" per-process memory with this sentinel (e.g. under WDDM or MIG).
NVML_VALUE_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
_KTHREAD_FLAG = 0x00200000  # PF_KTHREAD in /proc/PID/stat field 9
_SIGTERM_BIT = 1 << (15 - 1)  # SIGTERM's bit in /proc/PID/status SigIgn

STATE_NAMES = {
    'R': 'running', 'S': 'sleeping', 'D': 'disk-sleep', 'Z': 'zombie', 'T': 'stopped',
    't': 'tracing-stop', 'X': 'dead', 'x': 'dead', 'K': 'wakekill', 'W': 'waking',
    'P': 'parked', 'I': 'idle',
}


class ObserveError(Exception):
    """The GPUs cannot be observed at all (no backend, NVML failed or timed out)."""


class NvmlTimeout(ObserveError):
    pass


class GpuState(object):
    """One GPU as the driver reports it."""

    def __init__(self, index, uuid, name, pci_bus_id, minor, total_mib, used_mib, reserved_mib,
                 processes, persistence_mode=None):
        self.index = index
        self.uuid = uuid
        self.name = name
        self.pci_bus_id = pci_bus_id
        self.minor = minor
        self.total_mib = total_mib
        self.used_mib = used_mib          # excluding driver-reserved memory (as nvidia-smi shows)
        self.reserved_mib = reserved_mib
        self.processes = processes        # list of (pid, mib or None), compute + graphics + MPS
        self.persistence_mode = persistence_mode


class ProcState(object):
    """One process as /proc reports it, with what it holds under the device directory."""

    __slots__ = ('pid', 'start_time', 'name', 'cmdline', 'uid', 'user', 'state', 'ppid', 'wchan',
                 'cgroup', 'pidns', 'nspid', 'kthread', 'ignores_sigterm', 'dev_fds', 'dev_maps',
                 'unreadable')

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
        self.dev_fds = set()
        self.dev_maps = set()
        self.unreadable = []


class Snapshot(object):
    """Everything one scan saw, taken as close together in time as possible."""

    def __init__(self, gpus, procs, backend, own_pid, own_pidns, unreadable, nvml_missing_pids,
                 taken_at):
        self.gpus = gpus                      # list of GpuState, all GPUs of the host
        self.procs = procs                    # pid -> ProcState for every process that matters
        self.backend = backend
        self.own_pid = own_pid
        self.own_pidns = own_pidns
        self.unreadable = unreadable          # list of (pid, what, reason)
        self.nvml_missing_pids = nvml_missing_pids  # NVML-listed PIDs with no /proc entry here
        self.taken_at = taken_at


# ---------------------------------------------------------------------------------------------
# NVML, bounded
# ---------------------------------------------------------------------------------------------

def _bounded(fn, timeout, what):
    """Run fn() in a worker thread and give up after `timeout` seconds.

    A ctypes call into a hung driver cannot be interrupted; a daemon thread lets the module
    report the hang and exit while the call stays stuck.
    """
    box = {}

    def target():
        try:
            box['value'] = fn()
        except BaseException as exc:  # pylint: disable=broad-except
            box['error'] = exc

    worker = threading.Thread(target=target, name='nvml-call')
    worker.daemon = True
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise NvmlTimeout('NVML did not answer %s within nvml_timeout=%ss: the driver is hung or '
                          'busy; no process was signalled. Check `dmesg` for Xid errors; a hung '
                          'driver usually needs a GPU reset or a reboot.' % (what, timeout))
    if 'error' in box:
        raise box['error']
    return box.get('value')


def _mib(nbytes):
    return int(nbytes // MIB)


def _text(value):
    return value.decode('utf-8', 'replace') if isinstance(value, bytes) else str(value)


def _nvml_processes(handle):
    """Compute, graphics and MPS contexts of one GPU, as (pid, MiB or None)."""
    seen = {}
    for getter in ('nvmlDeviceGetComputeRunningProcesses', 'nvmlDeviceGetGraphicsRunningProcesses',
                   'nvmlDeviceGetMPSComputeRunningProcesses'):
        fn = getattr(pynvml, getter, None)
        if fn is None:
            continue
        try:
            entries = fn(handle)
        except pynvml.NVMLError as exc:
            if getter == 'nvmlDeviceGetComputeRunningProcesses':
                raise
            # Graphics and MPS lists are unsupported on many datacenter boards.
            if exc.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                continue
            raise
        for entry in entries:
            used = entry.usedGpuMemory
            mib = None if used is None or used == NVML_VALUE_NOT_AVAILABLE else _mib(used)
            pid = int(entry.pid)
            if pid in seen and seen[pid] is not None and mib is not None:
                seen[pid] += mib
            elif pid not in seen or seen[pid] is None:
                seen[pid] = mib
    return sorted(seen.items())


def _read_nvml():
    pynvml.nvmlInit()
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
                used_mib, reserved_mib = _mib(mem.used), _mib(mem.reserved)
            except (pynvml.NVMLError, AttributeError):
                # Old drivers: v1 only, where "used" includes the reserved part.
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
                used_mib, reserved_mib = _mib(mem.used), 0
            try:
                persistence = bool(pynvml.nvmlDeviceGetPersistenceMode(handle))
            except pynvml.NVMLError:
                persistence = None
            gpus.append(GpuState(
                index=index,
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                minor=int(pynvml.nvmlDeviceGetMinorNumber(handle)),
                total_mib=_mib(mem.total),
                used_mib=used_mib,
                reserved_mib=reserved_mib,
                processes=_nvml_processes(handle),
                persistence_mode=persistence,
            ))
        return gpus
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


_SMI_GPU_FIELDS = 'index,uuid,name,pci.bus_id,memory.total,memory.used,memory.reserved,persistence_mode'


def _run_smi(args, timeout):
    try:
        out = subprocess.run(['nvidia-smi'] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             timeout=timeout, check=False, universal_newlines=True)
    except subprocess.TimeoutExpired:
        raise NvmlTimeout('nvidia-smi %s did not answer within nvml_timeout=%ss: the driver is '
                          'hung; no process was signalled.' % (' '.join(args), timeout))
    if out.returncode != 0:
        raise ObserveError('nvidia-smi %s failed (rc=%d): %s'
                           % (' '.join(args), out.returncode, (out.stderr or out.stdout).strip()))
    return [line.split(', ') for line in out.stdout.splitlines() if line.strip()]


def _smi_minor(pci_bus_id, index):
    """The device minor number from the driver's proc file; nvidia-smi cannot query it."""
    bus = pci_bus_id.lower()
    for candidate in (bus, bus[4:]):
        path = '/proc/driver/nvidia/gpus/%s/information' % candidate
        try:
            with open(path) as handle:
                for line in handle:
                    if line.startswith('Device Minor'):
                        return int(line.split(':', 1)[1])
        except (IOError, OSError, ValueError):
            continue
    return index


def _read_smi(timeout):
    rows = _run_smi(['--query-gpu=' + _SMI_GPU_FIELDS, '--format=csv,noheader,nounits'], timeout)
    apps = _run_smi(['--query-compute-apps=pid,used_memory,gpu_uuid', '--format=csv,noheader,nounits'],
                    timeout)
    by_uuid = {}
    for pid, used, uuid in (row[:3] for row in apps if len(row) >= 3):
        mib = int(used) if used.strip().isdigit() else None
        by_uuid.setdefault(uuid.strip(), []).append((int(pid), mib))
    gpus = []
    for row in rows:
        index, uuid, name, bus, total, used, reserved, persistence = [c.strip() for c in row[:8]]
        gpus.append(GpuState(
            index=int(index), uuid=uuid, name=name, pci_bus_id=bus,
            minor=_smi_minor(bus, int(index)), total_mib=int(total), used_mib=int(used),
            reserved_mib=int(reserved) if reserved.isdigit() else 0,
            processes=sorted(by_uuid.get(uuid, [])),
            persistence_mode=(persistence == 'Enabled') if persistence != '[N/A]' else None))
    return gpus


def backend_name():
    """Which source of truth this host offers, without touching the driver."""
    if HAS_PYNVML:
        return 'nvml'
    if _which('nvidia-smi'):
        return 'nvidia-smi'
    return None


def _which(program):
    for folder in os.environ.get('PATH', '/usr/bin:/bin').split(os.pathsep):
        candidate = os.path.join(folder, program)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def read_gpus(timeout, backend=None):
    """All GPUs with memory and driver-listed processes; raises ObserveError or NvmlTimeout."""
    backend = backend or backend_name()
    if backend == 'nvml':
        try:
            return _bounded(_read_nvml, timeout, 'the GPU query')
        except pynvml.NVMLError as exc:
            raise ObserveError('NVML failed: %s. Is the NVIDIA driver loaded (`lsmod | grep nvidia`)?'
                               % exc)
    if backend == 'nvidia-smi':
        return _read_smi(timeout)
    raise ObserveError('Neither nvidia-ml-py (python module pynvml) nor nvidia-smi is available '
                       'on this host: install nvidia-ml-py for the Python that runs Ansible modules.')


# ---------------------------------------------------------------------------------------------
# /proc
# ---------------------------------------------------------------------------------------------

def _read(path):
    with open(path, 'rb') as handle:
        return handle.read()


def parse_stat(raw):
    """(comm, state name, ppid, start_time_ticks, flags) from /proc/PID/stat, robust to odd names.

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
    return comm, name, int(fields[1]), int(fields[19]), int(fields[6])


def read_identity(pid, proc='/proc'):
    """(start time in clock ticks since boot, state name), or None when the process is gone.

    PID plus start time is a process's identity: a reused PID has a later start time.
    """
    try:
        state, start = parse_stat(_read('%s/%d/stat' % (proc, pid)))[1:4:2]
    except (IOError, OSError, ValueError, IndexError):
        return None
    return start, state


def _pids(proc):
    try:
        names = os.listdir(proc)
    except OSError as exc:
        raise ObserveError('cannot list %s: %s' % (proc, exc))
    return [int(name) for name in names if name.isdigit()]


def _device_fds(base, dev_prefix):
    """Paths under the device directory that the process at `base` (/proc/PID) has open;
    None when the process vanished.

    readlinkat() relative to an open /proc/PID/fd directory skips re-resolving the
    /proc/PID/fd prefix for every descriptor, which is where a naive scan spends its time.
    """
    try:
        dir_fd = os.open(base + '/fd', os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc
    found = set()
    try:
        for name in os.listdir(dir_fd):
            try:
                target = os.readlink(name, dir_fd=dir_fd)
            except OSError:
                continue  # closed between listdir and readlink
            if target.startswith(dev_prefix):
                found.add(target)
    except OSError as exc:
        return exc
    finally:
        os.close(dir_fd)
    return found


def _device_maps(base, dev_prefix):
    try:
        raw = _read(base + '/maps')
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc
    needle = b' ' + dev_prefix.encode()
    found = set()
    if needle not in raw:
        return found
    for line in raw.splitlines():
        index = line.find(needle)
        if index >= 0:
            found.add(line[index + 1:].decode('utf-8', 'replace').strip())
    return found


def _fill_details(info, proc):
    """Identity, state and ownership of one process; False when it vanished."""
    pid = info.pid
    base = '%s/%d' % (proc, pid)
    try:
        comm, state, ppid, start, flags = parse_stat(_read(base + '/stat'))
    except (IOError, OSError, ValueError, IndexError):
        return False
    info.name, info.ppid, info.start_time, info.state = comm, ppid, start, state
    info.kthread = bool(flags & _KTHREAD_FLAG)
    try:
        info.cmdline = _read(base + '/cmdline').replace(b'\0', b' ').decode('utf-8', 'replace').strip()
    except (IOError, OSError):
        info.unreadable.append('cmdline')
    try:
        for line in _read(base + '/status').decode('utf-8', 'replace').splitlines():
            if line.startswith('Uid:'):
                info.uid = int(line.split()[1])
            elif line.startswith('NSpid:'):
                info.nspid = [int(x) for x in line.split()[1:]]
            elif line.startswith('SigIgn:'):
                info.ignores_sigterm = bool(int(line.split()[1], 16) & _SIGTERM_BIT)
    except (IOError, OSError, ValueError):
        info.unreadable.append('status')
    if info.uid is not None:
        try:
            info.user = pwd.getpwuid(info.uid).pw_name
        except KeyError:
            info.user = str(info.uid)
    try:
        info.cgroup = _read(base + '/cgroup').decode('utf-8', 'replace')
    except (IOError, OSError):
        info.unreadable.append('cgroup')
    try:
        info.pidns = os.readlink(base + '/ns/pid')
    except OSError:
        info.unreadable.append('ns/pid')
    if state == 'disk-sleep':
        try:
            info.wchan = _read(base + '/wchan').decode('utf-8', 'replace').strip() or None
        except (IOError, OSError):
            info.unreadable.append('wchan')
    return True


def scan_processes(dev_dir='/dev', proc='/proc', deep=False, extra_pids=()):
    """Every process that has a file under `dev_dir`/nvidia* open or mapped.

    Maps are read for processes with device fds and for `extra_pids` (the ones NVML lists);
    with `deep`, for every process, which also finds a process that closed its fds but kept
    its mappings. Returns (procs, unreadable).
    """
    dev_prefix = dev_dir.rstrip('/') + '/nvidia'
    procs, unreadable = {}, []
    extra = set(extra_pids)
    for pid in _pids(proc):
        base = '%s/%d' % (proc, pid)
        fds = _device_fds(base, dev_prefix)
        if fds is None:
            continue
        if isinstance(fds, Exception):
            unreadable.append((pid, 'fd', str(fds)))
            fds = set()
        if not fds and not deep and pid not in extra:
            continue
        maps = _device_maps(base, dev_prefix)
        if maps is None:
            continue
        if isinstance(maps, Exception):
            unreadable.append((pid, 'maps', str(maps)))
            maps = set()
        if not fds and not maps and pid not in extra:
            continue
        info = ProcState(pid)
        info.dev_fds, info.dev_maps = fds, maps
        if _fill_details(info, proc):
            if info.state == 'zombie-leader' and not fds and not maps:
                info.dev_fds, info.dev_maps = _thread_devices(base, pid, dev_prefix)
            procs[pid] = info
    return procs, unreadable


def _thread_devices(base, pid, dev_prefix):
    """A zombie leader's own fd table is gone: read its live threads' view instead."""
    try:
        tids = [t for t in os.listdir(base + '/task') if t != str(pid)]
    except OSError:
        return set(), set()
    for tid in tids:
        fds = _device_fds('%s/task/%s' % (base, tid), dev_prefix)
        maps = _device_maps('%s/task/%s' % (base, tid), dev_prefix)
        if isinstance(fds, set) and isinstance(maps, set):
            return fds, maps
    return set(), set()


def describe_process(pid, proc='/proc'):
    """Details of one process that holds nothing (an ancestor, a zombie's parent); or None."""
    info = ProcState(pid)
    return info if _fill_details(info, proc) else None


def ancestors(pid, proc='/proc'):
    """PIDs from `pid` up to PID 1: the module itself, the shell and SSH session that run it."""
    chain = []
    seen = set()
    while pid and pid not in seen:
        seen.add(pid)
        chain.append(pid)
        try:
            pid = parse_stat(_read('%s/%d/stat' % (proc, pid)))[2]
        except (IOError, OSError, ValueError, IndexError):
            break
    return chain


def unit_restart_policy(unit, timeout=10):
    """(Restart=, ActiveState) of a systemd unit, or (None, None) where systemd is not running."""
    if not unit or not os.path.isdir('/run/systemd/system') or not _which('systemctl'):
        return None, None
    try:
        out = subprocess.run(['systemctl', 'show', '-p', 'Restart', '-p', 'ActiveState', '--', unit],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                             check=False, universal_newlines=True)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    values = dict(line.split('=', 1) for line in out.stdout.splitlines() if '=' in line)
    return values.get('Restart'), values.get('ActiveState')


def runtime_details(owner, timeout=10):
    """What a container's, pod's or guest's runtime says about it (gpu_owner.parse_inspect):
    its readable name, restart policy, pod. Empty when the runtime's CLI is not on this host,
    fails or does not answer within `timeout` seconds: the owner is then named by its id."""
    row = gpu_owner.RUNTIMES.get(owner.get('runtime')) or {}
    argv = gpu_owner.runtime_argv(owner.get('runtime'), 'inspect', owner) if owner.get('id') else None
    if not argv or not row.get('cli') or not _which(row['cli']):
        return {}
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                             check=False, universal_newlines=True)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if out.returncode != 0:
        return {}
    return gpu_owner.parse_inspect(row['parse'], out.stdout)


def take_snapshot(nvml_timeout, dev_dir='/dev', proc='/proc', deep=False, backend=None):
    """One observation of the GPUs and every process that holds them."""
    started = time.time()
    gpus = read_gpus(nvml_timeout, backend=backend)
    nvml_pids = set(entry[0] for gpu in gpus for entry in gpu.processes)
    procs, unreadable = scan_processes(dev_dir=dev_dir, proc=proc, deep=deep, extra_pids=nvml_pids)
    # NVML PIDs that the scan could not read are either gone, impossible, or outside this
    # PID namespace; a PID of 0 or above pid_max can never resolve.
    missing = sorted(pid for pid in nvml_pids if pid not in procs)
    own_pid = os.getpid()
    try:
        own_pidns = os.readlink('%s/self/ns/pid' % proc)
    except OSError:
        own_pidns = None
    return Snapshot(gpus=gpus, procs=procs, backend=backend or backend_name(), own_pid=own_pid,
                    own_pidns=own_pidns, unreadable=unreadable, nvml_missing_pids=missing,
                    taken_at=started)
