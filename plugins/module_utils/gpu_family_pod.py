# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pod family (gpu_family): a container of a Kubernetes pod, the kubelet's.

- recognise: kubepods anywhere root named (`recognise`): the kubelet's, whatever is below (its
  pod's uid and container's id read from the parts root named);
- facts: crictl inspect (gpu_observe.runtime_details): the pod's namespace, name and uid;
- lever: none from here, ever: the pod is deleted through the Kubernetes API by a person
  (gpu_lever.by_hand: DELETE_POD); its holders are never signalled (gpu_decide's POD_SHIELD);
- comeback: the kubelet restarts what is killed; nothing is pulled, so nothing is watched.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family as family
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family_container as containers
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner

# kubelet: kubepods[-QOS]-pod<UID with _ for ->.slice (systemd driver), pod<UID> (cgroupfs).
_POD_SLICE = re.compile(r'^kubepods(?:-[a-z]+)?-pod([0-9a-f_]+)\.slice$')
_POD_DIR = re.compile(r'^pod([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$')


class Pod(family.RuntimeOwned):

    name = 'pod'
    kinds = (gpu_owner.POD,)

    @staticmethod
    def recognise(parts, index, path):
        if not parts[index].startswith('kubepods'):
            return None
        uid, container_id, runtime = None, None, None
        for part in parts[index:]:
            found = _POD_SLICE.match(part)
            if found:
                uid = found.group(1).replace('_', '-')
                continue
            found = _POD_DIR.match(part)
            if found:
                uid = found.group(1)
                continue
            found = containers.CONTAINER_SCOPE.match(part)
            if found:
                runtime, container_id = containers.SCOPE_RUNTIME[found.group(1)], found.group(2)
                continue
            found = containers.BARE_ID.match(part)
            if found:
                container_id = found.group(1)
        return gpu_owner.new_owner(gpu_owner.POD, path, runtime=runtime, id=container_id,
                                   pod={'namespace': None, 'name': None, 'uid': uid})

    def lever(self, holder, context):
        return lever.by_hand(holder)


FAMILY = Pod()
