#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: service_adopt
short_description: End a server started by hand, with its whole process tree, through a systemd scope
version_added: "1.1.0"
description:
  - Moves the O(roots) (a hand-started server's launcher, its tensor-parallel ranks, orphans
    still holding GPUs) and every descendant of them into a new transient scope unit
    C(SCOPE-TIMESTAMP.scope), then stops that scope. systemd sends SIGTERM to every member and
    SIGKILL after O(stop_timeout), exactly as it stops a unit (C(KillMode=control-group)), so the
    adopted tree ends the way a unit's does, orphans included.
  - The ladder's rule first (M(gpuops.reclaim.gpu_reclaim)'s) - a process whose C(SigIgn) mask
    holds SIGTERM would only wait out O(stop_timeout), so it gets SIGKILL at once; RV(actions)
    records when.
  - Identity is the PID with its start time. Every root comes with the start time recorded when
    it was found; one without refuses the whole adoption, naming it, and nothing is touched. A
    root whose start time changed since is another process and is left alone. Every signal
    re-reads the start time through a pidfd.
  - systemd takes PIDs, not pidfds, so the move is verified before anything is stopped. Every
    member of the new scope must be a process this run planned (same PID and start time) or one
    it forked since. Anything else (a PID reused between the look and the move) leaves the
    scope running and unstopped, and the module fails naming it.
  - Only what no owner stops is adopted - a login session, a transient scope, or no unit. A
    process of a system service, a docker or podman container, a Kubernetes pod, a guest, or a
    cgroup a user named is left to that owner and named in RV(not_adopted); so are PID 1, kernel
    threads and this module's own process tree.
  - Written for the C(gpuops.reclaim.inference_service) role, which adopts a hand-started engine
    that holds the server's port or GPUs before it starts its unit; usable on its own.
  - Not internal to the role - a module of the collection like the others, its options and
    return values under the collection's semantic versioning.
author:
  - gpuops.reclaim maintainers (@gpuops)
attributes:
  check_mode:
    support: full
    description: Check mode plans the adoption (what the scope would take, what is skipped) and changes nothing.
  diff_mode:
    support: none
    description: No diff.
options:
  scope:
    description:
      - The stem of the scope unit's name; the scope is C(STEM-UNIXTIME.scope), which must pass
        systemd's unit-name grammar (letters, digits, C(:_.-)).
    type: str
    required: true
  roots:
    description:
      - Each root's PID mapped to its start time (clock ticks after boot, C(/proc/PID/stat)
        field 22), as recorded when it was found (M(gpuops.reclaim.port_owner) and
        M(gpuops.reclaim.gpu_holders) return C(start_time)).
      - Only numbers; no command line of a node's process is passed anywhere.
    type: dict
    required: true
  stop_timeout:
    description: Seconds between the scope's SIGTERM and its SIGKILL (C(TimeoutStopUSec)), at most 3600.
    type: float
    default: 90
requirements:
  - Linux with systemd as PID 1 and C(busctl); root (C(become)).
  - Python 3.9+ on Linux 5.3+ for pidfds (without them, the start time is re-read right before C(kill)).
seealso:
  - module: gpuops.reclaim.port_owner
  - module: gpuops.reclaim.gpu_reclaim
"""

EXAMPLES = r"""
- name: Adopt the hand-started launcher and an orphaned rank, and stop them
  gpuops.reclaim.service_adopt:
    scope: sglang-adopted
    stop_timeout: 60
    roots:
      4242: 8812345
      4311: 8812377
  become: true
  register: adopted

- name: From the inference_service role's sorting of the port and the GPUs
  gpuops.reclaim.service_adopt:
    scope: "{{ inference_service_name }}-adopted"
    roots: "{{ takeover.adopt | items2dict(key_name='pid', value_name='start_time') }}"
  become: true
"""

RETURN = r"""
scope:
  description: The scope unit the tree was moved into; null when nothing was (or, in check mode, would be).
  returned: always
  type: str
  sample: sglang-adopted-1764636000.scope
procs:
  description: The processes adopted (in check mode, that would be), roots first.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Its PID.
      type: int
    start_time:
      description: Its start time (clock ticks after boot).
      type: int
    name:
      description: Its C(comm) (its user's text, not escaped).
      type: str
    cmdline:
      description: The first 300 characters of its command line (its user's text, not escaped).
      type: str
    uid:
      description: Its real uid.
      type: int
    root:
      description: It was one of O(roots) (else a descendant of one).
      type: bool
    owner:
      description: Its owner's kind before the move (session, scope or none).
      type: str
    unit:
      description: Its session or scope unit before the move, or null.
      type: str
not_adopted:
  description: A sentence for each process left alone, and why.
  returned: always
  type: list
  elements: str
  sample: ["PID 977 belongs to service jupyter.service, which stops it: left to that owner, not adopted"]
not_adopted_codes:
  description: "The same as codes, C({pid, reason_code}): V(never), V(gone), V(reused), V(kthread), V(owned)."
  returned: always
  type: list
  elements: dict
killed_at_once:
  description: "The processes whose C(SigIgn) held SIGTERM, SIGKILLed before the scope's stop: C({pid, at_s})."
  returned: always
  type: list
  elements: dict
stopped:
  description: The scope was stopped (or emptied by the SIGKILLs at once and collected by systemd).
  returned: always
  type: bool
left:
  description: PIDs of adopted processes still alive at the end (left to a GPU reclaim next).
  returned: always
  type: list
  elements: int
actions:
  description:
    - Each step in M(gpuops.reclaim.gpu_reclaim)'s action shape - C(step) (V(start_scope),
      V(adopt_sigkill), V(stop_scope)), C(target), C(result), C(code) (the code C(result) was written
      from, e.g. V(scope_started), V(sent), V(unit_stopped), V(stop_failed); null where an actor answered in
      plain text), C(changed), C(at_s) (seconds since the module started) and, for the scope's steps,
      C(took_s).
  returned: always
  type: list
  elements: dict
seconds:
  description: Seconds the module took.
  returned: always
  type: float
error:
  description: Why the adoption failed (the module then fails with it as C(msg)), else null.
  returned: always
  type: str
error_code:
  description: >-
    The same as a code, else null: V(no_start_time) (nothing done), V(scope_refused),
    V(no_cgroup) or V(strangers) (the scope left running, nothing stopped), V(stop_failed).
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_adopt, gpu_owner

MAX_STOP_TIMEOUT_S = 3600


def main():
    module = AnsibleModule(argument_spec=dict(scope=dict(type='str', required=True),
                                              roots=dict(type='dict', required=True),
                                              stop_timeout=dict(type='float', default=90)),
                           supports_check_mode=True)
    params = module.params
    if not gpu_owner.valid_unit_name('%s-%d.scope' % (params['scope'], 0)):
        module.fail_json(msg='scope %r cannot name a systemd scope (letters, digits and :_.- only); nothing was '
                             'adopted or stopped' % params['scope'])
    if not 0 < params['stop_timeout'] <= MAX_STOP_TIMEOUT_S:
        module.fail_json(msg='stop_timeout %r must be above 0 and at most %d seconds; nothing was adopted or '
                             'stopped' % (params['stop_timeout'], MAX_STOP_TIMEOUT_S))
    try:
        roots = gpu_adopt.parse_roots(params['roots'])
    except ValueError as exc:
        module.fail_json(msg='%s; nothing was adopted or stopped' % exc)
    result = gpu_adopt.Adoption(params['scope'], params['stop_timeout'], roots).run(check_mode=module.check_mode)
    changed = bool(result['procs'])
    if result['error']:
        module.fail_json(msg=result['error'], changed=changed and not module.check_mode and bool(result['scope']),
                         **result)
    module.exit_json(changed=changed, **result)


if __name__ == '__main__':
    main()
