# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The table of GPU backends (gpu_backend.GpuBackend implementations), in the order they are
preferred; the first one available on the host is used. Adding a vendor is a new file with a
GpuBackend subclass and a line here.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_nvidia


def _backends():
    return (gpu_nvidia.NvmlBackend, gpu_nvidia.SmiBackend)


def available_backend(dev_dir='/dev'):
    """The first backend this host offers, or None."""
    for backend in _backends():
        if backend.available():
            return backend(dev_dir)
    return None


NO_BACKEND = ('neither nvidia-ml-py (python module pynvml) nor nvidia-smi is available on this '
              'host: install nvidia-ml-py for the Python that runs Ansible modules')
