# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The server_state filter: an inference server's state from facts, not from one /health answer.

The logic is in plugins/plugin_utils/server_state.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: server_state
author: gpuops.reclaim maintainers
version_added: "1.1.0"
short_description: an inference server's state from facts, not from one /health answer
description:
  - "From the unit (systemd's start of its main process), a window of /health probes, one completion, the
    server's last log line and the ranks' GPU contexts: V(loading) (younger than the health timeout, no 200 yet:
    wait, never stop), V(serving), V(stalled) (older, no 200; or its completion hangs), V(restarting),
    V(stopped) or V(failed) (a rank's GPU without a context of the unit), with a reason code."
positional: _input, holders, unit, gpus, health_timeout
options:
  _input:
    description: The observation wait_healthy.py prints in its observe mode.
    type: dict
    required: true
  holders:
    description: The C(holders) of M(gpuops.reclaim.gpu_holders).
    type: list
    elements: dict
    required: true
  unit:
    description: The server's unit, with its C(.service) suffix.
    type: str
    required: true
  gpus:
    description: The GPUs its ranks run on.
    type: list
    elements: str
    required: true
  health_timeout:
    description: Seconds a load may take (C(inference_service_health_timeout)).
    type: float
    required: true
  unit_changed:
    description: The wanted unit differs from the installed one (restart at once).
    type: bool
    default: false
  own:
    description: The ID of the unit's own docker container, whose GPU holders are the server's.
    type: str
    default: ""
  memory:
    description:
      - "The C(fact) of M(gpuops.reclaim.server_progress): its ranks' GPU memory and how long ago it last grew. Memory
        that grew more recently than the last log line is the server's last progress."
    type: dict
    default: null
"""

EXAMPLES = r"""
state: "{{ observed | gpuops.reclaim.server_state(survey.holders, 'sglang.service', ['0', '1'], 1800) }}"
"""

RETURN = r"""
_value:
  description: C(state), C(code), C(age_s), C(last_progress), C(ttft_s), C(restart), C(wait_s), C(missing_gpus), C(reasons).
  type: dict
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.server_state import server_state


class FilterModule(object):
    def filters(self):
        return {'server_state': server_state}
