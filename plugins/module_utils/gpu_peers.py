# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Peer memory: one GPU's memory held through another GPU's process (NCCL, CUDA IPC).

Measured on 2x H200 (tests/gpu scenario s8): with NCCL tensor parallelism, after rank 0 died, rank 1
(context on GPU 1) kept 291 MiB on GPU 0 that NVML charged to no process; killing rank 1 freed
both GPUs. So memory charged to nobody on a GPU that a live process with a context elsewhere
maps is explained by that process, not by a leak, and a reset is the wrong lever while it lives.

Pure rules, no I/O: holders are gpu_decide's holder dicts.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text


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
    return [h for h in holders if index in (h.get('peer_gpus') or [])]


_COMM_LEN = 15


def title(holder):
    """The process title as the operator knows it: the kernel cuts /proc/PID/comm at 15
    characters ('sglang::schedul'), so a cut name is completed from the command line. Control
    characters are escaped (gpu_text.escape_text): it goes into sentences."""
    name = holder['name']
    first = (holder.get('cmdline') or '').split(' ', 1)[0]
    if len(name) == _COMM_LEN and first.startswith(name):
        return escape_text(first)
    return escape_text(name)


def peer_lever(holder, index):
    """What to do about peer memory on GPU `index` held through this process."""
    contexts = ','.join(str(i) for i in holder['context_gpus'])
    return ('it maps GPU %d, its context is on GPU %s: NCCL/IPC peer memory; reclaim GPU %s too or set '
            'peers: true' % (index, contexts, contexts))


def peer_reason(holder, index):
    """Why this process holds GPU `index`, in the words the operator acts on."""
    return 'PID %d (%s) %s' % (holder['pid'], title(holder), peer_lever(holder, index)[3:])


def peer_sentences(holders, rows):
    """One diagnosis sentence per (GPU not free, peer mapper) among the selected rows."""
    sentences = []
    for row in rows:
        if row['free']:
            continue
        for holder in peers_of_gpu(holders, row['index']):
            sentences.append('GPU %d: %d MiB used that NVML charges to no process: %s.'
                             % (row['index'], row['memory_used_mib'], peer_reason(holder, row['index'])))
    return sentences


def holder_gpus(holder, peers):
    """The GPUs a holder counts on for targeting: its contexts, plus its peer GPUs with `peers`."""
    gpus = set(holder['context_gpus'])
    if peers:
        gpus |= set(holder.get('peer_gpus') or [])
    return gpus
