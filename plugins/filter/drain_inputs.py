# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drain_inputs filter: a drain timeout the stop timeout does not cover.

The logic is in plugins/plugin_utils/drain.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: drain_inputs
author: gpuops.reclaim maintainers
version_added: "1.1.0"
short_description: a drain timeout that the stop timeout does not cover
description:
  - "C(inference_service_drain_timeout) that is not a whole number of seconds, 0 or more, or that is longer
    than C(inference_service_stop_timeout) (whose SIGKILL would cut the drain): one entry, naming the variable
    and both values."
positional: _input, stop_timeout
options:
  _input:
    description: C(inference_service_drain_timeout).
    type: raw
    required: true
  stop_timeout:
    description: C(inference_service_stop_timeout).
    type: raw
    required: true
"""

EXAMPLES = r"""
problems: "{{ 30 | gpuops.reclaim.drain_inputs(60) }}"
"""

RETURN = r"""
_value:
  description: One C({code, variable, value, msg}) per problem, empty when the timeouts fit.
  type: list
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.drain import drain_inputs_checked


class FilterModule(object):
    def filters(self):
        return {'drain_inputs': drain_inputs_checked}
