# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVIDIA's GPU backends: everything the collection knows about NVIDIA in one file.

Two implementations of gpu_vendor.GpuBackend share the NVIDIA knowledge (device nodes,
infrastructure, reset) and differ only in how they read the GPUs: NVML through nvidia-ml-py,
or the nvidia-smi command where the Python bindings are not installed.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import stat
import subprocess
import time

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import (
    GpuState, NvmlTimeout, ObserveError, bounded, which)
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_vendor import GpuBackend

try:
    import pynvml
except ImportError:  # the nvidia-smi backend, or none, is used instead
    pynvml = None

MIB = 1024 * 1024
# NVML reports "not available" per-process memory with this sentinel (e.g. under WDDM or MIG).
NVML_VALUE_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
_HUNG = ('the driver is hung or busy; no process was signalled. Check `dmesg` for Xid errors; a hung '
         'driver usually needs a GPU reset or a reboot.')


# The driver's own report of a fault: `NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen
# off the bus.` (NVIDIA's Xid catalog; some drivers add the function: PCI:0000:18:00.0).
_XID_LINE = re.compile(r'NVRM: Xid \(PCI:([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.[0-7])?\): '
                       r'(\d+),? ?(.*)$')
# How much of a kernel log the Xid reader reads (the newest part): a boot's Xid lines are
# few, and the bound keeps a flooded log from costing the run its time.
XID_LOG_BYTES = 1 << 20
XID_LINES = 2000


def parse_xid_lines(text, since=None):
    """The Xid events in kernel log lines as `journalctl -k -o short-unix` prints them (epoch
    seconds first), at or after `since`."""
    events = []
    for line in text.splitlines():
        match = _XID_LINE.search(line)
        if match is None:
            continue
        try:
            at = float(line.split(None, 1)[0])
        except (IndexError, ValueError):
            continue
        if since is not None and at < since:
            continue
        domain, bus, device, xid, rest = match.groups()
        events.append(observe.XidEvent(at, (int(domain, 16), int(bus, 16), int(device, 16)),
                                       int(xid), rest.strip()))
    return events


def _read_log_file(path):
    """The newest XID_LOG_BYTES of `path`, a file root (or this user) owns and no one else may
    write: a node user must not choose what stops a start."""
    try:
        with open(path, 'rb') as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_uid not in (0, os.geteuid()) \
                    or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise ObserveError('xid_log %s is not a regular file that only root (or uid %d) '
                                   'may write' % (path, os.geteuid()))
            handle.seek(max(0, info.st_size - XID_LOG_BYTES))
            return handle.read().decode('utf-8', 'replace')
    except (IOError, OSError) as exc:
        raise ObserveError('cannot read xid_log %s: %s' % (path, exc))


class NvidiaBackend(GpuBackend):
    """What holds for every NVIDIA host, whichever way the GPUs are read."""

    # /dev/nvidia<minor> is one GPU; nvidiactl, nvidia-uvm, nvidia-caps/* and nvidia-modeset
    # are shared and pin no particular GPU.
    node_prefixes = ('nvidia',)
    infrastructure = (
        'nvidia-persistenced', 'nv-hostengine', 'dcgm-exporter', 'dcgmi', 'nv-fabricmanager',
        'nvidia-fabricmanager', 'nvidia-cuda-mps-control', 'nvidia-cuda-mps-server',
        'nvidia-device-plugin',
    )
    infrastructure_units = re.compile(
        r'^(nvidia-persistenced|nvidia-fabricmanager|dcgm.*|nvidia-dcgm.*)\.service$')

    def gpu_nodes(self, gpu_minor):
        return ('%s/nvidia%d' % (self.dev_dir, gpu_minor),)

    def read_xids(self, since, timeout, log=None):
        """The driver's Xid lines since `since` (None: since boot), from the kernel log through
        `journalctl -k` (this boot only: a reboot clears what it prescribed), or from the file
        `log` in the same format (a host whose kernel log is kept elsewhere; the lab's stand-in
        driver writes one, tests/fakegpu). Bounded by `timeout` and by XID_LINES lines."""
        if log:
            return parse_xid_lines(_read_log_file(log), since)
        argv = ['journalctl', '-k', '-o', 'short-unix', '--no-pager', '-q', '-n', str(XID_LINES),
                '--grep', 'NVRM: Xid']
        if since is not None:
            argv += ['--since', '@%d' % int(since)]
        if which('journalctl') is None:
            raise ObserveError('journalctl is not on PATH: the kernel log cannot be read for Xid '
                               'errors (set xid_log to a file that holds it)')
        try:
            out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                                 check=False, universal_newlines=True)
        except subprocess.TimeoutExpired:
            raise NvmlTimeout('%s did not answer within nvml_timeout=%ss' % (' '.join(argv), timeout))
        # journalctl --grep exits 1 when nothing matches ("-- No entries --" without -q).
        if out.returncode not in (0, 1) or (out.returncode == 1 and out.stderr.strip()):
            raise ObserveError('%s failed (rc=%d): %s' % (' '.join(argv), out.returncode,
                                                          (out.stderr or out.stdout).strip()[:300]))
        return parse_xid_lines(out.stdout, since)

    def reset_commands(self, index, persistence_mode):
        """nvidia-smi --gpu-reset, with persistence mode off for the reset and restored."""
        index = str(index)
        steps = []
        if persistence_mode:
            steps.append(('persistence_off', ['nvidia-smi', '-pm', '0', '-i', index]))
        steps.append(('reset', ['nvidia-smi', '--gpu-reset', '-i', index]))
        if persistence_mode:
            steps.append(('persistence_on', ['nvidia-smi', '-pm', '1', '-i', index]))
        return steps


def _mib(nbytes):
    return int(nbytes // MIB)


def _text(value):
    return value.decode('utf-8', 'replace') if isinstance(value, bytes) else str(value)


class NvmlBackend(NvidiaBackend):
    """NVML through nvidia-ml-py (python module pynvml): the driver's own view."""

    name = 'nvml'

    def __init__(self, dev_dir='/dev'):
        NvidiaBackend.__init__(self, dev_dir)
        self.held = False          # hold_session: NVML stays initialised between reads
        self.initialised = False

    @staticmethod
    def available():
        return pynvml is not None

    def hold_session(self):
        """Initialise NVML at the next read and keep it so until end_session. Each nvmlInit/
        nvmlShutdown pair costs the read most of its time on a real host: on one H200, a survey
        after the last rank had exited (nothing to read in /proc) took 19 ms (tests/gpu s12,
        run8), where the suite's own open session reads the memory in a 2 ms poll. While held,
        this process has the device nodes open, as any NVML client: the survey leaves out its
        own process, and the ladder ends the session before a reset (nvidia-smi --gpu-reset
        refuses while any process has the device open)."""
        self.held = True

    def end_session(self, timeout):
        self.held = False
        if not self.initialised:
            return
        self.initialised = False
        try:
            bounded(pynvml.nvmlShutdown, timeout, 'NVML did not shut down within %ss' % timeout)
        except (ObserveError, pynvml.NVMLError):
            pass   # the process ends soon, and the device files close with it

    def read_gpus(self, timeout):
        try:
            return bounded(self._read, timeout, 'NVML did not answer the GPU query within '
                           'nvml_timeout=%ss: %s' % (timeout, _HUNG))
        except NvmlTimeout:
            # The call is still stuck in the driver: a shutdown would wait on it too. The session
            # is left as it is; the device files close when this process exits.
            self.held = self.initialised = False
            raise
        except pynvml.NVMLError as exc:
            raise ObserveError('NVML failed: %s. Is the NVIDIA driver loaded (`lsmod | grep nvidia`)?'
                               % exc)

    def _read(self):
        if not self.initialised:
            pynvml.nvmlInit()
            self.initialised = True
        try:
            return [self._gpu_or_lost(index) for index in range(pynvml.nvmlDeviceGetCount())]
        finally:
            if not self.held:
                self.initialised = False
                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError:
                    pass

    def _gpu_or_lost(self, index):
        """GPU `index`, or where NVML answers "GPU is lost" (fallen off the bus: Xid 79) an
        empty GPU with no identity, so that the survey reads the others and the health read
        names this one."""
        try:
            return self._gpu(index, pynvml.nvmlDeviceGetHandleByIndex(index))
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_GPU_IS_LOST:
                raise
            return GpuState(index=index, uuid='', name='', pci_bus_id='', minor=None, nodes=(),
                            total_mib=0, used_mib=0, reserved_mib=0, processes=[])

    def read_health(self, index, timeout):
        """Five reads, each bounded by `timeout`; the first that hangs ends the rest (named
        skipped). Measured on an H100 with driver 580.159.04: remapped rows (0, 0, 0, 0),
        retired pages Not Supported (Hopper remaps rows instead), field 230 0."""
        values, unread, took = {}, {}, {}
        reads = (
            ('driver', lambda: self._health_handle(index)),
            ('remapped_rows', lambda: tuple(int(v) for v in pynvml.nvmlDeviceGetRemappedRows(values['driver']))),
            ('ecc_volatile_uncorrected', lambda: int(pynvml.nvmlDeviceGetTotalEccErrors(
                values['driver'], pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC))),
            ('retired_pages_pending', lambda: bool(pynvml.nvmlDeviceGetRetiredPagesPendingStatus(values['driver']))),
            ('recovery_action', lambda: _recovery_action(values['driver'])),
        )
        lost = False
        for read, fn in reads:
            if lost:
                continue   # "GPU is lost" says it all: no read answers
            if 'driver' in unread:
                unread[read] = (observe.READ_SKIPPED, 'GPU %d: no handle' % index)
                continue
            started = time.time()
            try:
                values[read] = bounded(fn, timeout, 'GPU %d: NVML did not answer the %s read within '
                                       'nvml_timeout=%ss' % (index, read, timeout))
            except NvmlTimeout as exc:
                unread[read] = (observe.READ_HUNG, str(exc))
                self.held = self.initialised = False   # the call is still stuck in the driver
                for rest, _fn in reads[[r for r, _f in reads].index(read) + 1:]:
                    unread[rest] = (observe.READ_SKIPPED, 'an earlier read hung: %s' % exc)
                took[read] = _ms(started)
                break
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    lost = True
                elif exc.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                    unread[read] = (observe.UNSUPPORTED, 'GPU %d: %s: %s' % (index, read, exc))
                else:
                    unread[read] = (observe.READ_FAILED, 'GPU %d: %s: %s' % (index, read, exc))
            took[read] = _ms(started)
        return observe.GpuHealth(
            index=index, lost=lost, remapped_rows=values.get('remapped_rows'),
            ecc_volatile_uncorrected=values.get('ecc_volatile_uncorrected'),
            retired_pages_pending=values.get('retired_pages_pending'),
            recovery_action=values.get('recovery_action'), unread=unread, took_ms=took)

    def _health_handle(self, index):
        if not self.initialised:
            pynvml.nvmlInit()
            self.initialised = True
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def _gpu(self, index, handle):
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
        minor = int(pynvml.nvmlDeviceGetMinorNumber(handle))
        return GpuState(
            index=index,
            uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
            name=_text(pynvml.nvmlDeviceGetName(handle)),
            pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
            minor=minor,
            nodes=self.gpu_nodes(minor),
            total_mib=_mib(mem.total),
            used_mib=used_mib,
            reserved_mib=reserved_mib,
            processes=_nvml_processes(handle),
            persistence_mode=persistence,
        )


def _ms(started):
    return round((time.time() - started) * 1000.0, 3)


# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.h, driver 580; nvidia-ml-py 13.580): the action the
# driver prescribes, nvmlGpuRecoveryAction_t (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
# 4 drain and reset, 5 GPU reset through the bus). Older bindings lack the constant.
FI_RECOVERY_ACTION = 230


def _recovery_action(handle):
    field = getattr(pynvml, 'NVML_FI_DEV_GET_GPU_RECOVERY_ACTION', FI_RECOVERY_ACTION)
    value = pynvml.nvmlDeviceGetFieldValues(handle, [field])[0]
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(value.nvmlReturn)
    return int(value.value.uiVal)


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


_SMI_GPU_FIELDS = 'index,uuid,name,pci.bus_id,memory.total,memory.used,memory.reserved,persistence_mode'


class SmiBackend(NvidiaBackend):
    """The nvidia-smi command, where nvidia-ml-py is not installed."""

    name = 'nvidia-smi'
    warning = 'nvidia-ml-py is not installed on this host; read the GPUs through nvidia-smi.'

    @staticmethod
    def available():
        return which('nvidia-smi') is not None

    def read_gpus(self, timeout):
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
            minor = _smi_minor(bus, int(index))
            gpus.append(GpuState(
                index=int(index), uuid=uuid, name=name, pci_bus_id=bus, minor=minor,
                nodes=self.gpu_nodes(minor), total_mib=int(total), used_mib=int(used),
                reserved_mib=int(reserved) if reserved.isdigit() else 0,
                processes=sorted(by_uuid.get(uuid, [])),
                persistence_mode=(persistence == 'Enabled') if persistence != '[N/A]' else None))
        return gpus


def _run_smi(args, timeout):
    try:
        out = subprocess.run(['nvidia-smi'] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             timeout=timeout, check=False, universal_newlines=True)
    except subprocess.TimeoutExpired:
        raise NvmlTimeout('nvidia-smi %s did not answer within nvml_timeout=%ss: %s'
                          % (' '.join(args), timeout, _HUNG))
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
