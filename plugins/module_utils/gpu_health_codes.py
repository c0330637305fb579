# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU health's codes: what gpu_health's verdict says and gpu_say writes.

Apart from gpu_health so that gpu_say reads them without importing gpu_health, which reads
gpu_observe, which imports gpu_say: imports go one way (issue 32 item 5,
tests/unit/plugins/test_import_graph.py).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

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
