# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The systemd_quote filter: quote a word for a systemd ExecStart= line.

The logic is in plugins/plugin_utils/flags.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: systemd_quote
author: gpuops.reclaim maintainers
version_added: "1.0.0"
short_description: quote a word for a systemd ExecStart= line
description:
  - Quotes one word, or each word of a list, so that systemd's ExecStart= parser gives it back unchanged.
  - C(%) and C($) are doubled because systemd would expand them as specifiers and variables.
positional: _input
options:
  _input:
    description: A word or a list of words.
    type: raw
    required: true
"""

EXAMPLES = r"""
# '"a b"'
quoted: "{{ 'a b' | gpuops.reclaim.systemd_quote }}"
# ExecStart line from a flags dict
exec_start: "{{ (['/usr/bin/fakeserve'] + flags | gpuops.reclaim.cli_flags) | gpuops.reclaim.systemd_quote | join(' ') }}"
"""

RETURN = r"""
_value:
  description: The quoted word, or the list of quoted words.
  type: raw
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.flags import systemd_quote


class FilterModule(object):
    def filters(self):
        return {'systemd_quote': systemd_quote}
