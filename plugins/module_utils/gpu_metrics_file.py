# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's metrics file on the node (issue 33): the last file read back, the new one rendered
and written whole. run_metrics writes it at the end of a run; gpu_reclaim writes the same file
when the playbook passes it `metrics` (a host whose run ends with its stray reclaim: one module
call instead of two, issue 31 item 5).

`write_run` returns what both modules return (file, written, previous, metrics) and the warnings
to give; it raises MetricsError, carrying the same keys, when the file cannot be read or written.
Only the file and a temporary file beside it are written.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import math
import os
import stat
import tempfile

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_metrics, prom_text

# A last file larger than this is not ours (ours is a few KiB for 8 GPUs).
MAX_READ = 1024 * 1024
FOREIGN = 'foreign'
DEFAULT_DIR = '/var/lib/prometheus/node-exporter'
DEFAULT_NAME = 'gpuops_reclaim.prom'


class MetricsError(Exception):
    """The file could not be read or written; `result` holds file, written and previous."""

    def __init__(self, msg, result):
        super(MetricsError, self).__init__(msg)
        self.msg = msg
        self.result = result


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
    """A sentence naming the bad value, or None. `params`: dir, name, started, duration_s,
    free_threshold_mib, interval."""
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
    if params['interval']:
        try:
            gpu_metrics.timespan_s(params['interval'])
        except ValueError as exc:
            return 'interval: %s' % exc
    return None


def write_run(params, check_mode):
    """Render the run's metrics over the last file's and write them (not in check mode).

    `params`: run_metrics' options (dir non-empty, checked by param_error). Returns (result,
    warnings): result {file, written, previous, metrics} (no metrics beside a foreign file)."""
    path = os.path.join(params['dir'], params['name'])
    try:
        last, why = read_last(path)
    except OSError as exc:
        raise MetricsError('cannot read the last metrics file %s: %s. Nothing was written.' % (path, exc.strerror),
                           dict(file=path, written=False, previous=None))
    if last == FOREIGN:
        return dict(file=path, written=False, previous=FOREIGN), [
            '%s is not a metrics file of gpuops.reclaim.run_metrics (%s): left as it is, no metrics written. '
            'Move it away, or set reclaim_metrics_dir (or the module\'s name) to another place.' % (path, why)]
    warnings = []
    if last.code == gpu_metrics.CORRUPT:
        warnings.append('the last metrics file %s does not read back (%s): replaced, its counters start again at 0.'
                        % (path, last.why))
    interval_s = gpu_metrics.timespan_s(params['interval']) if params['interval'] else None
    run = {'started': params['started'], 'duration_s': params['duration_s'], 'failure': params['failure'],
           'reclaims': params['reclaims'], 'surveys': params['surveys'], 'server': params['server'],
           'free_threshold_mib': params['free_threshold_mib'], 'interval_s': interval_s}
    text = prom_text.render(gpu_metrics.families(run, last), header=[gpu_metrics.HEADER])
    if check_mode:
        return dict(file=path, written=False, previous=last.code, metrics=text), warnings
    try:
        make_dir(params['dir'])
        write_atomic(path, text)
    except OSError as exc:
        raise MetricsError('cannot write the metrics file %s: %s (%s)' % (path, exc.strerror, exc.filename or path),
                           dict(file=path, written=False, previous=last.code))
    return dict(file=path, written=True, previous=last.code, metrics=text), warnings
