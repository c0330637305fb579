"""gpu_holders: every key it returns is in its RETURN documentation, and every documented key
is returned by some path (GPUs held, free, with health)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import types

from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_flow import survey_result
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_backend import GpuBackend
from ansible_collections.gpuops.reclaim.plugins.modules import gpu_holders

from ..module_utils.test_gpu_flow import free, held_by
from .module_run import ANSIBLE_KEYS, documented, keys_of


def holders_results():
    wedged = held_by((10, 'exits-on-term'))
    with_health = survey_result(free())
    # health: true (a backend that reads no health says so for every read)
    gpu_holders.add_health(with_health['gpus'], types.SimpleNamespace(backend=GpuBackend(), nvml_timeout=1),
                           {'xid_since': None, 'xid_log': None})
    return [survey_result(wedged), survey_result(free()), with_health]


def test_gpu_holders_returns_exactly_what_it_documents():
    doc = documented(gpu_holders)
    results = holders_results()
    assert keys_of(results) - ANSIBLE_KEYS == set(doc) - ANSIBLE_KEYS
    assert keys_of(row for r in results for row in r['gpus']) == set(doc['gpus']['contains'])
    assert keys_of(h for r in results for h in r['holders']) == set(doc['holders']['contains'])
