# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The server_takeover filter: sort the processes on an inference server's port and GPUs.

The logic is in plugins/plugin_utils/engine.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: server_takeover
author: gpuops.reclaim maintainers
version_added: "1.0.0"
short_description: sort the processes on an inference server's port and GPUs
description:
  - "Given who listens on the server's port and who holds its GPUs, says which processes are the
    managed unit's (V(ours)), which are the engine started by hand outside any service unit and
    may be taken over (V(adopt)), which block the start (V(refuse): another program on the port,
    or a GPU held by another service unit), and which are leftovers to free (V(strays))."
  - Open handles (monitors) and protected holders are neither targets nor in the way.
positional: _input, holders, unit, patterns
options:
  _input:
    description: Listeners on the port, each with C(pid), C(start_time), C(name), C(cmdline), C(unit).
    type: list
    elements: dict
    required: true
  holders:
    description: The C(holders) of M(gpuops.reclaim.gpu_holders).
    type: list
    elements: dict
    required: true
  unit:
    description: The managed unit, with its C(.service) suffix.
    type: str
    required: true
  patterns:
    description: Regular expressions matching the engine's process names or command lines; empty adopts nothing.
    type: list
    elements: str
    required: true
  gpus:
    description: The server's GPU indices; holders of none of them are left out. Null keeps all.
    type: list
    elements: str
"""

EXAMPLES = r"""
takeover: "{{ port.owners | gpuops.reclaim.server_takeover(survey.holders, 'sglang.service', ['^sglang::'], gpus=['0', '1']) }}"
"""

RETURN = r"""
_value:
  description: The sorted processes.
  type: dict
  contains:
    ours:
      description: PIDs in the managed unit.
    adopt:
      description: Processes to take over, each with C(pid), C(start_time), C(name), C(cmdline) and C(why).
    refuse:
      description: One sentence per process that blocks the start.
    strays:
      description: Other holders of the server's GPUs, as gpu_holders describes them.
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.engine import server_takeover


class FilterModule(object):
    def filters(self):
        return {'server_takeover': server_takeover}
