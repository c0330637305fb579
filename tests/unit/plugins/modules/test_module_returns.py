"""Every key a module returns is in its RETURN documentation, and every documented key is
returned by some path (success, failure, check mode, an interrupted ladder)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import types

import yaml

from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_flow import Ladder, survey_result
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_lock import HostLock
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_backend import GpuBackend
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import NvmlTimeout, UnitFacts
from ansible_collections.gpuops.reclaim.plugins.modules import gpu_holders, gpu_reclaim

from ..module_utils.test_gpu_flow import (
    Host, ScriptedActor, ScriptedSurveyor, container_held, free, held_by, held_under, loop_table, survey_of,
    user_held)
from ..module_utils.observations import gpu, proc

# Ansible adds these to every result; a module documents them only where they say more.
ANSIBLE_KEYS = {'changed', 'failed', 'invocation', 'warnings'}


def documented(module):
    return yaml.safe_load(module.RETURN)


def keys_of(entries):
    found = set()
    for entry in entries:
        found |= set(entry)
    return found


def holders_results():
    wedged = held_by((10, 'exits-on-term'))
    with_health = survey_result(free())
    # health: true (a backend that reads no health says so for every read)
    gpu_holders.add_health(with_health['gpus'], types.SimpleNamespace(backend=GpuBackend(), nvml_timeout=1),
                           {'xid_since': None, 'xid_log': None})
    return [survey_result(wedged), survey_result(free()), with_health]


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
    guest.holders[0] = guest.holders[0]._replace(owner=dict(
        guest.holders[0].owner, kind='guest', guest_unit='sglang.service',
        cgroup='/machine.slice/machine-g1.scope/payload/system.slice/sglang.service'))
    results.append(Ladder(ScriptedSurveyor(guest, free()), actor=ScriptedActor()).run())
    results.append(Ladder(ScriptedSurveyor(user_held(), free()), actor=ScriptedActor()).run())
    # a supervisor's program, stopped through its supervisor (check mode: the stop_supervised step)
    supervised = held_by((16, 'exits-on-term'), cgroup='0::/system.slice/supervisor.service')
    supervised.holders[0] = supervised.holders[0]._replace(owner=dict(
        supervised.holders[0].owner,
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


def test_gpu_holders_returns_exactly_what_it_documents():
    doc = documented(gpu_holders)
    results = holders_results()
    assert keys_of(results) - ANSIBLE_KEYS == set(doc) - ANSIBLE_KEYS
    assert keys_of(row for r in results for row in r['gpus']) == set(doc['gpus']['contains'])
    assert keys_of(h for r in results for h in r['holders']) == set(doc['holders']['contains'])


def test_gpu_reclaim_returns_exactly_what_it_documents(tmp_path):
    doc = documented(gpu_reclaim)
    results = reclaim_results(str(tmp_path / 'gpu-reclaim.lock'))
    assert keys_of(results) - ANSIBLE_KEYS == set(doc) - ANSIBLE_KEYS
    assert keys_of(a for r in results for a in r['actions']) == set(doc['actions']['contains'])
    holder_doc = set(documented(gpu_holders)['holders']['contains'])
    assert keys_of(h for r in results for h in r['holders'] + r['spared']) <= holder_doc
    assert keys_of(r['host_lock'] for r in results if 'host_lock' in r) == set(doc['host_lock']['contains'])
    assert keys_of(h for r in results for h in r['remaining']) == holder_doc | {'reason', 'reason_code'}


def test_every_module_documentation_parses():
    for module in (gpu_holders, gpu_reclaim):
        for text in (module.DOCUMENTATION, module.EXAMPLES, module.RETURN):
            assert yaml.safe_load(text)
