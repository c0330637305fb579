#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: run_metrics
short_description: Write what a run of the reclaim playbook did as node_exporter textfile metrics
version_added: "1.2.0"
description:
  - Writes one file in Prometheus' text format for node_exporter's textfile collector:
    the run's start, duration and result; what it ended, by lever, and the GPUs it freed, as
    counters that go on from the file the last run left; per GPU, whether it is free, the memory
    in use and the memory no process explains; the GPU health code and the inference server's
    state where the run read them. The README's C(Metrics) section lists every metric.
  - The file is written as a temporary file in the same directory, flushed to disk, then renamed
    over the last one, so node_exporter never reads half a file. It is C(0644), the
    directory is made C(0755) only when missing.
  - A last file that does not read back (a counter that is not a number) is replaced, and its
    counters start again at 0, with a warning. A file at RV(file) that this module did not
    write (or that is not a regular file) is left as it is and nothing is written, with a
    warning naming it.
  - C(playbooks/reclaim.yml) calls it once per host at the end of every run (the reclaim timer
    runs the same playbook), from its C(reclaim_metrics_dir).
  - Labels take values from closed sets only (a GPU index, a lever, a result, a state, a code),
    never a PID, a command line or a name a node's user chose.
author:
  - gpuops.reclaim maintainers (@gpuops)
attributes:
  check_mode:
    support: full
    description: Check mode renders the metrics (RV(metrics)) and writes nothing.
  diff_mode:
    support: none
    description: No diff.
options:
  dir:
    description:
      - The directory node_exporter's textfile collector reads (its C(--collector.textfile.directory)).
        Debian's prometheus-node-exporter reads C(/var/lib/prometheus/node-exporter).
      - An empty string writes nothing.
    type: str
    default: /var/lib/prometheus/node-exporter
  name:
    description: The file's name in O(dir); it must end in C(.prom), which the collector reads.
    type: str
    default: gpuops_reclaim.prom
  started:
    description: When the run started, in seconds since the Unix epoch.
    type: float
    required: true
  duration_s:
    description: How long the run took until now, in seconds.
    type: float
    required: true
  failure:
    description:
      - The run's failure on this host as C(playbooks/reclaim.yml) records it (C(stage) C(reclaim)
        or C(restart)); omitted or null when the host converged.
    type: dict
  reclaims:
    description:
      - The M(gpuops.reclaim.gpu_reclaim) results of the run on this host, in the order they ran;
        each GPU's figures come from the last one that read it. Entries without C(actions) are skipped.
    type: list
    elements: dict
    default: []
  server:
    description:
      - The inference_service role's C(inference_service_server) fact (C(state), C(code), C(age_s),
        C(time_to_serve_s), C(ttft_s)); omitted when the host has no server.
    type: dict
  free_threshold_mib:
    description: GPU memory no process explains beyond this counts toward RV(metrics)'s C(gpuops_gpu_memory_unexplained_runs).
    type: int
    default: 128
  interval:
    description:
      - The reclaim timer's longest gap between runs as a systemd time span (its interval and its
        randomized delay, C(5min 60s)); exported as C(gpuops_reclaim_timer_interval_seconds), which
        the rule C(GpuopsReclaimNotRunning) reads. Omitted for runs not started by the timer.
    type: str
notes:
  - Only the file at RV(file) and a temporary file beside it are written; the module reads nothing
    else on the host.
seealso:
  - name: node_exporter's textfile collector
    description: How node_exporter reads C(*.prom) files.
    link: https://github.com/prometheus/node_exporter#textfile-collector
"""

EXAMPLES = r"""
- name: Write the run's metrics
  gpuops.reclaim.run_metrics:
    started: "{{ run_started }}"
    duration_s: 42.5
    reclaims: ["{{ gpus_free_result }}"]
  become: true
"""

RETURN = r"""
file:
  description: The metrics file, or null when O(dir) is empty.
  returned: always
  type: str
  sample: /var/lib/prometheus/node-exporter/gpuops_reclaim.prom
written:
  description: Whether the file was written (false in check mode, with O(dir) empty, or beside a file this module did not write).
  returned: always
  type: bool
previous:
  description:
    - "How the last file was found: C(carried) (its counters go on), C(no_file) (counters start at 0),
      C(corrupt) (a file of this module that did not read back: replaced, counters start again at 0),
      C(foreign) (not this module's, or not a regular file: left as it is, nothing written); null when O(dir) is empty."
  returned: always
  type: str
metrics:
  description: The file's text (what was written, or in check mode would be).
  returned: when O(dir) is set
  type: str
"""

import errno
import math
import os
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_metrics, prom_text

# A last file larger than this is not ours (ours is a few KiB for 8 GPUs).
MAX_READ = 1024 * 1024
FOREIGN = 'foreign'


def read_last(path):
    """(gpu_metrics.Carried or FOREIGN, why). Opened without following a link: whoever can
    write the directory (Debian's is the prometheus user's) chooses what is there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return gpu_metrics.Carried(gpu_metrics.NO_FILE), None
        if exc.errno == errno.ELOOP:
            return FOREIGN, 'a symbolic link'
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return FOREIGN, 'not a regular file'
        if info.st_size > MAX_READ:
            return FOREIGN, '%d bytes, more than this module writes' % info.st_size
        data = os.read(fd, MAX_READ + 1)
    finally:
        os.close(fd)
    text = data.decode('utf-8', 'replace')
    if not text.startswith('# ' + gpu_metrics.HEADER + '\n'):
        return FOREIGN, 'its first line is not this module\'s header'
    try:
        samples, types = prom_text.parse(text)
    except prom_text.ParseError as exc:
        return gpu_metrics.Carried(gpu_metrics.CORRUPT, why=str(exc)), None
    return gpu_metrics.carried(samples, types), None


def make_dir(path):
    """The directory, made 0755 (with missing parents) only when missing."""
    if os.path.isdir(path):
        return False
    if os.path.lexists(path):
        raise OSError(errno.ENOTDIR, 'not a directory', path)
    old = os.umask(0o022)
    try:
        os.makedirs(path, 0o755)
    finally:
        os.umask(old)
    return True


def write_atomic(path, text):
    """A temporary file in the same directory (not *.prom: the collector skips it), flushed
    and made 0644, renamed over `path`, and the directory flushed."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix='.' + os.path.basename(path) + '.', suffix='.tmp', dir=directory)
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(text.encode('utf-8'))
            f.flush()
            os.fchmod(f.fileno(), 0o644)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def param_error(params):
    """A sentence naming the bad value, or None."""
    name = params['name']
    if '/' in name or name.startswith('.') or not name.endswith('.prom') or name == '.prom':
        return 'name=%r: a file name ending in .prom (no directory, not hidden): the textfile collector reads *.prom' % (name,)
    if params['dir'] and not os.path.isabs(params['dir']):
        return 'dir=%r: an absolute path, or an empty string to write no metrics' % (params['dir'],)
    for key in ('started', 'duration_s'):
        value = params[key]
        if math.isnan(value) or math.isinf(value) or value < 0:
            return '%s=%r: a number of seconds, 0 or more' % (key, value)
    if params['free_threshold_mib'] < 0:
        return 'free_threshold_mib=%r: 0 or more' % (params['free_threshold_mib'],)
    return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dir=dict(type='str', default='/var/lib/prometheus/node-exporter'),
            name=dict(type='str', default='gpuops_reclaim.prom'),
            started=dict(type='float', required=True),
            duration_s=dict(type='float', required=True),
            failure=dict(type='dict'),
            reclaims=dict(type='list', elements='dict', default=[]),
            server=dict(type='dict'),
            free_threshold_mib=dict(type='int', default=128),
            interval=dict(type='str'),
        ),
        supports_check_mode=True)
    params = module.params
    error = param_error(params)
    interval_s = None
    if not error and params['interval']:
        try:
            interval_s = gpu_metrics.timespan_s(params['interval'])
        except ValueError as exc:
            error = 'interval: %s' % exc
    if error:
        module.fail_json(msg='%s. Nothing was written.' % error)
    if not params['dir']:
        module.exit_json(changed=False, file=None, written=False, previous=None)
    path = os.path.join(params['dir'], params['name'])
    try:
        last, why = read_last(path)
    except OSError as exc:
        module.fail_json(msg='cannot read the last metrics file %s: %s. Nothing was written.' % (path, exc.strerror),
                         file=path, written=False, previous=None)
    if last == FOREIGN:
        module.warn('%s is not a metrics file of gpuops.reclaim.run_metrics (%s): left as it is, no metrics written. '
                    'Move it away, or set reclaim_metrics_dir (or the module\'s name) to another place.' % (path, why))
        module.exit_json(changed=False, file=path, written=False, previous=FOREIGN)
    if last.code == gpu_metrics.CORRUPT:
        module.warn('the last metrics file %s does not read back (%s): replaced, its counters start again at 0.'
                    % (path, last.why))
    run = {'started': params['started'], 'duration_s': params['duration_s'], 'failure': params['failure'],
           'reclaims': params['reclaims'], 'server': params['server'],
           'free_threshold_mib': params['free_threshold_mib'], 'interval_s': interval_s}
    text = prom_text.render(gpu_metrics.families(run, last), header=[gpu_metrics.HEADER])
    if module.check_mode:
        module.exit_json(changed=True, file=path, written=False, previous=last.code, metrics=text)
    try:
        make_dir(params['dir'])
        write_atomic(path, text)
    except OSError as exc:
        module.fail_json(msg='cannot write the metrics file %s: %s (%s)' % (path, exc.strerror, exc.filename or path),
                         file=path, written=False, previous=last.code)
    module.exit_json(changed=True, file=path, written=True, previous=last.code, metrics=text)


if __name__ == '__main__':
    main()
