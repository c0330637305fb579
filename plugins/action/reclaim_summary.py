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
            'inference_service__reasons', 'inference_service__adopted', 'inference_service__strays_freed',
            'inference_service__containers_stopped', 'inference_service_server')
# Inventory variables, which may be templates: read through hostvars, only on hosts with a server.
SERVER_VARS = ('inference_service_name', 'inference_service_flags', 'inference_service_gpus')


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


def adoption_record(adopted):
    """What the inference_service role's adoption ended (the service_adopt module's result,
    registered as inference_service__adopted; before it, the JSON the role's adopt.py printed),
    or None when it adopted nothing. Each process it ended is an action in gpu_reclaim's shape
    (step, pid, name, unit, result), so that one list can later hold every process a run ended,
    however it ended."""
    if not isinstance(adopted, dict):
        return None
    if 'procs' in adopted:
        out = adopted
    elif adopted.get('stdout'):
        try:
            out = json.loads(adopted['stdout'])
        except ValueError:
            return None
    else:
        return None
    if not out.get('procs'):
        return None
    scope, left = out.get('scope'), list(out.get('left') or [])
    # The ladder's rule in adoption: a process whose SigIgn holds SIGTERM got SIGKILL at once.
    killed = dict((k.get('pid'), k.get('at_s')) for k in out.get('killed_at_once') or [])

    def result(pid):
        if pid in left:
            return 'still alive after the stop of %s (left to the GPU reclaim)' % scope
        if pid in killed:
            return 'SIGKILL at once at %s s (its SigIgn holds SIGTERM), in %s' % (killed[pid], scope)
        return 'ended by the stop of %s in %s s' % (scope, out.get('seconds'))

    actions = [{'step': 'adopt_sigkill' if proc.get('pid') in killed and proc.get('pid') not in left else 'adopt_stop',
                'pid': proc.get('pid'), 'name': proc.get('name'), 'unit': scope, 'result': result(proc.get('pid'))}
               for proc in out['procs']]
    return {'scope': scope, 'stopped': bool(out.get('stopped')), 'seconds': out.get('seconds'),
            'skipped': list(out.get('not_adopted') or out.get('skipped') or []), 'left': left, 'actions': actions}


def _seconds(delta):
    """A command result's delta ('0:00:10.123456') in seconds, or None."""
    try:
        hours, minutes, seconds = str(delta).split(':')
        return round(int(hours) * 3600 + int(minutes) * 60 + float(seconds), 2)
    except ValueError:
        return None


def container_adoption_record(stopped):
    """The hand-started docker/podman containers the inference_service role stopped through their
    runtime (its loop registered as inference_service__containers_stopped), or None when it stopped
    none. One action per container, in gpu_reclaim's stop_container shape, with the processes
    of the server that ended with it."""
    if not isinstance(stopped, dict) or not stopped.get('results'):
        return None
    actions = []
    for result in stopped['results']:
        item = result.get('item') or {}
        if result.get('skipped') or not item.get('id'):
            continue
        took = _seconds(result.get('delta'))
        ok = result.get('rc') == 0
        actions.append({'step': 'stop_container', 'runtime': item.get('runtime'), 'container': item.get('id'),
                        'name': item.get('name'), 'pids': list(item.get('pids') or []), 'took_s': took,
                        'result': ('stopped through %s in %s s, kept (never removed)' % (item.get('runtime'), took)) if ok
                        else 'stop failed: %s' % (result.get('stderr') or result.get('msg') or '?')})
    return {'actions': actions} if actions else None


def stray_reclaim(host):
    """The host's stray reclaim (play 1): kept as reclaim__strays_result on a host whose server the
    role went on to converge (its own reclaims register gpus_free_result again), else
    gpus_free_result; None when there was none."""
    return host.get('reclaim__strays_result') or host.get('gpus_free_result')


def host_record(host, check_mode=False):
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
        # reclaim.yml empties gpus_free_result once it has kept the stray reclaim, so a value here is
        # the role's own reclaim of the server's GPUs: the role got past its checks and restarted.
        server_reclaim = host.get('gpus_free_result') if strays else None
        adoption = adoption_record(host.get('inference_service__adopted'))
        containers = container_adoption_record(host.get('inference_service__containers_stopped'))
        beside = host.get('inference_service__strays_freed')
        beside = beside if isinstance(beside, dict) and 'actions' in beside else None
        record['server'] = {'name': host.get('inference_service_name'),
                            'flags': host.get('inference_service_flags') or {},
                            'max_total_num_tokens': info.get('max_total_num_tokens'),
                            # The server's state as the role published it (README "The server's state").
                            'state': host.get('inference_service_server'),
                            # Why the role (re)started it, or in check mode would: empty when converged.
                            'restart_reasons': reasons,
                            # A hand-started server the role adopted, and each process that ended with it.
                            'adoption': adoption,
                            # Hand-started docker/podman containers it stopped through their runtime.
                            'container_adoption': containers,
                            'gpus_reclaim': _reclaim_record(server_reclaim) if server_reclaim else None,
                            # Strays beside a healthy server, freed sparing it.
                            'strays_reclaim': _reclaim_record(beside) if beside else None}
        if check_mode:
            # A drift report reads `changed`: a server that needs a restart is a change.
            server_changed = bool(reasons)
        else:
            # A run refused before it touched anything (a misspelled flag) changed nothing.
            server_changed = bool(adoption) or bool(containers) or bool(reasons and server_reclaim) or bool(
                server_reclaim and server_reclaim.get('changed'))
        record['changed'] = record['changed'] or server_changed or bool(beside and beside.get('changed'))
    return record


def host_report(name, host, record, check_mode):
    """The table of one host's stray reclaim (play 1), each line prefixed with the host's name; a
    host that did nothing is one line. On a server host, also what the role's adoption ended and
    the strays it freed beside a healthy server (its own reclaims printed their tables already)."""
    reclaim = stray_reclaim(host)
    server = record.get('server')
    if not reclaim:
        lines = ['== %s ==' % record['status']]
    elif server and not reclaim.get('before') and not reclaim.get('failed'):
        gpus = host.get('inference_service_gpus') or []
        lines = ['== no GPU outside %s\'s (GPU %s) to free ==' % (server['name'], ','.join(str(gpu) for gpu in gpus))]
    else:
        lines = gpu_report(reclaim, title='GPUs NOT freed' if reclaim.get('failed') else None, check_mode=check_mode,
                           brief=True)
    adoption = server and server.get('adoption')
    if adoption:
        lines.append('== %s: adopted a hand-started server, %d process(es) ended by stopping %s in %s s ==' % (
            server['name'], len(adoption['actions']) - len(adoption['left']), adoption['scope'], adoption['seconds']))
        lines.extend('  %s PID %s %s: %s' % (act['step'], act['pid'], act['name'], act['result'])
                     for act in adoption['actions'])
        lines.extend('  skipped: %s' % why for why in adoption['skipped'])
    containers = server and server.get('container_adoption')
    if containers:
        lines.append('== %s: adopted %d hand-started container(s), stopped through their runtime ==' % (
            server['name'], len(containers['actions'])))
        lines.extend('  stop_container %s %s (%s) PIDs %s: %s' % (
            act['runtime'], act['name'] or '-', (act['container'] or '')[:12], ','.join(str(p) for p in act['pids']),
            act['result']) for act in containers['actions'])
    beside = host.get('inference_service__strays_freed') if server and server.get('strays_reclaim') else None
    if beside:
        lines.extend(gpu_report(beside, title='Strays beside %s' % server['name'], check_mode=check_mode))
    # gpu_report escapes its lines (holder titles and cgroup names are the node users'); the
    # adoption lines and the prefix are escaped here, so no printed line holds a control character.
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
            records[name] = host_record(host, check_mode)
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
            result['msg'] = lines
        if path:
            # A relative path is the playbook directory's, never the launcher's working directory
            # (ansible-runner, and so AWX, changes directory without setting PWD).
            base = task_vars.get('playbook_dir') or os.getcwd()
            result['path'] = summary['path'] = self._write(os.path.join(base, os.path.expanduser(path)), summary)
        # The run's custom stats (what set_stats sets): AWX keeps them as the job's artifacts, and
        # ansible-runner writes them to the stats event. Not per host: one entry, every host in it.
        result['ansible_stats'] = {'data': {'gpuops_reclaim': summary}, 'per_host': False, 'aggregate': False}
        return result

    @staticmethod
    def _write(path, summary):
        path = os.path.abspath(path)
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
