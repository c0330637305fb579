"""gpu_peers: memory charged to nobody on a GPU that a process with a context elsewhere maps."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_peers as peers

from .holders import make_holder


def rank1(peer_gpus=(0,)):
    return make_holder(pid=4242, name='sglang::scheduler_TP1', context_gpus=[1], peer_gpus=list(peer_gpus))


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


# --- the rule inside gpu_decide's classification, diagnosis and targeting --------------------------

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide  # noqa: E402
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say  # noqa: E402

from .observations import FREE_MIB, diagnosed, gpu, proc, snap  # noqa: E402

RANK1_NODES = ('/dev/nvidia0', '/dev/nvidia1', '/dev/nvidiactl', '/dev/nvidia-uvm')


def nccl_after_rank0_died(dead_rank0_listed=False):
    """Rank 1 (context on GPU 1, maps every GPU as CUDA processes do); 291 MiB on GPU 0 charged to
    nobody, or to the dead rank 0's PID."""
    gpu0 = gpu(0, used=291, processes=[(4241, 291)] if dead_rank0_listed else [])
    rank = proc(4242, name='sglang::schedul', cmdline='sglang::scheduler_TP1', fds=RANK1_NODES,
                maps=RANK1_NODES)
    return snap([gpu0, gpu(1, used=1000, processes=[(4242, 1000)])], [rank],
                missing=[4241] if dead_rank0_listed else [])


def surveyed(s, selected=(0,)):
    holders, _clients, unconfirmed = decide.classify(s, [], set(), {}, FREE_MIB)
    rows = decide.gpu_table(s, holders, list(selected), 128)
    return holders, rows, diagnosed(s, holders, unconfirmed, rows)


def test_rank1_is_a_peer_mapper_of_gpu0_and_the_diagnosis_says_so_without_reset():
    for dead_listed in (False, True):
        holders, rows, diagnosis = surveyed(nccl_after_rank0_died(dead_listed))
        (rank,) = holders
        assert rank.context_gpus == [1] and rank.peer_gpus == [0]
        assert rows[0]['peers'] == [4242] and rows[0]['free'] is False
        assert diagnosis == ['GPU 0: 291 MiB used that NVML charges to no process: PID 4242 '
                             '(sglang::scheduler_TP1) maps GPU 0, its context is on GPU 1: NCCL/IPC peer '
                             'memory; reclaim GPU 1 too or set peers: true.']


def test_peers_option_makes_the_mapper_a_target_of_gpu0():
    holders, _rows, _diagnosis = surveyed(nccl_after_rank0_died())
    assert decide.plan_targets(holders, [0], [])[0] == []
    assert [t.pid for t in decide.plan_targets(holders, [0], [], peers_too=True)[0]] == [4242]
    # Reclaiming GPU 1 (its context) targets it whatever `peers` says.
    assert [t.pid for t in decide.plan_targets(holders, [1], [])[0]] == [4242]


def test_failure_names_the_mapper_and_the_lever_never_a_reset():
    holders, rows, _diagnosis = surveyed(nccl_after_rank0_died())
    (rank,) = holders
    remaining = [rank.left(None, 'maps peer memory of GPU 0', lever=peers.peer_lever(rank, 0))]
    msg = say.failure_message(rows, remaining, 3.2, allow_reset=False)
    assert 'PID 4242 (sglang::schedul) sleeping: it maps GPU 0, its context is on GPU 1: NCCL/IPC peer ' \
           'memory; reclaim GPU 1 too or set peers: true' in msg
    assert 'reset' not in msg and 'reboot' not in msg


def test_an_unrelated_process_of_gpu1_on_a_gpu0_that_is_free_is_no_peer():
    s = snap([gpu(0, used=0), gpu(1, used=1000, processes=[(4242, 1000)])],
             [proc(4242, fds=RANK1_NODES, maps=RANK1_NODES)])
    holders, rows, diagnosis = surveyed(s)
    assert holders[0].peer_gpus == [] and rows[0]['free'] is True and diagnosis == []
