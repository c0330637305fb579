# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU backend seam: what a vendor's driver tells and needs, behind one object.

A backend knows how to read the GPUs and the processes the driver charges, which device
nodes belong to which GPU, which daemons and units are the vendor's infrastructure, and how
to reset a GPU. The rest of the collection asks the backend and knows no vendor. BACKENDS
lists the implementations in the order they are preferred; the first one available on the
host is used. Adding a vendor is a new file with a GpuBackend subclass and a line here.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re


class GpuBackend(object):
    """One vendor's driver, read one way. Subclasses set the class attributes and implement
    available() and read_gpus(); reading never changes the host."""

    name = None                    # the `backend` result value
    node_prefixes = ()             # device node names under /dev that hold GPUs (prefixes)
    infrastructure = ()            # process names of the vendor's daemons: never signalled
    infrastructure_units = re.compile(r'^$')   # the vendor's units: never stopped
    warning = None                 # said by the modules when this backend is used (a fallback)

    def __init__(self, dev_dir='/dev'):
        self.dev_dir = dev_dir.rstrip('/')

    @staticmethod
    def available():
        """True when this host offers this way of reading the GPUs (without touching them)."""
        raise NotImplementedError

    def read_gpus(self, timeout):
        """All GPUs as gpu_observe.GpuState (with the per-GPU device node paths in `nodes`),
        each call bounded by `timeout`; raises gpu_observe.ObserveError or NvmlTimeout."""
        raise NotImplementedError

    def hold_session(self):
        """Keep the driver's library ready between reads until end_session (the ladder reads the
        GPUs many times in one run); a backend without a session ignores it."""

    def end_session(self, timeout):
        """Let go of what hold_session kept (before a reset, and when the run ends), bounded by
        `timeout`; never raises."""

    def read_health(self, index, timeout):
        """GPU `index`'s health as a gpu_observe.GpuHealth, each read bounded by `timeout`; a
        read that fails or hangs is named in its `unread`, never raised. A backend that reads
        no health says so for every read: unread, never healthy."""
        from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe
        why = 'the %s backend reads no GPU health (install nvidia-ml-py)' % (self.name or 'this')
        return gpu_observe.GpuHealth(index, None, None, None, None, None,
                                     dict((read, (gpu_observe.READ_FAILED, why))
                                          for read in gpu_observe.HEALTH_READS), {})

    def read_xids(self, since, timeout, log=None):
        """The critical-error events the vendor's driver logged since `since` (epoch seconds;
        None: since boot) as gpu_observe.XidEvent, from the kernel log or the file `log`,
        bounded by `timeout`; raises gpu_observe.ObserveError or NvmlTimeout. None: this
        backend knows no such log."""
        return None

    def node_paths(self):
        """The path prefixes under which the scan looks for open or mapped device nodes."""
        return tuple('%s/%s' % (self.dev_dir, prefix) for prefix in self.node_prefixes)

    def reset_commands(self, index, persistence_mode):
        """The commands (what, argv) that reset GPU `index`, in order; gpu_act runs them."""
        raise NotImplementedError


def _backends():
    # Imported here: each vendor file imports this module for GpuBackend.
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_nvidia
    return (gpu_nvidia.NvmlBackend, gpu_nvidia.SmiBackend)


def available_backend(dev_dir='/dev'):
    """The first backend this host offers, or None."""
    for backend in _backends():
        if backend.available():
            return backend(dev_dir)
    return None


NO_BACKEND = ('neither nvidia-ml-py (python module pynvml) nor nvidia-smi is available on this '
              'host: install nvidia-ml-py for the Python that runs Ansible modules')
