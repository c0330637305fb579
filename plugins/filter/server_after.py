# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The server_after filter: an inference server's state at the end of a run, as the role publishes it.

The logic is in plugins/plugin_utils/server_state.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: server_after
author: gpuops.reclaim maintainers
version_added: "1.1.0"
short_description: an inference server's state at the end of a run, as the role publishes it
description:
  - "The fact C(inference_service_server): C(state), C(code), C(age_s), C(last_progress), C(time_to_serve_s)
    (from the start to the first generated token when this run started it) and C(ttft_s)."
positional: _input
options:
  _input:
    description: server_state's result at the start of the run.
    type: dict
    required: true
  waited:
    description: wait_healthy.py's result of the wait (for a loading server, or after the start).
    type: dict
  restarted:
    description: This run started the server and it came up.
    type: bool
    default: false
  unit_age_s:
    description: The age of the unit's main process now.
    type: float
"""

EXAMPLES = r"""
inference_service_server: "{{ state | gpuops.reclaim.server_after(waited, restarted=true) }}"
"""

RETURN = r"""
_value:
  description: The published fact.
  type: dict
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.server_state import server_after


class FilterModule(object):
    def filters(self):
        return {'server_after': server_after}
