# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drain_say filter: one sentence for a drain_record entry.

The logic is in plugins/plugin_utils/drain.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: drain_say
author: gpuops.reclaim maintainers
version_added: "1.1.0"
short_description: one sentence for how a planned stop of the inference server drained
description:
  - "E.g. C(stopped with 2 requests in flight; drained and stopped in 6.4 s (drain timeout 30 s)); an empty
    string for null."
positional: _input
options:
  _input:
    description: The C(drain) entry (drain_record's), or null.
    type: dict
    required: true
"""

EXAMPLES = r"""
msg: "{{ inference_service_server.drain | gpuops.reclaim.drain_say }}"
"""

RETURN = r"""
_value:
  description: The sentence.
  type: str
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.drain import drain_say


class FilterModule(object):
    def filters(self):
        return {'drain_say': drain_say}
