# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drain_record filter: how a planned stop of the inference server drained.

The logic is in plugins/plugin_utils/drain.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: drain_record
author: gpuops.reclaim maintainers
version_added: "1.1.0"
short_description: how a planned stop of the inference server drained
description:
  - "The C(drain) entry of the fact C(inference_service_server): C(in_flight) (the requests the engine counted
    in flight when the stop began, null when they could not be read, C(in_flight_error) saying why),
    C(seconds) (from the stop's start to the unit inactive), C(timeout) (the drain timeout) and C(killed)
    (systemd's stop timeout ran out and it SIGKILLed the unit). Null when the stop found the unit not running."
positional: _input, drain_timeout
options:
  _input:
    description: The output of the role's drain_stop.py.
    type: dict
    required: true
  drain_timeout:
    description: C(inference_service_drain_timeout).
    type: raw
    required: true
"""

EXAMPLES = r"""
drain: "{{ stopped.stdout | from_json | gpuops.reclaim.drain_record(30) }}"
"""

RETURN = r"""
_value:
  description: The C(drain) entry, or null.
  type: dict
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.drain import drain_record


class FilterModule(object):
    def filters(self):
        return {'drain_record': drain_record}
