# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The flags_diff filter: wanted flags an inference server does not run with.

The logic is in plugins/plugin_utils/flags.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: flags_diff
author: gpuops.reclaim maintainers
version_added: "1.0.0"
short_description: wanted flags an inference server does not run with
description:
  - Compares wanted flags with the server's own report (SGLang C(/get_server_info)).
  - Numbers compare by value (C(0.93) equals C("0.93")); V(false) or V(null) matches an unset field.
  - Flags the server does not report are not judged.
positional: _input, server_info
options:
  _input:
    description: The wanted flags.
    type: dict
    required: true
  server_info:
    description: The server's report.
    type: dict
    required: true
"""

EXAMPLES = r"""
# ["mem_fraction_static: wanted 0.93, running 0.85"]
differ: "{{ {'mem_fraction_static': 0.93} | gpuops.reclaim.flags_diff({'mem_fraction_static': 0.85}) }}"
"""

RETURN = r"""
_value:
  description: One sentence per flag whose running value differs; empty when all agree.
  type: list
  elements: str
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.flags import flags_diff


class FilterModule(object):
    def filters(self):
        return {'flags_diff': flags_diff}
