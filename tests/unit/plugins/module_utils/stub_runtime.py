"""A stub container runtime, `stubrt`, added the way docs/DEVELOPING.md's "A new runtime" recipe
says: one family module (this file) with its cgroup layout, its facts, its table row and its
stop; nothing else in plugins/ knows it. test_stub_runtime.py registers it and runs the ladder
over it.

Its cgroup layout, as a runtime with a systemd cgroup driver names a container's scope:
`/stubrt.slice/stubrt-<12 hex>.scope`. Its facts are what its `stubrtctl inspect` would answer
(canned here: a unit test runs no CLI), and they confirm the container the way a real
runtime's do: the init PID it names sits in that same scope (gpu_trust.confirm).
"""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import re

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family_container
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner

_SCOPE = re.compile(r'^stubrt-([0-9a-f]{12})\.scope$')
INIT_PID = 4343


def cgroup_of(container_id):
    """The /proc/PID/cgroup text of a process in the stub runtime's container."""
    return '0::/stubrt.slice/stubrt-%s.scope\n' % container_id


class StubRuntime(gpu_family_container.ContainerRuntime):
    """A container runtime: recognised by its scope, confirmed by its inspect, stopped by its CLI."""

    name = 'stubrt'
    runtime = 'stubrt'
    row = {
        'cli': 'stubrtctl',
        'inspect': ['stubrtctl', 'inspect', '{id}'],
        'parse': None,
        'stop': ['stubrtctl', 'stop', '--time', '{grace}', '{id}'],
        'watch': gpu_lever.WATCH_CONTAINER,
    }

    def __init__(self, policy='always'):
        self.policy = policy
        self.asked = []      # the owners whose facts were read (a runtime is asked once per run)

    def owns(self, owner):
        return owner.runtime == self.runtime and owner.kind == gpu_owner.CONTAINER

    @staticmethod
    def recognise(parts, index, path):
        found = _SCOPE.match(parts[index])
        if not found:
            return None
        return gpu_owner.new_owner(gpu_owner.CONTAINER, path, runtime='stubrt', id=found.group(1),
                                   unit=parts[index], manager=gpu_owner.SYSTEM_MANAGER)

    def facts(self, owner, timeout):
        self.asked.append(owner.id)
        return {'name': 'stub-%s' % owner.id[:4], 'restart_policy': self.policy, 'pid': INIT_PID,
                'init_cgroup': cgroup_of(owner.id)}
