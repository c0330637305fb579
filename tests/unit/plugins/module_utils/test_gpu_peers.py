"""gpu_peers: memory charged to nobody on a GPU that a process with a context elsewhere maps."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_peers as peers


def rank1(peer_gpus=(0,)):
    return {'pid': 4242, 'name': 'sglang::scheduler_TP1', 'context_gpus': [1], 'peer_gpus': list(peer_gpus)}


def row(index, used, free=False):
    return {'index': index, 'memory_used_mib': used, 'free': free}


def test_peer_gpu_needs_mapping_orphaned_memory_and_a_context_elsewhere():
    evidence = {0: {'fd', 'mmap'}, 1: {'nvml', 'fd', 'mmap'}}
    assert peers.peer_gpus_of(evidence, listed={1: 1000}, context_gpus=[1], orphaned={0}) == [0]
    # GPU 0's memory is charged to a live process: whatever maps it, that is no peer memory.
    assert peers.peer_gpus_of(evidence, listed={1: 1000}, context_gpus=[1], orphaned=set()) == []
    # An open device file (nvmlInit) is no mapping.
    assert peers.peer_gpus_of({0: {'fd'}, 1: {'nvml'}}, {1: 1000}, [1], {0}) == []
    # NVML lists it nowhere: its mapping is an inherited context (gpu_decide's rule), not a peer.
    assert peers.peer_gpus_of({0: {'fd', 'mmap'}}, listed={}, context_gpus=[0], orphaned={0}) == []
    # Its own context GPU is never a peer GPU.
    assert peers.peer_gpus_of(evidence, listed={1: 1000}, context_gpus=[1], orphaned={0, 1}) == [0]


def test_sentence_names_pid_title_both_gpus_and_the_levers():
    (sentence,) = peers.peer_sentences([rank1()], [row(0, 291), row(1, 1000, free=False)])
    assert sentence == ('GPU 0: 291 MiB used that NVML charges to no process: PID 4242 '
                        '(sglang::scheduler_TP1) maps GPU 0, its context is on GPU 1: NCCL/IPC peer '
                        'memory; reclaim GPU 1 too or set peers: true.')
    assert 'reset' not in sentence and 'reboot' not in sentence


def test_free_gpus_and_unmapped_gpus_get_no_sentence():
    assert peers.peer_sentences([rank1()], [row(0, 0, free=True)]) == []
    assert peers.peer_sentences([rank1(peer_gpus=())], [row(0, 291)]) == []


def test_peers_option_widens_the_gpus_a_holder_counts_on():
    assert peers.holder_gpus(rank1(), peers=False) == {1}
    assert peers.holder_gpus(rank1(), peers=True) == {0, 1}
