"""gpu_survey: the Surveyor's reading of a host (which processes it reads and in how many passes,
the units and containers it protects) and the owners it names through their runtimes."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import re
import signal
import subprocess

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_flow as flow
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_survey

from .observations import _MAP_AND_WAIT, _ScriptedGpus, gpu


@pytest.mark.parametrize('charged', [False, True])
def test_memory_charged_to_no_process_is_read_in_one_deep_pass(tmp_path, monkeypatch, charged):
    """4,000 MiB the driver charges to nobody: one pass reads every fd and maps at once (it was
    an fd pass, then a second pass of both). Charged to a live holder: the fd pass alone."""
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_flow as flow
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
    node = tmp_path / 'nvidia0'
    node.write_bytes(b'\0' * 4096)
    # A grandchild: a survey leaves out the surveying process's own children.
    shell = subprocess.Popen(['sh', '-c', 'python3 -c "$0" "$1" & echo $!; wait', _MAP_AND_WAIT, str(node)],
                             stdout=subprocess.PIPE)
    pid = int(shell.stdout.readline())
    try:
        assert shell.stdout.readline() == b'ready\n'
        processes = [(pid, 4000)] if charged else []
        backend = _ScriptedGpus(str(tmp_path), [gpu(0, used=4000, processes=processes)])
        backend.gpus[0].nodes = (str(node),)
        scans = []
        real_scan = observe.scan_processes

        def counted(node_paths, **kwargs):
            scans.append(kwargs.get('deep', False))
            return real_scan(node_paths, **kwargs)

        monkeypatch.setattr(observe, 'scan_processes', counted)
        survey = flow.Surveyor(backend=backend).survey()
    finally:
        os.kill(pid, signal.SIGKILL)
        shell.wait()
    assert scans == ([False] if charged else [True])
    found = [h for h in survey.holders if h.pid == pid]
    assert found and found[0].evidence == (['fd', 'mmap', 'nvml'] if charged else ['fd', 'mmap'])


@pytest.mark.parametrize('uncharged, scans_expected', [
    # three contexts: the threshold and the driver's own 8 MiB of each beyond the first
    (128 + 2 * 8, [(False, True)]),
    # one MiB more: a process NVML does not list may hold it, so every fd and maps is read
    (128 + 2 * 8 + 1, [(False, True), (True, False)]),
])
def test_the_drivers_share_of_each_context_keeps_gpu_reclaims_survey_to_nvmls_list(
        tmp_path, monkeypatch, uncharged, scans_expected):
    """Ranks on one GPU: NVML charges each its memory, and the driver uses a few MiB per context
    that it charges to nobody (a real H200: 141 MiB for 24 ranks). gpu_reclaim's survey reads the
    listed processes only, as for one rank; beyond that share, it reads every process."""
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_flow as flow
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
    node = tmp_path / 'nvidia0'
    node.write_bytes(b'\0' * 4096)
    shell = subprocess.Popen(['sh', '-c', 'for i in 1 2 3; do python3 -c "$0" "$1" & echo $!; done; wait',
                              _MAP_AND_WAIT, str(node)], stdout=subprocess.PIPE)
    # Three PIDs and three 'ready's, in any order; two children's words may share a line.
    words = []
    while len(words) < 6:
        line = shell.stdout.readline()
        if not line:
            break
        words += re.findall(rb'[0-9]+|ready', line)
    pids = [int(word) for word in words if word != b'ready']
    try:
        assert len(pids) == 3 and words.count(b'ready') == 3, words
        backend = _ScriptedGpus(str(tmp_path), [gpu(0, used=3 * 1000 + uncharged,
                                                    processes=[(pid, 1000) for pid in pids])])
        backend.gpus[0].nodes = (str(node),)
        scans = []
        real_scan = observe.scan_processes

        def counted(node_paths, **kwargs):
            scans.append((kwargs.get('deep', False), kwargs.get('only_extra', False)))
            return real_scan(node_paths, **kwargs)

        monkeypatch.setattr(observe, 'scan_processes', counted)
        survey = flow.Surveyor(backend=backend).survey(full=False)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        shell.wait()
    assert scans == scans_expected
    assert sorted(h.pid for h in survey.holders if h.context_gpus == [0]) == sorted(pids)


def test_the_protected_units_and_containers_come_from_the_ancestors_cgroups():
    """The units and containers holding this process's ancestors, as a full description of
    each ancestor named them."""
    class Backend(object):
        infrastructure_units = None

    surveyor = flow.Surveyor(backend=Backend(), spare_units=['spared'])
    cgroups = [flow.observe.read_process(pid).cgroup for pid in surveyor.own_ancestors]
    assert surveyor.protected_units() == set(['spared.service']) | set(
        u for u in (flow.decide.unit_from_cgroup(c) for c in cgroups) if u)
    owners = [gpu_owner.owner_from_cgroup(c) for c in cgroups]
    assert surveyor.protected_containers() == set(
        o.id for o in owners if o.kind == gpu_owner.CONTAINER and o.id)


def test_a_runtimes_name_makes_a_new_owner_record_never_changes_the_cgroups():
    cid = 'c' * 64
    owner = gpu_owner.owner_from_cgroup('0::/system.slice/docker-%s.scope\n' % cid)
    asked = {('docker', cid): {'name': 'hog', 'restart_policy': 'always', 'pid': 4343, 'init_cgroup': 'x'}}
    named = gpu_survey.named_owner(owner, 1.0, asked)
    assert (named.name, named.restart_policy, named.cli_error) == ('hog', 'always', None)
    assert owner.name is None and owner.restart_policy is None and 'pid' not in named.as_result()
    plain = gpu_owner.owner_from_cgroup('0::/system.slice/sglang.service\n')
    assert gpu_survey.named_owner(plain, 1.0, asked) is plain
