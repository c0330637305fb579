# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The server_progress filter: an inference server's ranks' GPU memory as a progress fact.

The logic is in plugins/plugin_utils/server_progress.py; this file holds the filter and its documentation.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: server_progress
author: gpuops.reclaim maintainers
version_added: "1.1.0"
short_description: an inference server's ranks' GPU memory, compared with the reading kept from the last observation
description:
  - "Sums the MiB that NVML charges to the unit's processes on the server's GPUs, compares them with the reading the
    last observation kept (for the same start of the unit's main process) and returns the reading to keep and the
    fact: the MiB now, the kept MiB, and how long ago the memory was last seen growing."
  - "A server whose ranks' memory grew is progressing even while its log is quiet (issue 30)."
positional: _input, previous, holders, unit, gpus
options:
  _input:
    description: The observation wait_healthy.py prints in its observe mode.
    type: dict
    required: true
  previous:
    description: The reading the last observation kept, or null.
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
  own:
    description: The ID of the unit's own docker container, whose GPU holders are the server's.
    type: str
    default: ""
"""

EXAMPLES = r"""
progress: "{{ observed | gpuops.reclaim.server_progress(kept, survey.holders, 'sglang.service', ['0', '1']) }}"
"""

RETURN = r"""
_value:
  description: "C(keep): the reading to keep (C(main), C(mib), C(seen_epoch), C(grew_epoch)) or null; C(fact): C(mib),
    C(previous_mib), C(since_s), C(grew_age_s), or null when the memory could not be read."
  type: dict
"""

from ansible_collections.gpuops.reclaim.plugins.plugin_utils.server_progress import memory_progress, ranks_mib


def server_progress(observed, previous, holders, unit, gpus, own=''):
    return memory_progress(previous, observed, ranks_mib(holders, gpus, unit, own))


class FilterModule(object):
    def filters(self):
        return {'server_progress': server_progress}
