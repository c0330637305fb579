"""The run_metrics module on a real directory: the file written whole (temporary file, then
renamed), 0644, the directory made only when missing; counters carried from the last file; a
corrupt last file replaced with a warning, a foreign one left alone; bad input named with
nothing written; its RETURN documents every key it returns."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import stat

import pytest
import yaml

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_metrics, prom_text
from ansible_collections.gpuops.reclaim.plugins.modules import run_metrics

from . import module_run

ROW = {'index': 0, 'memory_used_mib': 0, 'holders': [], 'peers': [], 'free': True}
STRAY = {'changed': True, 'before': [dict(ROW, memory_used_mib=20000, holders=[100], free=False)], 'after': [ROW],
         'holders': [], 'remaining': [],
         'actions': [{'step': 'sigterm', 'pid': 100, 'code': 'exited', 'changed': True, 'result': 'x'}]}
QUIET = {'changed': False, 'before': [ROW], 'after': [ROW], 'holders': [], 'remaining': [], 'actions': []}


def run(capsys, **args):
    args.setdefault('started', 1765000000.5)
    args.setdefault('duration_s', 3.25)
    return module_run.run(run_metrics, capsys, **args)


def warnings(out):
    """The warnings' text: plain strings before ansible-core 2.19, WarningSummary dicts since."""
    return [w['event']['msg'] if isinstance(w, dict) else w for w in out.get('warnings', [])]


def read(path):
    with open(path) as f:
        return prom_text.parse(f.read())[0]


def test_writes_the_file_0644_in_a_directory_made_0755_when_missing(capsys, tmp_path):
    directory = tmp_path / 'node-exporter'
    out = run(capsys, dir=str(directory), reclaims=[STRAY])
    path = directory / 'gpuops_reclaim.prom'
    assert out['changed'] is True and out['written'] is True and out['previous'] == 'no_file'
    assert out['file'] == str(path)
    assert stat.S_IMODE(os.stat(str(directory)).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(str(path)).st_mode) == 0o644
    assert path.read_text() == out['metrics']
    assert read(str(path))[('gpuops_reclaim_ended_total', (('lever', 'signal'),))] == 1
    assert os.listdir(str(directory)) == ['gpuops_reclaim.prom']   # no temporary file left


def test_an_existing_directory_keeps_its_mode(capsys, tmp_path):
    os.chmod(str(tmp_path), 0o750)
    run(capsys, dir=str(tmp_path), reclaims=[QUIET])
    assert stat.S_IMODE(os.stat(str(tmp_path)).st_mode) == 0o750


def test_a_second_quiet_run_carries_the_counters_on(capsys, tmp_path):
    run(capsys, dir=str(tmp_path), reclaims=[STRAY])
    first_inode = os.stat(str(tmp_path / 'gpuops_reclaim.prom')).st_ino
    out = run(capsys, dir=str(tmp_path), reclaims=[QUIET])
    found = read(str(tmp_path / 'gpuops_reclaim.prom'))
    assert out['previous'] == 'carried'
    assert found[('gpuops_reclaim_ended_total', (('lever', 'signal'),))] == 1
    assert found[('gpuops_reclaim_runs_total', (('result', 'ok'),))] == 2
    assert found[('gpuops_reclaim_last_run_ended', (('lever', 'signal'),))] == 0
    # Renamed over, not rewritten in place: a reader holding the old file never sees half of one.
    assert os.stat(str(tmp_path / 'gpuops_reclaim.prom')).st_ino != first_inode


def test_a_write_that_fails_leaves_the_last_file_whole_and_no_temporary_file(capsys, tmp_path, monkeypatch):
    run(capsys, dir=str(tmp_path), reclaims=[STRAY])
    before = (tmp_path / 'gpuops_reclaim.prom').read_text()

    def no_space(fd):
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(os, 'fsync', no_space)   # gpu_metrics_file's write, for every module that writes the file
    out = run(capsys, dir=str(tmp_path), reclaims=[QUIET])
    assert out['failed'] is True and 'No space left on device' in out['msg'] and out['written'] is False
    assert (tmp_path / 'gpuops_reclaim.prom').read_text() == before
    assert os.listdir(str(tmp_path)) == ['gpuops_reclaim.prom']


def test_a_corrupt_last_file_of_ours_is_replaced_and_its_counters_start_again(capsys, tmp_path):
    (tmp_path / 'gpuops_reclaim.prom').write_text('# %s\ngpuops_reclaim_runs_total{result="ok"} 7\ntrunc' % gpu_metrics.HEADER)
    out = run(capsys, dir=str(tmp_path), reclaims=[QUIET])
    assert out['previous'] == 'corrupt' and out['written'] is True
    assert any('does not read back' in w and 'line 3' in w for w in warnings(out)), warnings(out)
    assert read(str(tmp_path / 'gpuops_reclaim.prom'))[('gpuops_reclaim_runs_total', (('result', 'ok'),))] == 1


@pytest.mark.parametrize('make', ['other', 'link', 'dir'])
def test_a_file_not_ours_is_left_as_it_is_and_said(capsys, tmp_path, make):
    path = tmp_path / 'gpuops_reclaim.prom'
    target = tmp_path / 'elsewhere'
    target.write_text('node_role{role="gpu"} 1\n')
    if make == 'other':
        path.write_text('node_role{role="gpu"} 1\n')
    elif make == 'link':
        path.symlink_to(target)
    else:
        path.mkdir()
    out = run(capsys, dir=str(tmp_path), reclaims=[STRAY])
    assert out['changed'] is False and out['written'] is False and out['previous'] == 'foreign'
    assert any(str(path) in w and 'left as it is' in w for w in warnings(out)), warnings(out)
    assert target.read_text() == 'node_role{role="gpu"} 1\n'
    if make == 'link':
        assert path.is_symlink()
    elif make == 'other':
        assert path.read_text() == 'node_role{role="gpu"} 1\n'


def test_check_mode_renders_and_writes_nothing(capsys, tmp_path):
    directory = tmp_path / 'missing'
    out = run(capsys, dir=str(directory), reclaims=[STRAY], _ansible_check_mode=True)
    assert out['written'] is False and 'gpuops_reclaim_ended_total{lever="signal"} 1' in out['metrics']
    assert not directory.exists()


def test_an_empty_dir_writes_nothing(capsys):
    out = run(capsys, dir='', reclaims=[STRAY])
    assert out == dict(out, changed=False, file=None, written=False, previous=None)


@pytest.mark.parametrize('args, named', [
    (dict(name='metrics.txt'), "name='metrics.txt'"),
    (dict(name='../x.prom'), "name='../x.prom'"),
    (dict(name='.hidden.prom'), "name='.hidden.prom'"),
    (dict(dir='relative/dir'), "dir='relative/dir'"),
    (dict(started=-1.0), 'started=-1.0'),
    (dict(duration_s=float('nan')), 'duration_s=nan'),
    (dict(free_threshold_mib=-5), 'free_threshold_mib=-5'),
    (dict(interval='soon'), "interval: 'soon' is not a systemd time span"),
])
def test_bad_input_is_named_and_nothing_is_written(capsys, tmp_path, args, named):
    args.setdefault('dir', str(tmp_path / 'd'))
    out = run(capsys, reclaims=[STRAY], **args)
    assert out['failed'] is True and named in out['msg'] and 'Nothing was written' in out['msg'], out['msg']
    assert not (tmp_path / 'd').exists()


def test_the_interval_reaches_the_file(capsys, tmp_path):
    run(capsys, dir=str(tmp_path), reclaims=[QUIET], interval='5min 60s')
    assert read(str(tmp_path / 'gpuops_reclaim.prom'))[('gpuops_reclaim_timer_interval_seconds', ())] == 360


def test_return_documents_every_key(capsys, tmp_path):
    documented = set(yaml.safe_load(run_metrics.RETURN))
    out = run(capsys, dir=str(tmp_path), reclaims=[STRAY])
    assert set(out) - {'changed', 'invocation', 'warnings'} <= documented
    assert documented <= set(out)
