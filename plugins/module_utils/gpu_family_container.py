# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The container runtime family (gpu_family): docker, podman, containerd (nerdctl).

- recognise: the runtimes' cgroup layouts (`recognise`: the systemd driver's
  <runtime>-<id>.scope, the cgroupfs drivers' directories); a runtime with a layout of its own
  brings its own recogniser (a subclass, registered in gpu_families);
- facts: the runtime's inspect (gpu_observe.runtime_details, the row's `inspect`), asked once
  per container and run;
- lever: the runtime's stop (gpu_lever.container_lever, the row's `stop`), never a removal;
- pull: that argv through the actor; the runtime sends the stop signal, waits the grace, then
  SIGKILLs, and returns once the container has exited (rc 0: stopped);
- comeback: the container's restart policy ends with its stop; each container is stopped once
  a run (gpu_respawn.Comebacks.containers).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family as family
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say

_HEX64 = r'[0-9a-f]{64}'
# <runtime prefix>-<id>.scope: the systemd cgroup driver's name for a container's scope.
CONTAINER_SCOPE = re.compile(r'^(docker|libpod|cri-containerd|crio|nerdctl)-(%s)\.scope$' % _HEX64)
SCOPE_RUNTIME = {'docker': 'docker', 'libpod': 'podman', 'cri-containerd': 'cri-containerd',
                 'crio': 'cri-o', 'nerdctl': 'containerd'}
# Runtimes' own helper scopes (conmon): they hold no GPU, and they are not the container.
_MONITOR_SCOPE = re.compile(r'^(?:libpod|crio)-conmon-%s\.scope$' % _HEX64)
_PODMAN_CGROUPFS = re.compile(r'^libpod-(%s)$' % _HEX64)
BARE_ID = re.compile(r'^(%s)$' % _HEX64)

# How long a runtime's stop may take beyond the grace it was given (it SIGKILLs at the grace,
# then waits for the container to exit and its cgroup to go).
STOP_SLACK_S = 30


class ContainerRuntime(family.RuntimeOwned):
    """A container of a runtime that stops it from here (a row of gpu_lever.RUNTIMES with a
    `stop`). A new runtime subclasses this with its own `runtimes` row and `recognise`."""

    name = 'container'
    kinds = (gpu_owner.CONTAINER,)
    stage = family.OWNERS
    option = 'stop_containers'

    @staticmethod
    def recognise(parts, index, path):
        part = parts[index]
        found = CONTAINER_SCOPE.match(part)
        if found:
            runtime = SCOPE_RUNTIME[found.group(1)]
            return gpu_owner.new_owner(gpu_owner.CONTAINER, path, runtime=runtime, id=found.group(2), unit=part,
                                       manager=gpu_owner.SYSTEM_MANAGER,
                                       namespace='default' if runtime == 'containerd' else None,
                                       guest_unit=gpu_owner.inner_unit(gpu_owner.path_parts(path)[index + 1:]))
        if _MONITOR_SCOPE.match(part):
            return gpu_owner.new_owner(gpu_owner.SCOPE, path, unit=part, manager=gpu_owner.SYSTEM_MANAGER)
        found = _PODMAN_CGROUPFS.match(part)
        if found:
            return gpu_owner.new_owner(gpu_owner.CONTAINER, path, runtime='podman', id=found.group(1))
        found = BARE_ID.match(part)
        if found and index > 0:
            return _cgroupfs_container(parts[index - 1], found.group(1), path)
        return None

    def lever(self, holder, context):
        return lever.container_lever(holder, context.match, context.protected_ids, grace=context.grace)

    def pull(self, chosen, owned, ladder):
        grace = ladder.grace()
        result, changed = ladder.actor.run(chosen.argv, grace + STOP_SLACK_S)
        if ladder.actor.recording:
            return say.step(lever.WOULD_STOP_CONTAINER, grace=grace), True
        if changed:
            return say.step(lever.CONTAINER_STOPPED), True
        return result, False

    @staticmethod
    def seen(chosen, watch):
        return chosen.key in watch.containers

    @staticmethod
    def comeback(chosen, changed, watch):
        watch.containers.add(chosen.key)

    def phrase(self, chosen):
        owner = chosen.owner
        return 'stop_container', gpu_owner.describe(owner), {
            'container': owner.id, 'runtime': owner.runtime, 'name': owner.name}


def _cgroupfs_container(parent, container_id, path):
    """A container id directly under its runtime's cgroupfs parent directory."""
    if parent == 'docker':
        return gpu_owner.new_owner(gpu_owner.CONTAINER, path, runtime='docker', id=container_id)
    if parent == 'libpod_parent':
        return gpu_owner.new_owner(gpu_owner.CONTAINER, path, runtime='podman', id=container_id)
    # containerd (ctr, nerdctl with the cgroupfs driver) names the parent after its namespace.
    return gpu_owner.new_owner(gpu_owner.CONTAINER, path, runtime='containerd', id=container_id, namespace=parent)


FAMILY = ContainerRuntime()
