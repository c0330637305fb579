# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The container_takeover filter: which hand-started servers to adopt run in a docker or podman container.

The logic is in plugins/plugin_utils/container.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: container_takeover
author: gpuops.reclaim maintainers
version_added: "1.1.0"
short_description: split the hand-started servers to adopt into docker or podman containers and the rest
description:
  - Takes the result of P(gpuops.reclaim.server_takeover#filter) and moves every process to adopt that runs in a
    docker or podman container (known from the GPU holders' cgroup owner, which the runtime confirms) into
    C(containers), one entry per container, to be stopped through its runtime instead of signalled.
  - A port owner in a container's scope that holds none of the server's GPUs is refused (nothing confirms it).
positional: _input
options:
  _input:
    description: server_takeover's result.
    type: dict
    required: true
  port_owners:
    description: The port's listeners (the port_owner module's owners).
    type: list
    elements: dict
    required: true
  holders:
    description: M(gpuops.reclaim.gpu_holders)' holders, each with its C(owner).
    type: list
    elements: dict
    required: true
  own:
    description:
      - >-
        The ID of the managed unit's own container (docker, whose containers sit outside the unit's cgroup;
        the role reads it from the ID file of the unit's C(docker run)). Its processes are the server's,
        in C(ours), never adopted and never strays. Empty for none.
    type: str
    default: ''
"""

EXAMPLES = r"""
takeover: "{{ owners | gpuops.reclaim.server_takeover(holders, 'sglang.service', patterns) | gpuops.reclaim.container_takeover(owners, holders) }}"
"""

RETURN = r"""
_value:
  description:
    - The takeover with C(adopt) less the containers' processes and C(containers) (runtime, id, name, pids, why).
    - With O(own), the own container's GPU holders move from C(adopt) and C(strays) to C(ours).
  type: dict
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.container import container_takeover


class FilterModule(object):
    def filters(self):
        return {'container_takeover': container_takeover}
