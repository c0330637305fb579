# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The escape_text filter: what a node's users control (process titles, command lines, cgroup
names) printed as one field of one line.

The rule is plugins/module_utils/gpu_text.py's (the modules use the same function); this file
holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: escape_text
author: gpuops.reclaim maintainers
version_added: "1.0.0"
short_description: write control characters of a node's text as visible escapes
description:
  - Process titles, command lines and cgroup names are chosen by a node's users. A newline in one
    could forge a line of a printed table; an ESC sequence could rewrite what a terminal shows.
  - Every control, format, separator, surrogate, private-use or unassigned character (C0 and C1
    controls, DEL, the Unicode line and paragraph separators, the bidirectional overrides and
    isolates, zero-width characters) becomes C(\n), C(\r), C(\t), C(\xNN), C(\uNNNN) or
    C(\UNNNNNNNN). Printable text, a plain space included, is unchanged.
positional: _input
options:
  _input:
    description: The text (None stays None; bytes are decoded as UTF-8; anything else is turned to text first).
    type: raw
    required: true
"""

EXAMPLES = r"""
# 'worker\nGPU 2: free' prints on one line
msg: "PID {{ item.pid }} ({{ item.cmdline | gpuops.reclaim.escape_text }})"
"""

RETURN = r"""
_value:
  description: The text, safe to print as one field of one line.
  type: str
"""

from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text


class FilterModule(object):
    def filters(self):
        return {'escape_text': escape_text}
