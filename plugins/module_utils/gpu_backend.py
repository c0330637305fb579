# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU backend seam: what a vendor's driver tells and needs, behind one object.

A backend knows how to read the GPUs and the processes the driver charges, which device
nodes belong to which GPU, which daemons and units are the vendor's infrastructure, and how
to reset a GPU. The rest of the collection asks the backend and knows no vendor; gpu_vendor
lists the implementations. Its own file so that a vendor file imports it and gpu_vendor
imports the vendor files, with no cycle (issue 32 item 5).
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

    def node_paths(self):
        """The path prefixes under which the scan looks for open or mapped device nodes."""
        return tuple('%s/%s' % (self.dev_dir, prefix) for prefix in self.node_prefixes)

    def reset_commands(self, index, persistence_mode):
        """The commands (what, argv) that reset GPU `index`, in order; gpu_act runs them."""
        raise NotImplementedError
