# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The flags_unknown filter: wanted server flags the engine does not know, with the closest known one.

The logic is in plugins/plugin_utils/engine.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: flags_unknown
author: gpuops.reclaim maintainers
version_added: "1.0.0"
short_description: wanted server flags the engine does not know, with the closest known one
description:
  - Spells each key of the flags dict as the command line does (C(mem_fraction_static) is
    C(--mem-fraction-static)) and looks it up in the engine's known options.
  - An empty list of known options judges nothing.
positional: _input, known
options:
  _input:
    description: The wanted flags.
    type: dict
    required: true
  known:
    description: The engine's long options (see the engine_help_flags filter).
    type: list
    elements: str
    required: true
  positional:
    description: Flag names given as bare words (not options), which are not judged.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
# [{"key": "mem_fracton_static", "flag": "--mem-fracton-static", "closest": "--mem-fraction-static"}]
unknown: "{{ {'mem_fracton_static': 0.9} | gpuops.reclaim.flags_unknown(['--mem-fraction-static']) }}"
"""

RETURN = r"""
_value:
  description: One entry per unknown flag, sorted by key.
  type: list
  elements: dict
  contains:
    key:
      description: The key in the flags dict.
    flag:
      description: The option it renders as.
    closest:
      description: The most similar known option, or null.
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.engine import flags_unknown


class FilterModule(object):
    def filters(self):
        return {'flags_unknown': flags_unknown}
