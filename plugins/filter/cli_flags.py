# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cli_flags filter: render an inference server's flags dict as command-line words.

The logic is in plugins/plugin_utils/flags.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: cli_flags
author: gpuops.reclaim maintainers
version_added: "1.0.0"
short_description: render an inference server's flags dict as command-line words
description:
  - Turns a dict of server flags into the words of a command line, as SGLang and vLLM expect them.
  - Keys are sorted so the same flags always give the same command line.
  - A key C(mem_fraction_static) becomes C(--mem-fraction-static); a key that already starts with C(--) is used verbatim.
  - "Values: V(true) gives the bare flag; V(false) or V(null) leaves the flag out;
    a list repeats the flag once per item; a dict is passed as compact JSON; anything else gives C(--flag value)."
positional: _input
options:
  _input:
    description: The flags, name to value.
    type: dict
    required: true
  positional:
    description:
      - Flag names whose value is a bare positional word, placed first in the order given
        (vLLM's C(model) in C(vllm serve MODEL)). The role takes them from its engine table.
    type: list
    elements: str
    default: []
  grouped:
    description: Return one list per flag (the flag and its value) instead of one flat list.
    type: bool
    default: false
"""

EXAMPLES = r"""
# ['--enable-hierarchical-cache', '--hicache-size', '300', '--mem-fraction-static', '0.93', '--tp-size', '8']
argv: "{{ {'tp_size': 8, 'mem_fraction_static': 0.93, 'enable_hierarchical_cache': true,
           'hicache_size': 300, 'disable_cuda_graph': false} | gpuops.reclaim.cli_flags }}"

# ['/models/llama', '--tensor-parallel-size', '2']
vllm_argv: "{{ {'model': '/models/llama', 'tensor_parallel_size': 2} | gpuops.reclaim.cli_flags(positional=['model']) }}"
"""

RETURN = r"""
_value:
  description: The command-line words, or with O(grouped=true) one list of words per flag.
  type: list
  elements: raw
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.flags import cli_flags


class FilterModule(object):
    def filters(self):
        return {'cli_flags': cli_flags}
