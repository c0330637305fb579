# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write one JSON summary of a reclaim.yml run on the controller (see the reclaim_summary module docs).

An action plugin, not copy + a template: it reads the run's results from hostvars in
Python and writes the file here without running a module, so the summary costs one
task for the whole run rather than a module round trip and a Jinja walk over every host.
For the same reason it also prints every host's before/after table (report: true): one
task on the controller instead of a report task per host (bench/run fleet).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import json
import os
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

from ansible_collections.gpuops.reclaim.plugins.filter.gpu_report import gpu_report
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text

GPU_FIELDS = ('index', 'memory_used_mib', 'memory_total_mib', 'free', 'holders')
# What the run recorded on each host: registered results and set_fact values, data already
# (read raw, untemplated: templating a gpu_reclaim result through hostvars cost about 12 ms
# per host here, 12 s on 1,000 hosts).
RUN_VARS = ('gpus_free_result', 'reclaim__strays_result', 'reclaim__failure', 'reclaim__batch', 'inference_service_info',
            'inference_service__reasons')
# Inventory variables, which may be templates: read through hostvars, only on hosts with a server.
SERVER_VARS = ('inference_service_name', 'inference_service_flags')


def _gpus(rows):
    return [dict((key, row.get(key)) for key in GPU_FIELDS) for row in rows or []]


def run_vars(hostvars, name):
    """The variables host_record and host_report read, for host NAME ({} for a host not in the inventory)."""
    if name not in hostvars:
        return {}
    raw = hostvars.raw_get(name)
    found = dict((key, raw[key]) for key in RUN_VARS if key in raw)
    if 'inference_service_name' in raw:
        templated = hostvars[name]
        found.update((key, templated[key]) for key in SERVER_VARS if key in templated)
    return found


def _reclaim_record(reclaim):
    return {'changed': bool(reclaim.get('changed')),
            'gpus_before': _gpus(reclaim.get('before')),
            'gpus_after': _gpus(reclaim.get('after')),
            'elapsed_s': reclaim.get('elapsed_s'),
            'actions': list(reclaim.get('actions') or [])}


def stray_reclaim(host):
    """The host's stray reclaim (play 1): kept as reclaim__strays_result on a host whose server the
    role went on to converge (its own reclaims register gpus_free_result again), else
    gpus_free_result; None when there was none."""
    return host.get('reclaim__strays_result') or host.get('gpus_free_result')


def host_record(host):
    """The summary of one host from its variables (a mapping).

    The top-level GPUs and actions are the stray reclaim's (play 1). On a host whose server
    the inference_service role converged, that result was kept as reclaim__strays_result and
    gpus_free_result is the role's own last reclaim, recorded under server.gpus_reclaim."""
    strays = host.get('reclaim__strays_result')
    reclaim = stray_reclaim(host) or {}
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
        reasons = list(host.get('inference_service__reasons') or [])
        server_reclaim = host.get('gpus_free_result') if strays else None
        record['server'] = {'name': host.get('inference_service_name'),
                            'flags': host.get('inference_service_flags') or {},
                            'max_total_num_tokens': info.get('max_total_num_tokens'),
                            # Why the role (re)started it, or in check mode would: empty when converged.
                            'restart_reasons': reasons,
                            'gpus_reclaim': _reclaim_record(server_reclaim) if server_reclaim else None}
        # A drift report reads `changed`: a server that needs (or got) a restart is a change.
        record['changed'] = record['changed'] or bool(reasons) or bool(server_reclaim and server_reclaim.get('changed'))
    return record


def host_report(name, host, record, check_mode):
    """The table of one host's stray reclaim (play 1), each line prefixed with the host's name; a
    host that did nothing is one line. A host whose server the role converged printed the
    tables of the role's own reclaims already."""
    reclaim = stray_reclaim(host)
    if not reclaim:
        lines = ['== %s ==' % record['status']]
    else:
        lines = gpu_report(reclaim, title='GPUs NOT freed' if reclaim.get('failed') else None, check_mode=check_mode,
                           brief=True)
    # gpu_report escapes its lines (holder titles and cgroup names are the node users'); the
    # prefix and the status are escaped here, so no printed line holds a control character.
    return [escape_text('%s: %s' % (name, line)) for line in lines]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(('path', 'hosts', 'check_mode', 'report'))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self._task.args
        path, hosts = args.get('path'), args.get('hosts')
        if not isinstance(hosts, list) or not isinstance(path, (str, type(None))):
            raise AnsibleActionFail('reclaim_summary: hosts (a list) is required and path must be a file name '
                                    '(empty: no file), got path=%r hosts=%r' % (path, hosts))
        try:
            check_mode, report = boolean(args.get('check_mode', False)), boolean(args.get('report', False))
        except TypeError as exc:
            raise AnsibleActionFail('reclaim_summary: check_mode and report must be booleans: %s' % exc)
        hostvars = task_vars['hostvars']
        records, failed_batches, lines = {}, [], []
        for name in hosts:
            host = run_vars(hostvars, name)
            records[name] = host_record(host)
            if report:
                lines.extend(host_report(name, host, records[name], check_mode))
            batch = host.get('reclaim__batch')
            if batch and list(batch) not in failed_batches:
                failed_batches.append(list(batch))
        summary = {
            'playbook': 'gpuops.reclaim.reclaim',
            'check_mode': check_mode,
            'finished': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'),
            'server_batches_with_failures': failed_batches,
            'hosts': records,
        }
        result.update(changed=False, path=None, hosts=len(records), failed=False,
                      failed_hosts=sorted(name for name, rec in records.items() if rec['status'] != 'ok'))
        if report:
            # Shown without -v, as debug's msg is.
            result.update(msg=lines, _ansible_verbose_always=True)
        if path:
            result['path'] = self._write(path, summary)
        return result

    @staticmethod
    def _write(path, summary):
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
        return path
