"""gpu_holder: a holder is a typed record, built once by gpu_decide with its final owner, never
changed afterwards; its result is exactly what the modules' RETURN documents (issue 32 item 2)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import pytest
import yaml

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_holder
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_supervisor as supervisors
from ansible_collections.gpuops.reclaim.plugins.modules import gpu_holders

from .observations import CTX, FREE_MIB, gpu, proc, snap, systemd_confirms

UNIT = '0::/system.slice/supervisor.service\n'
UNITS = systemd_confirms('/system.slice/supervisor.service')


def classified():
    s = snap([gpu(0, used=1000, processes=[(10, 1000)])], [
        proc(10, fds=CTX, maps=CTX, cgroup=UNIT),
        proc(12, name='nvidia-smi', fds=('/dev/nvidiactl',)),
    ])
    holders, clients, _unconfirmed = decide.classify(s, [], set(), UNITS, FREE_MIB)
    return s, holders, clients


def documented_holder_keys():
    return set(yaml.safe_load(gpu_holders.RETURN)['holders']['contains'])


def test_a_holder_cannot_be_changed_once_built():
    _s, (holder,), _clients = classified()
    with pytest.raises(AttributeError):
        holder.state = 'zombie'
    with pytest.raises(AttributeError):
        holder.reason = 'anything'        # what the ladder learns is its own, never the holder's
    with pytest.raises(TypeError):
        holder['owner'] = {}              # pylint: disable=unsupported-assignment-operation
    assert not hasattr(holder, '__dict__')
    # A different value is a new record; the one built stays as it was.
    other = holder._replace(state='stopped')
    assert (holder.state, other.state, other.pid) == ('sleeping', 'stopped', 10)


def test_its_result_has_the_keys_gpu_holders_documents_in_the_order_it_always_had():
    _s, (holder,), (client,) = classified()
    result = holder.as_result()
    assert set(result) == documented_holder_keys()
    assert list(result) == list(gpu_holder.FIELDS)
    assert result['pid'] == holder.pid == 10 and result['owner'] == holder.owner.as_result()
    assert isinstance(result['owner'], dict)   # a result is plain data (JSON), never the record
    assert result['peer_gpus'] == [] and result['gpus'] == [0] and result['kind'] == 'context'
    # A client was never sorted among the GPUs: no peer_gpus, as before.
    assert set(client.as_result()) == documented_holder_keys() - set(['peer_gpus'])
    assert client.kind == 'client' and client.peer_gpus is None


def test_a_left_holder_carries_its_reason_and_code_after_the_holders_keys():
    _s, (holder,), _clients = classified()
    left = holder.left(lever.SURVIVED, 'survived the ladder')
    assert isinstance(left, gpu_holder.Left) and left.holder() == holder and left.key == holder.key
    assert list(left.as_result()) == list(gpu_holder.FIELDS) + ['reason', 'reason_code']
    peer = holder.left(lever.PEER_MEMORY, 'maps peer memory of GPU 0', lever='reclaim GPU 1 too')
    assert list(peer.as_result())[-3:] == ['reason', 'lever', 'reason_code']
    respawner = holder.left(lever.RESPAWNS, 'it holds a GPU itself', respawned='PID(s) 60')
    assert 'respawned' not in respawner.as_result() and respawner.respawned == 'PID(s) 60'
    assert holder.reason is None and holder.reason_code is None and holder.lever is None


def test_the_owner_resolved_before_classification_is_the_holders_and_protection_reads_the_cgroups():
    """The supervisor's program is the holder's owner from the start (no later step replaces
    it); its unit and protection are still read from the owner its cgroup names, as root named
    it."""
    s, (cgroup_held,), _clients = classified()
    program = gpu_owner.new_owner(gpu_owner.SUPERVISOR, '/system.slice/supervisor.service', runtime='supervisord',
                                  id='worker', name='worker', unit='supervisor.service',
                                  manager=gpu_owner.SYSTEM_MANAGER, confirmed=True)
    (holder,), _clients, _unconfirmed = decide.classify(s, [], set(), UNITS, FREE_MIB, owners={10: program})
    assert holder.owner is program and cgroup_held.owner.kind == gpu_owner.SERVICE
    assert holder.unit == cgroup_held.unit == 'supervisor.service'
    assert holder._replace(owner=cgroup_held.owner) == cgroup_held
    assert decide.skip_code(holder, ()) == supervisors.LEVER_OFF and decide.skip_code(cgroup_held, ()) is None
