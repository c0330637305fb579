# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The container_run filter: the run arguments of an inference server's container.

The logic is in plugins/plugin_utils/container.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: container_run
author: gpuops.reclaim maintainers
version_added: "1.1.0"
short_description: the run arguments of an inference server's container (docker or podman)
description:
  - Turns the inference_service role's container variables into the words that follow C(docker run) or
    C(podman run), before the image, grouped one option per group, always in the same order.
  - GPUs go in each runtime's way, V(docker) C(--gpus '"device=0,1"'), V(cdi) C(--device nvidia.com/gpu=N),
    V(nodes) C(--device /dev/nvidiaN) plus the control nodes and C(CUDA_VISIBLE_DEVICES) with the host's indices.
  - A bad value fails naming it.
positional: _input
options:
  _input:
    description: >-
      A dict with runtime (docker, podman), name, gpus, gpu_mode (docker, cdi, nodes), network, host, port, ipc,
      shm_size, mounts, env, args.
    type: dict
    required: true
"""

EXAMPLES = r"""
# [['--name', 'sglang'], ['--network', 'host'], ['--ipc', 'host'], ['--gpus', '"device=0,1"'], ...]
run_groups: "{{ {'runtime': 'docker', 'name': 'sglang', 'gpus': ['0', '1'], 'gpu_mode': 'docker', 'ipc': 'host'} | gpuops.reclaim.container_run }}"
"""

RETURN = r"""
_value:
  description: The words after C(RUNTIME run), as a list of groups (lists of words).
  type: list
  elements: list
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.container import container_run


class FilterModule(object):
    def filters(self):
        return {'container_run': container_run}
