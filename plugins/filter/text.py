# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""escape_text for the roles' messages: what a node's users control (process titles, command
lines, cgroup names) printed as one field of one line. The rule is module_utils/gpu_text.py's;
docs in the sidecar escape_text.yml."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text


class FilterModule(object):
    def filters(self):
        return {'escape_text': escape_text}
