# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gpus_free role's before/after table, from one gpu_reclaim result.

A filter, not a Jinja template: on a fleet the report runs once per host, and the same
table built in Jinja cost the controller about ten times more (bench/run fleet).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: gpu_report
author: gpuops.reclaim maintainers
version_added: "1.0.0"
short_description: a gpu_reclaim result as before/after lines a person reads
description:
  - One title line, one line per GPU (memory before, after and whether it is free, holders by PID and name,
    their unit and whether they are protected), one line per action with its time and result.
  - Holders are named from the module's first survey (its C(holders)), since after acting they are gone.
positional: _input
options:
  _input:
    description: A M(gpuops.reclaim.gpu_reclaim) result.
    type: dict
    required: true
  title:
    description: The title; by default says what happened (already free, plan, reclaimed, NOT freed).
    type: str
  check_mode:
    description: The result comes from check mode (no after column, the title says plan).
    type: bool
    default: false
  brief:
    description:
      - A result that did nothing is one line, listing each GPU's memory, or saying that no GPU was
        selected (every one excluded); a result that acted or failed keeps its whole table.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Report
  ansible.builtin.debug:
    msg: "{{ reclaimed | gpuops.reclaim.gpu_report(check_mode=ansible_check_mode) }}"
"""

RETURN = r"""
_value:
  description: The lines of the report.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text


def _holder_names(holders):
    """PID -> 'name/unit [protected]', from the survey made before acting (after it they are gone)."""
    names = {}
    for holder in holders or []:
        word = (holder.get('cmdline') or '').split(' ')[0]
        name = word if word.startswith(holder.get('name') or '') and word else holder.get('name')
        unit = holder.get('unit')
        suffix = ('/' + unit if unit else '') + (' [protected]' if holder.get('protected') else '')
        names[holder.get('pid')] = '%s%s' % (name, suffix)
    return names


def _action_line(action):
    target = action.get('pid', action.get('unit', action.get('gpu', action.get('target', ''))))
    return '  %6.2fs %s %s %s: %s' % (float(action.get('at_s') or 0), action.get('step', '?'), target,
                                      action.get('name', ''), action.get('result', ''))


def gpu_report(result, title=None, check_mode=False, brief=False):
    """Lines: a title, one line per GPU (before -> after, holders by name), one per action.

    With `brief`, a result that did nothing is one line (no GPU selected, or every one already
    free): a fleet's report is read for what changed."""
    if not isinstance(result, dict):
        raise AnsibleFilterError('gpu_report: expected a gpu_reclaim result (a dict), got %s' % type(result).__name__)
    before = result.get('before') or []
    if brief and not result.get('failed') and not result.get('actions'):
        if not before:
            return ['== no GPU to free: every GPU is excluded (an inference server\'s) or none was selected ==']
        if all(row.get('free') for row in before):
            return ['== GPUs already free, nothing to do: %s ==' % ', '.join(
                'GPU %s %s/%s MiB' % (row.get('index'), row.get('memory_used_mib'), row.get('memory_total_mib'))
                for row in before)]
    after = {} if check_mode else dict((row.get('index'), row) for row in result.get('after') or [])
    actions = result.get('actions') or []
    if title is None:
        if all(row.get('free') for row in before) and not actions:
            title = 'GPUs already free, nothing to do'
        elif check_mode:
            title = 'Reclaim plan (check mode, nothing signalled)'
        elif result.get('failed'):
            title = 'GPUs NOT freed'
        else:
            title = 'GPUs reclaimed'
    elapsed = result.get('elapsed_s')
    lines = ['== %s%s ==' % (title, '' if check_mode or elapsed is None else ' in %s s' % elapsed)]
    names = _holder_names(result.get('holders'))
    for row in before:
        line = 'GPU %s: %s/%s MiB' % (row.get('index'), row.get('memory_used_mib'), row.get('memory_total_mib'))
        end = after.get(row.get('index'))
        if end is not None:
            line += ' -> %s MiB %s' % (end.get('memory_used_mib'), 'free' if end.get('free') else 'STILL HELD')
        else:
            line += ' free' if row.get('free') else ' held'
        if row.get('holders'):
            line += '  holders: ' + ' '.join('%s(%s)' % (pid, names.get(pid, '?')) for pid in row['holders'])
        lines.append(line)
    lines.extend(_action_line(action) for action in actions)
    # Holder names, units and action results carry what a node's users chose (titles, command
    # lines, cgroup names): escaped, each stays on its line and cannot forge another (issue 22).
    return [escape_text(line) for line in lines]


class FilterModule(object):
    def filters(self):
        return {'gpu_report': gpu_report}
