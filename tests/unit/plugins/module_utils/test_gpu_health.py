"""gpu_health's verdict (issue 30 item 6): a code, the facts read and NVIDIA's lever."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_health as health
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_nvidia
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say

RETIRED_NOT_SUPPORTED = {'retired_pages_pending': (observe.UNSUPPORTED, 'GPU 0: Not Supported')}


def record(index=0, lost=False, remapped=(0, 0, 0, 0), ecc=0, retired=None, action=0, unread=None):
    """What an H100 with driver 580.159.04 answered (issue 30), changed where asked."""
    return observe.GpuHealth(index, lost, remapped, ecc, retired, action,
                             dict(RETIRED_NOT_SUPPORTED if unread is None else unread), {'driver': 0.2})


def xid(number, at=100.0, pci=(0, 0x18, 0)):
    return observe.XidEvent(at, pci, number, 'pid=1, name=python3, test')


def test_the_measured_h100_is_healthy_and_retired_pages_not_supported_is_no_fault():
    verdict = health.verdict(record(), [])
    assert (verdict['code'], verdict['lever']) == (health.HEALTHY, None)
    assert verdict['facts']['unsupported'] == ['retired_pages_pending']
    assert verdict['facts']['unread'] == {}
    assert verdict['facts']['remapped_rows'] == {'correctable': 0, 'uncorrectable': 0, 'pending': 0, 'failed': 0}
    assert not health.unhealthy(verdict)
    assert say.health(0, verdict) is None


@pytest.mark.parametrize('kwargs, code, lever', [
    (dict(lost=True, remapped=None, ecc=None, action=None, unread={}), health.LOST, health.REBOOT),
    (dict(remapped=(0, 1, 1, 0)), health.ROW_REMAP_PENDING, health.RESET),
    (dict(remapped=(0, 8, 0, 1)), health.ROW_REMAP_FAILED, health.SERVICE),
    (dict(ecc=3), health.ECC_UNCORRECTED, health.RESET),
    (dict(retired=True, unread={}), health.RETIRED_PENDING, health.RESET),
    (dict(action=1), health.RECOVERY_ACTION, health.RESET),
    (dict(action=2), health.RECOVERY_ACTION, health.REBOOT),
    (dict(action=3), health.RECOVERY_ACTION, health.DRAIN_P2P),
    (dict(action=4), health.RECOVERY_ACTION, health.DRAIN_RESET),
])
def test_each_fault_has_its_code_and_nvidias_lever(kwargs, code, lever):
    verdict = health.verdict(record(**kwargs), [])
    assert (verdict['code'], verdict['lever']) == (code, lever)
    assert verdict['facts']['problems'] == [code]
    assert health.unhealthy(verdict)
    sentence = say.health(0, verdict, held_by=[])
    assert sentence.startswith('GPU 0 is unhealthy: ') and 'NVIDIA prescribes' in sentence


def test_correctable_remaps_alone_are_no_fault():
    assert health.verdict(record(remapped=(5, 0, 0, 0)), [])['code'] == health.HEALTHY


@pytest.mark.parametrize('number, lever', [(48, health.RESET), (79, health.REBOOT), (64, health.SERVICE),
                                           (74, health.RESET), (95, health.RESET), (119, health.RESET)])
def test_a_critical_xid_since_the_last_good_start_is_a_fault(number, lever):
    verdict = health.verdict(record(), [xid(number)])
    assert (verdict['code'], verdict['lever'], verdict['facts']['critical_xids']) == (health.CRITICAL_XID, lever, [number])


@pytest.mark.parametrize('number', [13, 31, 43, 92, 94])
def test_application_and_contained_xids_are_logged_but_no_fault(number):
    verdict = health.verdict(record(), [xid(number)])
    assert verdict['code'] == health.HEALTHY
    assert [x['xid'] for x in verdict['facts']['xids']] == [number]


def test_the_worst_code_leads_and_the_heaviest_lever_wins():
    verdict = health.verdict(record(remapped=(0, 1, 1, 0), ecc=2), [xid(79)])
    assert verdict['code'] == health.CRITICAL_XID
    assert verdict['facts']['problems'] == [health.CRITICAL_XID, health.ROW_REMAP_PENDING, health.ECC_UNCORRECTED]
    assert verdict['lever'] == health.REBOOT
    sentence = say.health(0, verdict)
    for part in ('critical Xid 79', 'a row remapping is pending', '2 volatile uncorrectable ECC errors',
                 'reboot the node'):
        assert part in sentence


def test_reset_names_the_holders_it_must_wait_for_and_the_command():
    verdict = health.verdict(record(ecc=1), [])
    assert 'held by PID 4242' in say.health(1, verdict, held_by=[4242])
    assert '`nvidia-smi --gpu-reset -i 1`' in say.health(1, verdict, held_by=[4242])
    assert 'nothing holds it' in say.health(1, verdict, held_by=[])


def test_a_hung_or_failed_read_is_unread_not_healthy_and_says_which():
    hung = record(remapped=None, ecc=None, action=None, unread={
        'remapped_rows': (observe.READ_HUNG, 'GPU 0: NVML did not answer the remapped_rows read within nvml_timeout=1s'),
        'ecc_volatile_uncorrected': (observe.READ_SKIPPED, 'an earlier read hung')})
    verdict = health.verdict(hung, [])
    assert (verdict['code'], verdict['lever']) == (health.UNREAD, None)
    assert not health.unhealthy(verdict)
    sentence = say.health(0, verdict)
    assert sentence.startswith('GPU 0: its health is not fully known: remapped_rows hung')


def test_a_fault_read_beside_an_unread_one_is_still_a_fault():
    verdict = health.verdict(record(ecc=None, remapped=(0, 0, 1, 0), unread={
        'ecc_volatile_uncorrected': (observe.READ_FAILED, 'Unknown Error')}), [])
    assert verdict['code'] == health.ROW_REMAP_PENDING
    assert verdict['facts']['unread'] == {'ecc_volatile_uncorrected': {'code': 'failed', 'text': 'Unknown Error'}}


def test_an_unread_kernel_log_is_named_on_every_gpu():
    verdict = health.verdict(record(), None, (observe.READ_HUNG, 'journalctl ... did not answer'))
    assert verdict['code'] == health.UNREAD
    assert verdict['facts']['unread']['xid']['code'] == 'hung'


def test_xids_go_to_the_gpu_at_their_pci_address():
    rows = [{'index': 0, 'pci_bus_id': '00000000:18:00.0'}, {'index': 1, 'pci_bus_id': '00000000:2A:00.0'}]
    verdicts = health.verdicts(rows, {0: record(0), 1: record(1)}, [xid(79, pci=(0, 0x2a, 0))])
    assert verdicts[0]['code'] == health.HEALTHY
    assert verdicts[1]['code'] == health.CRITICAL_XID


def test_a_backend_that_reads_no_health_is_unread_never_healthy():
    verdict = health.verdict(gpu_nvidia.SmiBackend().read_health(0, 1), None)
    assert verdict['code'] == health.UNREAD
    assert 'the nvidia-smi backend reads no GPU health' in say.health(0, verdict)
