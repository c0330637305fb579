# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """Options of every module that surveys GPUs and their holders (gpu_holders, gpu_reclaim)."""

    DOCUMENTATION = r"""
options:
  gpus:
    description:
      - The GPUs, each a NVML index (C("0")), a UUID (C("GPU-...")) or a PCI bus id
        (C("00000000:3B:00.0")).
      - Empty means every GPU of the host.
      - An unknown value fails, naming it and the GPUs that exist.
    type: list
    elements: str
    default: []
  exclude:
    description:
      - GPUs to leave out of O(gpus) (or of every GPU when O(gpus) is empty), spelled as in
        O(gpus). A GPU in both is left out.
      - An unknown value fails, naming it and the GPUs that exist.
      - Leaving out every GPU selects none; the result is then free with nothing to do.
    type: list
    elements: str
    default: []
  nvml_timeout:
    description:
      - Seconds each query of the driver may take. A hung driver fails the task with a clear
        message, before anything is signalled, instead of hanging the play.
    type: float
    default: 10.0
  protect:
    description:
      - Extra regular expressions; a process whose name or command line matches one is
        protected (never signalled), in addition to the built-in infrastructure list.
      - Each pattern gets 2 s per process to answer; one that takes longer (catastrophic
        backtracking such as C((a+\)+$)) fails the task naming it, before anything is
        signalled.
    type: list
    elements: str
    default: []
  free_threshold_mib:
    description:
      - A GPU counts as free when no process holds a context on it and its used memory
        (excluding the driver's reserved memory) is at most this many MiB.
    type: int
    default: 128
requirements:
  - nvidia-ml-py (python module C(pynvml)) on the managed host; without it the module falls
    back to C(nvidia-smi) and says so in its C(backend) result.
  - Linux with C(/proc); run as root to see every process's file descriptors.
attributes:
  platform:
    platforms: posix
    support: full
    description: Linux hosts with an NVIDIA driver.
"""
