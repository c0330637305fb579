"""Hand-built holders (gpu_holder.Holder) for the doubles and the pure rules: a plausible
process holding a context on GPU 0, every field overridable by name."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_holder
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner

DEFAULTS = {
    'pid': 4242, 'start_time': 77, 'name': 'python3', 'cmdline': 'python3 serve.py', 'user': 'root',
    'state': 'sleeping', 'wchan': None, 'ppid': 100, 'parent_name': 'bash', 'unit': None,
    'unit_restart': None, 'unit_active': None, 'gpus': [0], 'context_gpus': [0], 'gpu_memory_mib': None,
    'evidence': ['fd', 'mmap', 'nvml'], 'kind': 'context', 'other_pid_namespace': False, 'owner': None,
    'ignores_sigterm': False, 'sigterm_dropped': False, 'tracer_pid': 0, 'tracer_name': None,
    'protected': False, 'protected_reason': None, 'protected_code': None, 'peer_gpus': [],
}


def make_holder(**overrides):
    """A Holder with DEFAULTS (owner: no owner at all) less `overrides`; an unknown field raises."""
    fields = dict(DEFAULTS, owner=gpu_owner.new_owner(gpu_owner.NONE))
    unknown = set(overrides) - set(fields)
    if unknown:
        raise TypeError('no Holder field %s' % ', '.join(sorted(unknown)))
    fields.update(overrides)
    return gpu_holder.Holder(**fields)
