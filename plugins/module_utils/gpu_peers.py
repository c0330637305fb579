# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Peer memory: one GPU's memory held through another GPU's process (NCCL, CUDA IPC).

Measured on 2x H200 (tests/gpu scenario s8): with NCCL tensor parallelism, after rank 0 died, rank 1
(context on GPU 1) kept 291 MiB on GPU 0 that NVML charged to no process; killing rank 1 freed
both GPUs. So memory charged to nobody on a GPU that a live process with a context elsewhere
maps is explained by that process, not by a leak, and a reset is the wrong lever while it lives.

Pure rules, no I/O: holders are gpu_holder.Holder records. gpu_say writes the sentences.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say


def peer_gpus_of(evidence, listed, context_gpus, orphaned):
    """GPUs where a process maps peer memory: it maps the GPU's node, NVML charges that GPU's
    memory to nobody alive, and NVML lists the process with a context on another GPU.

    `evidence` is {gpu index: set of 'nvml', 'fd', 'mmap'}; `listed` the GPUs NVML charges it on.
    """
    if not listed:
        return []
    return sorted(i for i, kinds in evidence.items()
                  if 'mmap' in kinds and i in orphaned and i not in context_gpus)


def peers_of_gpu(holders, index):
    """The holders that map peer memory on GPU `index`."""
    return [h for h in holders if index in (h.peer_gpus or [])]


def peer_mappers(holders, rows):
    """(row, holder) for each GPU not free among the selected rows and each process that maps
    peer memory on it (gpu_decide's PEER_MEMORY findings)."""
    return [(row, holder) for row in rows if not row['free'] for holder in peers_of_gpu(holders, row['index'])]


def peer_lever(holder, index):
    """What to do about peer memory on GPU `index` held through this process (gpu_say.peer_lever;
    kept for the tests that call it here)."""
    return say.peer_lever(holder, index)


def peer_sentences(holders, rows):
    """One diagnosis sentence per (GPU not free, peer mapper) among the selected rows
    (gpu_say.peer_memory; kept for the tests that call it here)."""
    return [say.peer_memory(row, holder) for row, holder in peer_mappers(holders, rows)]


def holder_gpus(holder, peers):
    """The GPUs a holder counts on for targeting: its contexts, plus its peer GPUs with `peers`."""
    gpus = set(holder.context_gpus)
    if peers:
        gpus |= set(holder.peer_gpus or [])
    return gpus
