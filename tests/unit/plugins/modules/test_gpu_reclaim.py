"""gpu_reclaim: every key it returns is in its RETURN documentation, and every documented key is
returned by some path (success, failure, check mode, an interrupted ladder, metrics written).

Its `metrics` option (issue 31 item 5): the reclaim writes the run's metrics file
itself, the same file run_metrics writes with that result as its only reclaim, so that
playbooks/reclaim.yml needs one module call on a host without a server. On a failed reclaim the
file says reclaim_failed; in check mode nothing is written; any trouble with the file leaves the
result without `metrics`, so that the playbook's run_metrics task writes it (or fails saying why)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import types

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import prom_text
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_flow import Ladder
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_lock import HostLock
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import NvmlTimeout, UnitFacts
from ansible_collections.gpuops.reclaim.plugins.modules import gpu_holders, gpu_reclaim, run_metrics

from ..module_utils.observations import gpu, proc
from ..module_utils.test_gpu_family_container import container_held
from ..module_utils.test_gpu_family_user_unit import user_held
from ..module_utils.test_gpu_flow import (
    Host, ScriptedActor, ScriptedSurveyor, free, held_by, held_under, loop_table, survey_of)
from . import module_run
from .module_run import ANSIBLE_KEYS, documented, keys_of

ROW = {'index': 0, 'memory_used_mib': 0, 'holders': [], 'peers': [], 'free': True}
STRAY = {'changed': True, 'free': True, 'before': [dict(ROW, memory_used_mib=20000, holders=[100], free=False)],
         'after': [ROW], 'holders': [], 'remaining': [], 'spared': [],
         'actions': [{'step': 'sigterm', 'pid': 100, 'code': 'exited', 'changed': True, 'result': 'x'}]}
STARTED = 1765000000.5


def module(directory, check_mode=False, **metrics):
    warned = []
    asked = dict(dir=str(directory), name='gpuops_reclaim.prom', started=STARTED, duration_s=2.0, interval=None)
    asked.update(metrics)
    return types.SimpleNamespace(params={'metrics': asked, 'free_threshold_mib': 128}, check_mode=check_mode,
                                 warn=warned.append, warned=warned)


def samples(text):
    return prom_text.parse(text)[0]


def without_duration(found):
    return dict((k, v) for k, v in found.items() if k[0] != 'gpuops_reclaim_last_run_duration_seconds')


def test_the_file_is_the_one_run_metrics_writes_for_that_result(capsys, tmp_path):
    ours, theirs = tmp_path / 'ours', tmp_path / 'theirs'
    result = dict(STRAY)
    gpu_reclaim.add_metrics(module(ours), 0.0, result)
    assert result['metrics']['written'] is True and result['metrics']['previous'] == 'no_file'
    assert result['metrics']['file'] == str(ours / 'gpuops_reclaim.prom')
    written = (ours / 'gpuops_reclaim.prom').read_text()
    assert written == result['metrics']['metrics']
    module_run.run(run_metrics, capsys, dir=str(theirs), started=STARTED, duration_s=2.0, reclaims=[STRAY])
    expected = samples((theirs / 'gpuops_reclaim.prom').read_text())
    assert without_duration(samples(written)) == without_duration(expected)
    assert samples(written)[('gpuops_reclaim_ended_total', (('lever', 'signal'),))] == 1
    # The run's time before the task, and the module's own until it wrote.
    assert samples(written)[('gpuops_reclaim_last_run_duration_seconds', ())] >= 2.0
    assert oct(os.stat(str(ours / 'gpuops_reclaim.prom')).st_mode & 0o777) == '0o644'


def test_a_second_run_carries_the_counters_and_the_interval_reaches_the_file(tmp_path):
    gpu_reclaim.add_metrics(module(tmp_path), 0.0, dict(STRAY))
    result = dict(STRAY)
    gpu_reclaim.add_metrics(module(tmp_path, interval='5min 60s'), 0.0, result)
    found = samples((tmp_path / 'gpuops_reclaim.prom').read_text())
    assert result['metrics']['previous'] == 'carried'
    assert found[('gpuops_reclaim_runs_total', (('result', 'ok'),))] == 2
    assert found[('gpuops_reclaim_ended_total', (('lever', 'signal'),))] == 2
    assert found[('gpuops_reclaim_timer_interval_seconds', ())] == 360


def test_a_failed_reclaim_is_counted_reclaim_failed(tmp_path):
    result = dict(STRAY, msg='GPU 0 still holds 20000 MiB')
    gpu_reclaim.add_metrics(module(tmp_path), 0.0, result, failed=True)
    found = samples((tmp_path / 'gpuops_reclaim.prom').read_text())
    assert found[('gpuops_reclaim_runs_total', (('result', 'reclaim_failed'),))] == 1
    assert found[('gpuops_reclaim_last_run_success', ())] == 0


def test_check_mode_renders_and_writes_nothing(tmp_path):
    result = dict(STRAY)
    gpu_reclaim.add_metrics(module(tmp_path / 'missing', check_mode=True), 0.0, result)
    assert result['metrics']['written'] is False
    assert 'gpuops_reclaim_ended_total{lever="signal"} 1' in result['metrics']['metrics']
    assert not (tmp_path / 'missing').exists()


def test_a_file_not_ours_is_left_and_said(tmp_path):
    (tmp_path / 'gpuops_reclaim.prom').write_text('node_role{role="gpu"} 1\n')
    fake = module(tmp_path)
    result = dict(STRAY)
    gpu_reclaim.add_metrics(fake, 0.0, result)
    assert result['metrics'] == dict(file=str(tmp_path / 'gpuops_reclaim.prom'), written=False, previous='foreign')
    assert any('left as it is' in w for w in fake.warned), fake.warned
    assert (tmp_path / 'gpuops_reclaim.prom').read_text() == 'node_role{role="gpu"} 1\n'


@pytest.mark.parametrize('trouble', ['write', 'name', 'interval'])
def test_trouble_with_the_file_leaves_the_result_to_run_metrics(tmp_path, monkeypatch, trouble):
    metrics = {'name': 'metrics.txt'} if trouble == 'name' else {'interval': 'soon'} if trouble == 'interval' else {}
    if trouble == 'write':
        def no_space(fd):
            raise OSError(28, 'No space left on device')
        monkeypatch.setattr(os, 'fsync', no_space)
    result = dict(STRAY)
    gpu_reclaim.add_metrics(module(tmp_path, **metrics), 0.0, result)
    assert 'metrics' not in result and result == STRAY
    assert os.listdir(str(tmp_path)) == []


def test_an_empty_dir_writes_nothing_and_no_option_adds_nothing(tmp_path):
    result = dict(STRAY)
    gpu_reclaim.add_metrics(module(''), 0.0, result)
    assert result['metrics'] == dict(file=None, written=False, previous=None)
    result = dict(STRAY)
    gpu_reclaim.add_metrics(types.SimpleNamespace(params={'metrics': None}), 0.0, result)
    assert result == STRAY


# --- its result against its RETURN ------------------------------------------------------------

def reclaim_results(lock_path):
    """Results of every path: free at once, freed, failed with a reset, check mode, interrupted,
    and a real run under the host lock, as gpu_reclaim's main() adds it."""
    with HostLock(5, path=lock_path) as lock:
        locked = Ladder(ScriptedSurveyor(held_by((10, 'exits-on-term')), free()), actor=ScriptedActor()).run()
    locked['host_lock'] = lock.report()
    results = [
        locked,
        Ladder(ScriptedSurveyor(free()), actor=ScriptedActor()).run(),
        Ladder(ScriptedSurveyor(held_by((10, 'exits-on-term')), free()), actor=ScriptedActor()).run(),
        Ladder(ScriptedSurveyor(held_by((10, 'exits-on-kill'), (11, 'stuck'))), actor=ScriptedActor(),
               passes=1, allow_reset=True).run(),
        Ladder(ScriptedSurveyor(survey_of([gpu(7, used=3000)], [])), actor=ScriptedActor(), allow_reset=True).run(),
        Ladder(ScriptedSurveyor(held_by((10, 'exits-on-term'))), check_mode=True).run(),
        Ladder(ScriptedSurveyor(held_by((10, 'exits-on-term')), NvmlTimeout('hung')), actor=ScriptedActor()).run(),
    ]
    unit = held_by((12, 'exits-on-term'), cgroup='0::/system.slice/gpuhog.service',
                   units={'gpuhog.service': UnitFacts('always', 'active', '/system.slice/gpuhog.service')})
    results.append(Ladder(ScriptedSurveyor(unit, free()), actor=ScriptedActor()).run())
    results.append(Ladder(ScriptedSurveyor(container_held(nspid=[10, 1])), check_mode=True).run())
    guest = held_by((15, 'exits-on-term'))
    guest.holders[0] = guest.holders[0]._replace(owner=guest.holders[0].owner._replace(
        kind='guest', guest_unit='sglang.service',
        cgroup='/machine.slice/machine-g1.scope/payload/system.slice/sglang.service'))
    results.append(Ladder(ScriptedSurveyor(guest, free()), actor=ScriptedActor()).run())
    results.append(Ladder(ScriptedSurveyor(user_held(), free()), actor=ScriptedActor()).run())
    # a supervisor's program, stopped through its supervisor (check mode: the stop_supervised step)
    supervised = held_by((16, 'exits-on-term'), cgroup='0::/system.slice/supervisor.service')
    supervised.holders[0] = supervised.holders[0]._replace(owner=supervised.holders[0].owner._replace(
        kind='supervisor', runtime='supervisord', id='worker', name='worker', unit='supervisor.service',
        supervisor={'pid': 40, 'start_time': 5, 'program_pid': 16, 'service': None,
                    'conf': '/etc/supervisor/supervisord.conf', 'home': None, 'uid': 0}))
    results.append(Ladder(ScriptedSurveyor(supervised), check_mode=True).run())
    unit_stays = held_by((13, 'exits-on-kill'), (14, 'exits-on-term'))
    results.append(Ladder(ScriptedSurveyor(unit_stays, unit_stays, free()), actor=ScriptedActor()).run())
    # a loop respawning the worker (respawn, sigstop), and a shell that does not (settle)
    for starts in ({12: 10}, {}):
        actor = ScriptedActor()
        host = Host(actor, held_under(50), free(), table=loop_table(proc(12, ppid=50)),
                    programs={50: 'bash', 10: 'python3', 12: 'python3'}, starts_after=starts or {12: 50})
        results.append(Ladder(host, actor=actor, clock=actor.clock).run())
    # the run's metrics written beside the result (the `metrics` option, as main() adds it)
    with_metrics = Ladder(ScriptedSurveyor(held_by((10, 'exits-on-term')), free()), actor=ScriptedActor()).run()
    module = types.SimpleNamespace(params={'metrics': {'dir': os.path.dirname(lock_path), 'name': 'gpuops_reclaim.prom',
                                                       'started': 1765000000.0, 'duration_s': 1.0, 'interval': None},
                                           'free_threshold_mib': 128},
                                   check_mode=False, warn=lambda msg: None)
    gpu_reclaim.add_metrics(module, 0.0, with_metrics)
    assert with_metrics['metrics']['written'] is True
    results.append(with_metrics)
    return results


def test_gpu_reclaim_returns_exactly_what_it_documents(tmp_path):
    doc = documented(gpu_reclaim)
    results = reclaim_results(str(tmp_path / 'gpu-reclaim.lock'))
    assert keys_of(results) - ANSIBLE_KEYS == set(doc) - ANSIBLE_KEYS
    assert keys_of(a for r in results for a in r['actions']) == set(doc['actions']['contains'])
    holder_doc = set(documented(gpu_holders)['holders']['contains'])
    assert keys_of(h for r in results for h in r['holders'] + r['spared']) <= holder_doc
    assert keys_of(r['host_lock'] for r in results if 'host_lock' in r) == set(doc['host_lock']['contains'])
    assert keys_of(h for r in results for h in r['remaining']) == holder_doc | {'reason', 'reason_code'}
