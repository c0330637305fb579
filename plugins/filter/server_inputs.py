# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The server_inputs filter: the inference_service inputs that cannot work together.

The logic is in plugins/plugin_utils/server_state.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: server_inputs
author: gpuops.reclaim maintainers
version_added: "1.1.0"
short_description: the inference_service inputs that cannot work together
description:
  - "A health timeout shorter than the probe window, an engine without a generation endpoint: one entry each,
    naming the variable."
positional: _input, probe_period, probe_failures, engine, engine_name
options:
  _input:
    description: C(inference_service_health_timeout).
    type: raw
    required: true
  probe_period:
    description: C(inference_service_probe_period).
    type: raw
    required: true
  probe_failures:
    description: C(inference_service_probe_failures).
    type: raw
    required: true
  engine:
    description: The engine's entry in the role's engine table.
    type: dict
    required: true
  engine_name:
    description: The engine's name.
    type: str
    required: true
"""

EXAMPLES = r"""
problems: "{{ 1800 | gpuops.reclaim.server_inputs(5, 3, engine, 'sglang') }}"
"""

RETURN = r"""
_value:
  description: One C({code, variable, msg}) per problem, empty when the inputs fit.
  type: list
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.server_state import server_inputs_checked


class FilterModule(object):
    def filters(self):
        return {'server_inputs': server_inputs_checked}
