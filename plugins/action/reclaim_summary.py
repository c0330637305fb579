# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write one JSON summary of a reclaim.yml run on the controller (see the reclaim_summary module docs).

An action plugin, not copy + a template: it reads the run's results from hostvars in
Python and writes the file here without running a module, so the summary costs one
task for the whole run rather than a module round trip and a Jinja walk over every host.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import json
import os
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

GPU_FIELDS = ('index', 'memory_used_mib', 'memory_total_mib', 'free', 'holders')


def _gpus(rows):
    return [dict((key, row.get(key)) for key in GPU_FIELDS) for row in rows or []]


def host_record(host):
    """The summary of one host from its variables (a mapping)."""
    reclaim = host.get('gpus_free_result') or {}
    failure = host.get('reclaim__failure')
    record = {
        'status': 'failed' if failure else 'ok' if reclaim else 'no result (unreachable)',
        'changed': bool(reclaim.get('changed')),
        'gpus_before': _gpus(reclaim.get('before')),
        'gpus_after': _gpus(reclaim.get('after')),
        'reclaim_elapsed_s': reclaim.get('elapsed_s'),
        'actions': list(reclaim.get('actions') or []),
        'remaining': [holder.get('pid') for holder in reclaim.get('remaining') or []],
        'server': None,
        'failure': failure,
    }
    if host.get('inference_service_name') is not None:
        info = host.get('inference_service_info') or {}
        record['server'] = {'name': host.get('inference_service_name'),
                            'flags': host.get('inference_service_flags') or {},
                            'max_total_num_tokens': info.get('max_total_num_tokens')}
    return record


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(('path', 'hosts', 'check_mode'))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self._task.args
        path, hosts = args.get('path'), args.get('hosts')
        if not path or not isinstance(hosts, list):
            raise AnsibleActionFail('reclaim_summary: path (a file name) and hosts (a list) are required, got '
                                    'path=%r hosts=%r' % (path, hosts))
        hostvars = task_vars['hostvars']
        records, failed_batches = {}, []
        for name in hosts:
            host = hostvars[name] if name in hostvars else {}
            records[name] = host_record(host)
            batch = host.get('reclaim__batch')
            if batch and list(batch) not in failed_batches:
                failed_batches.append(list(batch))
        summary = {
            'playbook': 'gpuops.reclaim.reclaim',
            'check_mode': bool(args.get('check_mode')),
            'finished': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'),
            'server_batches_with_failures': failed_batches,
            'hosts': records,
        }
        path = os.path.abspath(os.path.expanduser(path))
        try:
            handle, temp = tempfile.mkstemp(prefix='.gpuops-reclaim-', dir=os.path.dirname(path))
            with os.fdopen(handle, 'w') as out:
                json.dump(summary, out, indent=2, sort_keys=True, default=str)
                out.write('\n')
            os.chmod(temp, 0o644)
            os.replace(temp, path)
        except OSError as exc:
            raise AnsibleActionFail('reclaim_summary: cannot write %s: %s' % (path, exc))
        result.update(changed=False, path=path,
                      hosts=len(records), failed=False,
                      failed_hosts=sorted(name for name, rec in records.items() if rec['status'] != 'ok'))
        return result
