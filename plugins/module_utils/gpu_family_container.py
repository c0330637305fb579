# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The container runtime family (gpu_family): docker, podman, containerd (nerdctl).

- recognise: gpu_owner's built-in layouts (the systemd driver's <runtime>-<id>.scope, the
  cgroupfs drivers' directories); a runtime with a layout of its own brings a recogniser;
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

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family as family
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say

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
            'container': owner['id'], 'runtime': owner['runtime'], 'name': owner['name']}


FAMILY = ContainerRuntime()
