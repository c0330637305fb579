# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The server_say filter: sentences for an inference server's state and restart reasons.

The logic is in plugins/plugin_utils/server_state.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: server_say
author: gpuops.reclaim maintainers
version_added: "1.1.0"
short_description: sentences for an inference server's state and restart reasons
description:
  - The one place the codes of M(gpuops.reclaim.server_state) become sentences.
positional: _input
options:
  _input:
    description: server_state's or server_after's result.
    type: dict
    required: true
  health_timeout:
    description: The health timeout, named in the sentence of a loading server.
    type: raw
"""

EXAMPLES = r"""
msg: "{{ (state | gpuops.reclaim.server_say(1800)).reasons | join('; ') }}"
"""

RETURN = r"""
_value:
  description: C(state) (one line) and C(reasons) (one sentence per restart reason).
  type: dict
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.server_state import server_say


class FilterModule(object):
    def filters(self):
        return {'server_say': server_say}
