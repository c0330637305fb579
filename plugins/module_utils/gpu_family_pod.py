# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pod family (gpu_family): a container of a Kubernetes pod, the kubelet's.

- recognise: gpu_owner (kubepods anywhere root named: the kubelet's, whatever is below);
- facts: crictl inspect (gpu_observe.runtime_details): the pod's namespace, name and uid;
- lever: none from here, ever: the pod is deleted through the Kubernetes API by a person
  (gpu_lever.by_hand: DELETE_POD); its holders are never signalled (gpu_decide's POD_SHIELD);
- comeback: the kubelet restarts what is killed; nothing is pulled, so nothing is watched.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family as family
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner


class Pod(family.RuntimeOwned):

    name = 'pod'
    kinds = (gpu_owner.POD,)

    def lever(self, holder, context):
        return lever.by_hand(holder)


FAMILY = Pod()
