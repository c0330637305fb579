# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU health: the verdict on what the driver answered (issue 30 item 6), pure.

`verdict(record, xids, xid_unread)` turns one GPU's gpu_observe.GpuHealth and the Xid events
logged for it into a code, the facts it read and the lever NVIDIA prescribes (its GPU Memory
Error Management guide, its Xid catalog, and nvml.h's nvmlGpuRecoveryAction_t). gpu_say writes
the sentence; nothing here reads the host.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe

# Codes, worst first: `code` is the first that applies, `facts.problems` lists every one.
LOST = 'lost'                          # NVML: GPU is lost (fell off the bus)
RECOVERY_ACTION = 'recovery_action'    # the driver's own field prescribes an action
ROW_REMAP_FAILED = 'row_remap_failed'  # a row could not be remapped: no spare rows left
CRITICAL_XID = 'critical_xid'          # a critical Xid since the last good start
ROW_REMAP_PENDING = 'row_remap_pending'  # a remap waits for the next GPU reset
ECC_UNCORRECTED = 'ecc_uncorrected'    # volatile uncorrectable ECC errors since the driver loaded
RETIRED_PENDING = 'retired_pages_pending'  # pre-Ampere: pages wait to be retired at reset
UNREAD = 'unread'                      # nothing wrong was read, but a read failed or hung
HEALTHY = 'healthy'
PROBLEMS = (LOST, RECOVERY_ACTION, ROW_REMAP_FAILED, CRITICAL_XID, ROW_REMAP_PENDING,
            ECC_UNCORRECTED, RETIRED_PENDING)

# Levers, heaviest first: the verdict's lever is the heaviest any problem asks for.
SERVICE = 'service'          # take it out of service: field diagnostics, RMA when they fail
REBOOT = 'reboot'            # reboot the node
DRAIN_RESET = 'drain_reset'  # drain the node's GPU work, then reset the GPU
DRAIN_P2P = 'drain_p2p'      # stop the work using peer-to-peer (NVLink) with it, then go on
RESET = 'reset'              # reset the GPU once nothing holds it
LEVERS = (SERVICE, REBOOT, DRAIN_RESET, DRAIN_P2P, RESET)

# nvmlGpuRecoveryAction_t (nvml.h, driver 580; nvidia-ml-py 13.580 NVML_GPU_RECOVERY_ACTION_*).
RECOVERY_LEVERS = {1: RESET, 2: REBOOT, 3: DRAIN_P2P, 4: DRAIN_RESET, 5: RESET}

# Critical Xids and the lever each asks for, from NVIDIA's Xid catalog (docs.nvidia.com/deploy/
# xid-errors) and its GPU Memory Error Management guide. Left out on purpose: application
# errors (13, 31, 43, 45: the process faulted, the GPU is fine), 92 (high single-bit ECC rate:
# corrected errors, a warning to watch), 94 (contained ECC error: only the process that touched
# the memory was ended; the remap it leaves is read as ROW_REMAP_PENDING).
CRITICAL_XIDS = {
    48: RESET,    # double-bit ECC error: the data is lost; the guide: reset to clear it
    61: RESET,    # internal micro-controller breakpoint/warning: the GPU needs a reset
    62: RESET,    # internal micro-controller halt: the same
    63: RESET,    # row remapping (page retirement) recorded: takes effect at the next reset
    64: SERVICE,  # row remapping (page retirement) failed: the catalog says field diagnostics
    74: RESET,    # NVLink error: the link is down until a reset (reboot if it comes back)
    79: REBOOT,   # fallen off the bus: only a reboot brings it back
    95: RESET,    # uncontained ECC error: every process on the GPU is affected; reset
    119: RESET,   # GSP RPC timeout: the GPU's system processor stopped answering
    120: RESET,   # GSP error: the same
    140: RESET,   # unrecovered ECC error (Blackwell): reset
}


def _heaviest(levers):
    present = [lever for lever in LEVERS if lever in levers]
    return present[0] if present else None


def _xid_facts(events):
    return [{'xid': event.xid, 'at': event.at, 'text': event.text} for event in events]


def verdict(record, xids=None, xid_unread=None):
    """{code, facts, lever} for one GPU: `record` its GpuHealth, `xids` the XidEvents logged for
    it since the last good start (None: not read), `xid_unread` (code, text) when the Xid read
    failed or hung."""
    remapped = record.remapped_rows
    unread = dict((read, {'code': code, 'text': text}) for read, (code, text) in record.unread.items()
                  if code != observe.UNSUPPORTED)
    if xid_unread is not None:
        unread[observe.XID_READ] = {'code': xid_unread[0], 'text': xid_unread[1]}
    critical = [event for event in (xids or ()) if event.xid in CRITICAL_XIDS]
    facts = {
        'lost': bool(record.lost),
        'remapped_rows': None if remapped is None else dict(zip(
            ('correctable', 'uncorrectable', 'pending', 'failed'), remapped)),
        'ecc_volatile_uncorrected': record.ecc_volatile_uncorrected,
        'retired_pages_pending': record.retired_pages_pending,
        'recovery_action': record.recovery_action,
        'xids': _xid_facts(xids or ()),
        'critical_xids': sorted(set(event.xid for event in critical)),
        'unsupported': sorted(read for read, (code, _text) in record.unread.items()
                              if code == observe.UNSUPPORTED),
        'unread': unread,
        'took_ms': dict(record.took_ms),
    }
    found = {}
    if record.lost:
        found[LOST] = REBOOT
    if record.recovery_action in RECOVERY_LEVERS:
        found[RECOVERY_ACTION] = RECOVERY_LEVERS[record.recovery_action]
    if remapped is not None and remapped[3]:
        found[ROW_REMAP_FAILED] = SERVICE
    if critical:
        found[CRITICAL_XID] = _heaviest([CRITICAL_XIDS[event.xid] for event in critical])
    if remapped is not None and remapped[2]:
        found[ROW_REMAP_PENDING] = RESET
    if record.ecc_volatile_uncorrected:
        found[ECC_UNCORRECTED] = RESET
    if record.retired_pages_pending:
        found[RETIRED_PENDING] = RESET
    facts['problems'] = [code for code in PROBLEMS if code in found]
    if found:
        return {'code': facts['problems'][0], 'facts': facts, 'lever': _heaviest(found.values())}
    return {'code': UNREAD if unread else HEALTHY, 'facts': facts, 'lever': None}


def verdicts(rows, records, xids=None, xid_unread=None):
    """{index: verdict} for the GPU rows (gpu_holders' `gpus`), each with the Xids logged for
    its PCI address."""
    out = {}
    for row in rows:
        address = observe.pci_address(row.get('pci_bus_id'))
        mine = None if xids is None else [event for event in xids if event.pci == address]
        out[row['index']] = verdict(records[row['index']], mine, xid_unread)
    return out


def unhealthy(health):
    """Whether a start on this GPU must be refused."""
    return health['code'] not in (HEALTHY, UNREAD)
