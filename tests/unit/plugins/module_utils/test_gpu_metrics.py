"""gpu_metrics: a run's figures from gpu_reclaim results shaped as the module returns them
(actions with step and, once every action carries one, code; before/after rows; the first
survey's holders with their owners), the server's state fact and the GPU health read, and the
counters carried from the last file."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_metrics, prom_text
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_metrics import Carried

from .test_prom_text import promtool_check_metrics

MIB = 1024 * 1024
FRESH = Carried(gpu_metrics.NO_FILE)


def row(index, used, free, holders=(), peers=(), health=None):
    entry = {'index': index, 'uuid': 'GPU-%d' % index, 'memory_used_mib': used, 'memory_total_mib': 81559,
             'memory_reserved_mib': 615, 'holders': list(holders), 'handles': [], 'peers': list(peers), 'free': free}
    if health is not None:
        entry['health'] = health
    return entry


def holder(pid, gpu, mib, unit=None, kind='none', owner_id=None, name=None):
    return {'pid': pid, 'start_time': 1000 + pid, 'name': 'python3', 'cmdline': 'python3 train.py --rank %d' % pid,
            'unit': unit, 'gpus': [gpu], 'context_gpus': [gpu], 'gpu_memory_mib': {str(gpu): mib},
            'owner': {'kind': kind, 'unit': unit, 'id': owner_id, 'name': name, 'runtime': None}}


def signal(step, pid, code=None, changed=True):
    action = {'step': step, 'target': 'PID %d (python3)' % pid, 'pid': pid, 'gpus': [0],
              'result': 'a sentence nobody reads', 'changed': changed, 'at_s': 0.1}
    if code is not None:
        action['code'] = code
    return action


def reclaim(actions=(), before=(), after=(), holders=(), remaining=()):
    return {'changed': bool(actions), 'actions': list(actions), 'before': list(before), 'after': list(after),
            'holders': list(holders), 'remaining': list(remaining), 'free': True, 'elapsed_s': 1.5}


def run(reclaims=(), failure=None, server=None, interval_s=None, started=1_765_000_000.0, duration_s=12.5):
    return {'started': started, 'duration_s': duration_s, 'failure': failure, 'reclaims': list(reclaims),
            'server': server, 'free_threshold_mib': 128, 'interval_s': interval_s}


def samples(families):
    return dict(((f.name, tuple(sorted(labels.items()))), value) for f in families for labels, value in f.samples)


def value(families, name, **labels):
    return samples(families)[(name, tuple(sorted(labels.items())))]


# ---------------------------------------------------------------------------------------------
# Levers, from codes first
# ---------------------------------------------------------------------------------------------

def test_a_process_signalled_twice_counts_once_and_only_when_its_code_says_it_exited():
    result = reclaim([signal('sigterm', 100, 'still_running'), signal('sigkill', 100, 'exited'),
                      signal('sigterm', 101, 'exited'),
                      signal('sigterm', 102, 'gone'),          # exited before: not ended by this run
                      signal('sigterm', 103, 'pid_protected', changed=False)])
    assert gpu_metrics.ended(result) == {'unit': 0, 'runtime': 0, 'supervisor': 0, 'signal': 2}


def test_the_code_decides_not_changed():
    """A sigterm whose process outlived the SIGKILL wait changed the host but ended nothing."""
    result = reclaim([signal('sigterm', 100, 'still_running'), signal('sigkill', 100, 'alive_after_kill_step')])
    assert gpu_metrics.ended(result)['signal'] == 0


def test_without_codes_the_step_and_changed_decide():
    result = reclaim([signal('sigterm', 100), signal('sigkill', 100), signal('sigterm', 101, changed=False),
                      {'step': 'stop_unit', 'unit': 'train.service', 'changed': True, 'result': 'stopped'},
                      {'step': 'stop_container', 'container': 'c' * 64, 'changed': True, 'result': 'x'},
                      {'step': 'stop_supervised', 'program': 'llm', 'unit': 'supervisor.service', 'changed': True},
                      {'step': 'rescan', 'changed': False}, {'step': 'wait_release', 'changed': False}])
    assert gpu_metrics.ended(result) == {'unit': 1, 'runtime': 1, 'supervisor': 1, 'signal': 1}


def test_a_unit_stop_counts_the_holders_it_ended():
    holders = [holder(200, 0, 1000, unit='train.service', kind='service'),
               holder(201, 0, 1000, unit='train.service', kind='service'),
               holder(202, 0, 1000, unit='train.service', kind='service'),   # outlived the stop: signalled
               holder(203, 0, 1000, unit='train.service', kind='service'),   # left
               holder(300, 1, 1000)]
    result = reclaim([{'step': 'stop_unit', 'unit': 'train.service', 'code': 'unit_stopped', 'changed': True},
                      signal('sigterm', 202, 'exited')], holders=holders, remaining=[{'pid': 203}])
    assert gpu_metrics.ended(result) == {'unit': 2, 'runtime': 0, 'supervisor': 0, 'signal': 1}


def test_a_stop_still_under_way_or_failed_ends_nothing():
    result = reclaim([{'step': 'stop_unit', 'unit': 'a.service', 'code': 'unit_stopping', 'changed': True},
                      {'step': 'stop_container', 'container': 'c' * 64, 'code': 'command_failed', 'changed': True}])
    assert gpu_metrics.ended(result) == {'unit': 0, 'runtime': 0, 'supervisor': 0, 'signal': 0}


def test_container_and_supervised_stops_count_their_holders():
    cid = 'ab' * 32
    holders = [holder(400, 0, 10, kind='container', owner_id=cid), holder(401, 0, 10, kind='container', owner_id=cid),
               holder(500, 1, 10, unit='supervisor.service', kind='supervisor', name='llm')]
    result = reclaim([{'step': 'stop_container', 'container': cid, 'runtime': 'docker', 'code': 'container_stopped',
                       'changed': True},
                      {'step': 'stop_supervised', 'program': 'llm', 'unit': 'supervisor.service',
                       'code': 'supervised_stopped', 'changed': True}], holders=holders)
    assert gpu_metrics.ended(result) == {'unit': 0, 'runtime': 2, 'supervisor': 1, 'signal': 0}


# ---------------------------------------------------------------------------------------------
# The run's figures and the counters carried on
# ---------------------------------------------------------------------------------------------

def stray_run():
    return reclaim([signal('sigterm', 100, 'exited')],
                   before=[row(0, 20000, False, [100]), row(1, 0, True)],
                   after=[row(0, 0, True), row(1, 0, True)],
                   holders=[holder(100, 0, 20000)])


def test_a_run_that_ended_a_stray_says_so():
    out = gpu_metrics.families(run([stray_run()]), FRESH)
    assert value(out, 'gpuops_reclaim_last_run_success') is True
    assert value(out, 'gpuops_reclaim_last_run_start_timestamp_seconds') == 1_765_000_000.0
    assert value(out, 'gpuops_reclaim_last_run_duration_seconds') == 12.5
    assert value(out, 'gpuops_reclaim_last_run_result', result='ok') is True
    assert value(out, 'gpuops_reclaim_last_run_result', result='reclaim_failed') is False
    assert value(out, 'gpuops_reclaim_runs_total', result='ok') == 1
    assert value(out, 'gpuops_reclaim_ended_total', lever='signal') == 1
    assert value(out, 'gpuops_reclaim_ended_total', lever='unit') == 0
    assert value(out, 'gpuops_reclaim_last_run_gpus_freed') == 1
    assert value(out, 'gpuops_reclaim_gpus_freed_total') == 1
    assert value(out, 'gpuops_gpu_free', gpu='0') is True
    assert value(out, 'gpuops_gpu_memory_unexplained_bytes', gpu='0') == 0


def test_counters_go_on_from_the_last_file_and_never_back():
    first = prom_text.render(gpu_metrics.families(run([stray_run()]), FRESH), header=[gpu_metrics.HEADER])
    last = gpu_metrics.carried(*prom_text.parse(first))
    assert last.code == gpu_metrics.CARRIED
    quiet = reclaim([], before=[row(0, 0, True)], after=[row(0, 0, True)])
    second = gpu_metrics.families(run([quiet]), last)
    assert value(second, 'gpuops_reclaim_runs_total', result='ok') == 2
    assert value(second, 'gpuops_reclaim_ended_total', lever='signal') == 1
    assert value(second, 'gpuops_reclaim_gpus_freed_total') == 1
    assert value(second, 'gpuops_reclaim_last_run_ended', lever='signal') == 0
    assert value(second, 'gpuops_reclaim_last_run_gpus_freed') == 0


@pytest.mark.parametrize('failure, result', [({'stage': 'reclaim', 'task': 't', 'msg': 'm'}, 'reclaim_failed'),
                                             ({'stage': 'restart', 'task': 't', 'msg': 'm'}, 'restart_failed'),
                                             ({'stage': 'elsewhere'}, 'failed'), ('text', 'failed')])
def test_a_failed_run_is_counted_by_its_stage(failure, result):
    out = gpu_metrics.families(run([stray_run()], failure=failure), FRESH)
    assert value(out, 'gpuops_reclaim_last_run_success') is False
    assert value(out, 'gpuops_reclaim_last_run_result', result=result) is True
    assert value(out, 'gpuops_reclaim_runs_total', result=result) == 1
    assert value(out, 'gpuops_reclaim_runs_total', result='ok') == 0


def test_each_gpu_reads_from_the_last_reclaim_that_read_it():
    strays = reclaim([], before=[row(0, 100, True), row(1, 100, True)], after=[row(0, 100, True), row(1, 100, True)])
    server = reclaim([signal('sigterm', 900, 'exited')], before=[row(1, 70000, False, [900])],
                     after=[row(1, 5, True)], holders=[holder(900, 1, 70000)])
    out = gpu_metrics.families(run([strays, server]), FRESH)
    assert value(out, 'gpuops_gpu_memory_used_bytes', gpu='0') == 100 * MIB
    assert value(out, 'gpuops_gpu_memory_used_bytes', gpu='1') == 5 * MIB
    assert value(out, 'gpuops_reclaim_last_run_gpus_freed') == 1


def test_results_without_actions_are_left_out():
    out = gpu_metrics.families(run([None, {'skipped': True}, {'failed': True, 'msg': 'bad option'}]), FRESH)
    names = set(f.name for f in out)
    assert 'gpuops_gpu_free' not in names and value(out, 'gpuops_reclaim_last_run_gpus_freed') == 0


# ---------------------------------------------------------------------------------------------
# Memory no process explains, and runs in a row
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize('gpu_row, holders, mib', [
    (row(0, 30000, False), [], 30000),                                 # a dead process's memory: nothing holds it
    (row(0, 30000, False, peers=[7]), [], 0),                          # peer memory of a live process
    (row(0, 30000, False, [7]), [holder(7, 0, 20000)], 10000),         # beyond what NVML charges the holder
    (row(0, 30000, False, [7]), [holder(7, 0, 30000)], 0),
    (row(0, 30000, False, [8]), [holder(7, 0, 20000)], 0),             # a holder whose charge is unknown
])
def test_memory_no_process_explains(gpu_row, holders, mib):
    assert gpu_metrics.unexplained_mib(gpu_row, reclaim(holders=holders)) == mib


def leak(used):
    return reclaim([], before=[row(0, used, used <= 128)], after=[row(0, used, used <= 128)])


def test_runs_in_a_row_with_memory_no_process_explains_count_up_and_start_again():
    last = FRESH
    seen = []
    for used in (30000, 30000, 100, 30000):
        out = gpu_metrics.families(run([leak(used)]), last)
        seen.append(value(out, 'gpuops_gpu_memory_unexplained_runs', gpu='0'))
        last = gpu_metrics.carried(*prom_text.parse(prom_text.render(out, header=[gpu_metrics.HEADER])))
    assert seen == [1, 2, 0, 1]
    assert value(out, 'gpuops_gpu_memory_unexplained_bytes', gpu='0') == 30000 * MIB


# ---------------------------------------------------------------------------------------------
# Health and the server, when their facts exist
# ---------------------------------------------------------------------------------------------

def test_the_health_read_gives_a_code_per_gpu_where_it_exists():
    after = [row(0, 0, True, health={'code': 'ok', 'facts': {}, 'lever': None}),
             row(1, 0, True, health={'code': 'xid_79', 'facts': {'xid': 79}, 'lever': 'reset'}),
             row(2, 0, True, health={'code': 'Fallen Off The Bus!', 'facts': {}, 'lever': None}),
             row(3, 0, True)]
    out = gpu_metrics.families(run([reclaim([], before=after, after=after)]), FRESH)
    assert value(out, 'gpuops_gpu_healthy', gpu='0') is True
    assert value(out, 'gpuops_gpu_healthy', gpu='1') is False
    assert value(out, 'gpuops_gpu_health_code', gpu='1', code='xid_79') == 1
    assert value(out, 'gpuops_gpu_health_code', gpu='2', code='other') == 1   # not a code: no unbounded label
    assert ('gpuops_gpu_healthy', (('gpu', '3'),)) not in samples(out)


def test_no_health_read_no_health_metric():
    out = gpu_metrics.families(run([stray_run()]), FRESH)
    assert not [f for f in out if f.name.startswith('gpuops_gpu_health')]


SERVER = {'state': 'serving', 'code': 'healthy', 'age_s': 321.5, 'last_progress': 'loaded 8/8 shards',
          'time_to_serve_s': 94.2, 'ttft_s': 0.35}


def test_the_servers_state_and_its_last_time_to_serve():
    out = gpu_metrics.families(run([stray_run()], server=SERVER), FRESH)
    assert value(out, 'gpuops_inference_server_state', state='serving') is True
    assert value(out, 'gpuops_inference_server_state', state='stalled') is False
    assert value(out, 'gpuops_inference_server_time_to_serve_seconds') == 94.2
    assert value(out, 'gpuops_inference_server_ttft_seconds') == 0.35
    assert value(out, 'gpuops_inference_server_state_age_seconds') == 321.5
    assert value(out, 'gpuops_inference_server_code', code='healthy') == 1


def test_a_server_state_out_of_the_set_is_unknown_and_missing_figures_are_left_out():
    out = gpu_metrics.families(run(server={'state': 'warming', 'code': None, 'time_to_serve_s': None}), FRESH)
    assert value(out, 'gpuops_inference_server_state', state='unknown') is True
    assert value(out, 'gpuops_inference_server_code', code='other') == 1
    assert 'gpuops_inference_server_time_to_serve_seconds' not in set(f.name for f in out)


def test_no_server_fact_no_server_metric():
    out = gpu_metrics.families(run([stray_run()]), FRESH)
    assert not [f for f in out if f.name.startswith('gpuops_inference_server')]


# ---------------------------------------------------------------------------------------------
# Conventions: labels from closed sets, promtool's lint
# ---------------------------------------------------------------------------------------------

def full_run():
    after = [row(i, 30000 if i == 3 else 0, i != 3, health={'code': 'ok' if i else 'ecc_uncorrectable'})
             for i in range(8)]
    holders = [holder(1000 + i, i % 8, 500, unit='job%d.service' % i, kind='service') for i in range(40)]
    actions = [{'step': 'stop_unit', 'unit': 'job%d.service' % i, 'code': 'unit_stopped', 'changed': True}
               for i in range(40)] + [signal('sigkill', 5000 + i, 'exited') for i in range(10)]
    return run([reclaim(actions, before=[row(i, 9000, False) for i in range(8)], after=after, holders=holders)],
               failure={'stage': 'reclaim'}, server=SERVER, interval_s=360.0)


def test_labels_come_from_closed_sets_only():
    for family in gpu_metrics.families(full_run(), FRESH):
        assert family.name.startswith('gpuops_'), family.name
        for labels, _ in family.samples:
            assert set(labels) <= {'gpu', 'lever', 'result', 'state', 'code'}, (family.name, labels)
            assert labels.get('lever', 'unit') in gpu_metrics.LEVERS
            assert labels.get('gpu', '0').isdigit()


def test_counters_end_in_total_and_figures_in_base_units():
    for family in gpu_metrics.families(full_run(), FRESH):
        assert (family.kind == 'counter') == family.name.endswith('_total'), family.name
        assert not any(unit in family.name for unit in ('_mib', '_ms', '_minutes', '_percent')), family.name


def test_promtool_finds_nothing_to_say_about_a_full_file():
    text = prom_text.render(gpu_metrics.families(full_run(), FRESH), header=[gpu_metrics.HEADER])
    rc, said = promtool_check_metrics(text)
    assert rc == 0 and said.strip() == '', said


# ---------------------------------------------------------------------------------------------
# The last file, and the timer's interval
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize('text, why', [
    ('# TYPE gpuops_reclaim_runs_total counter\ngpuops_reclaim_runs_total{result="ok"} -3\n', '-3'),
    ('# TYPE gpuops_reclaim_runs_total counter\ngpuops_reclaim_runs_total{result="ok"} NaN\n', 'nan'),
    ('# TYPE gpuops_reclaim_runs_total gauge\ngpuops_reclaim_runs_total{result="ok"} 3\n', "typed 'gauge'"),
])
def test_a_last_file_whose_counters_are_no_counts_is_corrupt(text, why):
    last = gpu_metrics.carried(*prom_text.parse(text))
    assert last.code == gpu_metrics.CORRUPT and why in last.why and last.samples == {}


@pytest.mark.parametrize('span, seconds', [('5min', 300), ('5min 60s', 360), ('1h 30m', 5400), ('90', 90),
                                           ('2 min', 120), ('500ms', 0.5), ('1d', 86400)])
def test_systemd_time_spans(span, seconds):
    assert gpu_metrics.timespan_s(span) == seconds


@pytest.mark.parametrize('span', ['', 'soon', '5 parsecs', '-5min', '5min;reboot'])
def test_a_bad_time_span_is_named(span):
    with pytest.raises(ValueError) as err:
        gpu_metrics.timespan_s(span)
    assert repr(span) in str(err.value)


def test_the_timer_interval_is_exported_only_when_given():
    assert value(gpu_metrics.families(run(interval_s=360.0), FRESH), 'gpuops_reclaim_timer_interval_seconds') == 360.0
    assert 'gpuops_reclaim_timer_interval_seconds' not in set(f.name for f in gpu_metrics.families(run(), FRESH))
