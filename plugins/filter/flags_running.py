# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The flags_running filter: the wanted flags as an inference server reports them running.

The logic is in plugins/plugin_utils/flags.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: flags_running
author: gpuops.reclaim maintainers
version_added: "1.0.0"
short_description: the wanted flags as an inference server reports them running
description:
  - Picks from a server's own report (SGLang C(/get_server_info)) the fields named by the wanted flags.
  - C(--mem-fraction-static), C(mem-fraction-static) and C(mem_fraction_static) all name the field C(mem_fraction_static).
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
# {"mem_fraction_static": 0.93, "tp_size": 8}
running: "{{ {'mem_fraction_static': 0.93, 'tp_size': 8} | gpuops.reclaim.flags_running(server_info) }}"
"""

RETURN = r"""
_value:
  description: Field name to the value the server reports, for the wanted flags it reports.
  type: dict
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.flags import flags_running


class FilterModule(object):
    def filters(self):
        return {'flags_running': flags_running}
