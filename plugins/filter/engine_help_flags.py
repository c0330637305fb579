# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine_help_flags filter: the long options an engine's argparse --help lists.

The logic is in plugins/plugin_utils/engine.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: engine_help_flags
author: gpuops.reclaim maintainers
version_added: "1.0.0"
short_description: the long options an engine's argparse --help lists
description:
  - Reads the help text that SGLang (C(python -m sglang.launch_server --help)) or vLLM
    (C(vllm serve --help=all)) prints and returns every long option of its option column,
    aliases included (C(--tp-size), C(--tp)).
  - Options named inside a description are not counted.
positional: _input
options:
  _input:
    description: The help text.
    type: str
    required: true
"""

EXAMPLES = r"""
known: "{{ help_text | gpuops.reclaim.engine_help_flags }}"
"""

RETURN = r"""
_value:
  description: The long options, sorted.
  type: list
  elements: str
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.engine import engine_help_flags


class FilterModule(object):
    def filters(self):
        return {'engine_help_flags': engine_help_flags}
