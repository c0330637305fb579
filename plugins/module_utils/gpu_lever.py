# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Lever: from a holder and its owner to the lever that ends it for good, in one table.

An owner (gpu_owner: a systemd unit of the system's or a user's manager, a container of a
runtime, a pod, a guest, a respawning ancestor, none) calls for one lever (`Lever`):

- what to run or signal (`kind`, `argv`: the command, from the table's row);
- whether that is allowed here (`refusal` None), or a code saying why not: gpu_trust's codes
  (who named the cgroup, whether the manager or runtime confirmed it) and this module's own
  (the option is off, the unit is never stopped, the runtime cannot stop it from here...);
- how a comeback is watched (`watch`): the unit's Restart=, the container's restart policy, a
  guest's own systemd, a watched ancestor (gpu_respawn).

All platform knowledge (which command reaches which owner, and how it comes back) is a row of
`UNITS`, `RUNTIMES` or `SUPERVISORS` below; adding a runtime or a supervisor is a row plus its
tests, or, for a runtime with a cgroup layout of its own, a family module (gpu_family) that
brings its row (docs/DEVELOPING.md). Pure: codes only; gpu_say writes the sentences, the owner
families (gpu_family_*) pull the levers through the actor, gpu_observe runs `inspect`.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_supervisor as supervisors
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_trust as trust

# What a lever does (Lever.kind). The first three are also gpu_act's method names and the
# ladder's action steps.
STOP_UNIT = trust.STOP_UNIT                # `systemctl stop UNIT`
STOP_USER_UNIT = trust.STOP_USER_UNIT      # `systemctl --user stop UNIT`, as that user
STOP_CONTAINER = trust.STOP_CONTAINER      # the runtime's stop (never a removal)
STOP_SUPERVISED = 'stop_supervised'        # one program through its own supervisor
STOP_GUEST_UNIT = 'stop_guest_unit'        # by hand: the unit inside a guest
DELETE_POD = 'delete_pod'                  # by hand: the Kubernetes API
STOP_BY_HAND = 'stop_by_hand'              # by hand: a container init no runtime here reaches
STOP_RESPAWNER = 'stop_respawner'          # the ancestor that restarts holders becomes a target
SIGNAL = 'signal'                          # the ladder's SIGTERM/SIGKILL on the holder itself
NO_LEVER = 'none'

# How a comeback is watched (Lever.watch).
WATCH_UNIT = 'unit_restart'        # the unit's Restart= (stopping the unit ends it)
WATCH_CONTAINER = 'restart_policy'  # the runtime's restart policy (stopping the container ends it)
WATCH_GUEST = 'guest_systemd'      # a guest's own systemd (the GPUs polled after the kill)
WATCH_PARENT = 'parent'            # a live ancestor (gpu_respawn.Watch, the settle window)
WATCH_SUPERVISOR = 'supervisor_status'  # the supervisor's status, read down and staying down
WATCHES = (WATCH_UNIT, WATCH_CONTAINER, WATCH_GUEST, WATCH_PARENT, WATCH_SUPERVISOR)

# Why not (Lever.refusal), beside gpu_trust.REFUSALS's codes.
OPTION_OFF = 'option_off'          # the option allowing this lever is false (stop_units, ...)
NEVER_STOPPED = 'never_stopped'    # a unit never stopped (sshd, the vendor's, spared, the caller's)
CALLERS = 'callers'                # the container this module runs in
NO_STOP = 'no_stop'                # no stop from here (a pod's runtime, a guest): by hand
NOT_A_SERVICE = 'not_a_service'    # no service unit (a scope, a session, none)
# Why the ladder leaves a holder alone (the signal lever's refusal; gpu_reclaim's reason_code).
INIT, PROTECTED, ZOMBIE, UNMATCHED = 'init', 'protected', 'zombie', 'unmatched'
HOLDS_GPU = 'holds_gpu'            # a respawner that holds a GPU itself (without `match`)
PASSES_RAN_OUT = 'passes_ran_out'  # a respawner the passes ran out before it was ended
# Why a holder is still on a GPU after the ladder (gpu_reclaim's reason_code, beside the skip
# codes above; gpu_decide names them too, gpu_say.remaining writes their `reason`).
SURVIVED, PEER_MEMORY, DEVICE_OPEN, RESPAWNS = 'survived', 'peer_memory', 'device_open', 'respawns'
# Why a GPU is not waited for: a holder on it stays (gpu_flow's wait_release; gpu_say.held).
ALIVE_AFTER_KILL = 'alive_after_sigkill'   # SIGKILLed, and still there
GUEST_RESTARTS = 'guest_restarts'          # a guest's own systemd was seen bringing it back
LEFT = 'left'                              # left by the ladder (its `reason` says why)
# Why SIGTERM cannot end a holder, so SIGKILL follows at once (gpu_decide.sigterm_futile_code).
SIGTERM_IGNORED = 'sigterm_ignored'        # its SigIgn mask holds SIGTERM
SIGTERM_DROPPED = 'sigterm_dropped'        # PID 1 of its PID namespace, no handler: the kernel drops it
TRACED_STOPPED = 'traced_stopped'          # stopped by its tracer: it acts on SIGKILL alone

# What the diagnosis names that a process list does not show (gpu_decide.findings: each a
# Finding(code, facts); gpu_say.finding writes the sentence). PEER_MEMORY, ZOMBIE as above.
IMPOSSIBLE_PID = 'impossible_pid'          # NVML lists a PID <= 0 or above the kernel's limit
LISTED_UNSEEN = 'listed_unseen'            # NVML lists a PID this module cannot see (blind)
LISTED_EXITED = 'listed_exited'            # charged to an exited PID whose children map the device
LISTED_MISSING = 'listed_missing'          # NVML lists a PID no process here has
MEMORY_UNSEEN = 'memory_unseen'            # memory used, no process visible to this module (blind)
MEMORY_UNEXPLAINED = 'memory_unexplained'  # memory used, no process visible here
UNCONFIRMED_PID = 'unconfirmed_pid'        # NVML's PID is a process here holding no device
UNCONFIRMED_GPU = 'unconfirmed_gpu'        # NVML's PID is a process here holding other GPUs, not this one
DISK_SLEEP = 'disk_sleep'                  # a holder in uninterruptible sleep
TRACED = 'traced'                          # a holder under a tracer
STOPPED = 'stopped'                        # a holder stopped by SIGSTOP (state T)
ZOMBIE_LEADER = 'zombie_leader'            # a thread group whose leader exited
UNIT_RESTARTS = 'unit_restarts'            # its system unit's Restart= brings it back
OWNER_LEVER = 'owner_lever'                # its owner calls for a lever (gpu_say.owner_clause)
OTHER_PID_NAMESPACE = 'other_pid_namespace'  # a holder in another PID namespace than this module
UNREADABLE = 'unreadable'                  # a security policy refuses reading fds or maps
DIAGNOSIS = (IMPOSSIBLE_PID, LISTED_UNSEEN, LISTED_EXITED, LISTED_MISSING, PEER_MEMORY, MEMORY_UNSEEN,
             MEMORY_UNEXPLAINED, UNCONFIRMED_PID, UNCONFIRMED_GPU, DISK_SLEEP, ZOMBIE, TRACED, STOPPED, ZOMBIE_LEADER,
             UNIT_RESTARTS, OWNER_LEVER, OTHER_PID_NAMESPACE, UNREADABLE)
# Why a survey that read only NVML's processes must read every process (gpu_decide.full_scan_code).
LISTED_HOLDS_NOTHING = 'listed_holds_nothing'  # a listed PID gone, a zombie, or holding no device
NO_MEMORY_GIVEN = 'no_memory_given'            # NVML gives no memory for a listed PID
UNCHARGED_MEMORY = 'uncharged_memory'          # more memory used than charged to processes
FULL_SCAN = (LISTED_HOLDS_NOTHING, NO_MEMORY_GIVEN, UNCHARGED_MEMORY)

# What a step of the ladder did (gpu_act's results: each a gpu_say.Said, the sentence with its
# code; callers read `.code`, never the words; gpu_say.step writes them).
SENT, GONE, REUSED = 'sent', 'gone', 'reused'   # a signal sent; its process exited; its PID reused
PID_NEVER = 'pid_never'                    # refused: PID 0, 1, negative or no number
PID_PROTECTED = 'pid_protected'            # refused: this module's own tree or a shield
NO_START_TIME = 'no_start_time'            # refused: no start time to re-identify it by
NOT_PERMITTED = 'not_permitted'            # refused: another user's process, and not root (gpu_act.signal_code)
SIGNAL_REFUSALS = (PID_NEVER, PID_PROTECTED, NO_START_TIME, NOT_PERMITTED)
UNIT_STOPPED = 'unit_stopped'              # the unit read inactive (with `uid`: a user's manager)
UNIT_STOPPING = 'unit_stopping'            # the stop was queued, still deactivating at the bound
STOP_FAILED = 'stop_failed'                # the stop command failed (its output)
MANAGER_NOT_RUNNING = 'manager_not_running'  # the user's manager does not run
CONTAINER_STOPPED = 'container_stopped'    # the runtime's stop returned 0
SUPERVISED_STOPPED = 'supervised_stopped'  # the program read down and stayed down
SCOPE_STARTED = 'scope_started'            # systemd made the transient scope
COMMAND_OK, COMMAND_FAILED = 'command_ok', 'command_failed'   # a command's rc 0, or not
# ... and what check mode would do (gpu_act.RecordingActor).
WOULD_STOP_UNIT = 'would_stop_unit'
WOULD_STOP_CONTAINER = 'would_stop_container'
WOULD_STOP_SUPERVISED = 'would_stop_supervised'
WOULD_SIGNAL = 'would_signal'
WOULD_KILL_AFTER_TERM = 'would_kill_after_term'
WOULD_RUN = 'would_run'
WOULD_WAIT = 'would_wait'
# ... and what the ladder's own steps found (gpu_flow).
RESCAN_FOUND = 'rescan_found'              # holders left or new on the next pass
RESPAWNER_TARGET = 'respawner_target'      # a watched ancestor brought a holder back: the target
RESPAWNER_REFUSED = 'respawner_refused'    # ... named, not signalled (respawner_lever's refusal)
SETTLE_BOUND = 'settle_bound'              # no respawn within the bound, the ancestors alive
SETTLE_NONE_ALIVE = 'settle_none_alive'    # no respawn, and none of the ancestors alive
GUEST_NOT_BACK = 'guest_not_back'          # a guest's systemd brought nothing back in the watch
GUEST_BACK = 'guest_back'                  # ... brought a holder back
NOT_WAITED = 'not_waited'                  # nothing left that could free the GPUs (held codes)
MEMORY_BACK = 'memory_back'                # the memory came back within release_timeout
MEMORY_HELD = 'memory_held'                # ... did not
RESET_SKIPPED = 'reset_skipped'            # processes still have the device open
# ... and what a signalled holder did in the wait after it (gpu_flow._escalate, _wait_outcomes).
SENT_FUTILE = 'sent_futile'                # sent, but SIGTERM cannot end it: SIGKILL at once
EXITED = 'exited'                          # its process ended
STILL_RUNNING = 'still_running'            # alive when the SIGTERM grace ran out
ALIVE_AFTER_KILL_STEP = 'alive_after_kill_step'   # alive when the SIGKILL wait ran out
STEPS = (SENT, GONE, REUSED) + SIGNAL_REFUSALS + (
    UNIT_STOPPED, UNIT_STOPPING, STOP_FAILED, MANAGER_NOT_RUNNING, NO_STOP, CONTAINER_STOPPED,
    SUPERVISED_STOPPED, SCOPE_STARTED, COMMAND_OK, COMMAND_FAILED, WOULD_STOP_UNIT, WOULD_STOP_CONTAINER,
    WOULD_STOP_SUPERVISED, WOULD_SIGNAL, WOULD_KILL_AFTER_TERM, WOULD_RUN, WOULD_WAIT, RESCAN_FOUND,
    RESPAWNER_TARGET, RESPAWNER_REFUSED, SETTLE_BOUND, SETTLE_NONE_ALIVE, GUEST_NOT_BACK, GUEST_BACK,
    NOT_WAITED, MEMORY_BACK, MEMORY_HELD, RESET_SKIPPED, SENT_FUTILE, EXITED, STILL_RUNNING,
    ALIVE_AFTER_KILL_STEP)

# Why a process is not adopted into a scope (gpu_adopt.refusal; gpu_say.not_adopted).
# A value shared with another group is that group's very code, of the same meaning (issue 32
# item 4: one meaning per value; test_gpu_lever checks that no other value is named twice).
ADOPT_NEVER = 'never'      # PID 0 or 1, or this module's own tree
ADOPT_GONE = GONE          # exited before adoption
ADOPT_REUSED = REUSED      # its PID is another process's now (start time changed)
ADOPT_KTHREAD = 'kthread'  # a kernel thread (the protection code KTHREAD below)
ADOPT_OWNED = 'owned'      # a unit, container, pod, guest or user's cgroup owns it
ADOPT_REFUSALS = (ADOPT_NEVER, ADOPT_GONE, ADOPT_REUSED, ADOPT_KTHREAD, ADOPT_OWNED)
# Why an adoption stopped (gpu_adopt.Adoption's `error_code`; gpu_say.adopt_error writes `error`).
ADOPT_NO_START_TIME = NO_START_TIME     # a root recorded without its start time: nothing done
ADOPT_SCOPE_REFUSED = 'scope_refused'   # systemd refused the transient scope
ADOPT_NO_CGROUP = 'no_cgroup'           # the scope's control group could not be read to verify
ADOPT_STRANGERS = 'strangers'           # the scope holds a PID this run did not plan
ADOPT_STOP_FAILED = STOP_FAILED         # the scope's stop failed
ADOPT_ERRORS = (ADOPT_NO_START_TIME, ADOPT_SCOPE_REFUSED, ADOPT_NO_CGROUP, ADOPT_STRANGERS, ADOPT_STOP_FAILED)

# Why an owner calls for a lever a person pulls (Lever.why; gpu_say.owner_clause).
POD_OWNS = 'kubelet_owns'          # the kubelet owns it
CONTAINER_INIT = 'runtime_init'    # the init of a container its runtime stops
RESTART_POLICY = 'policy_restarts'  # a container whose policy restarts it
GUEST_INIT = 'guest_init'          # the init of a guest
UNREACHABLE_INIT = 'unreachable_init'   # the init of a container no runtime here reaches
GUEST_UNIT = 'guest_unit'          # a service of a guest's own systemd
SUPERVISED = 'supervised'          # a program of a process supervisor (gpu_supervisor)
RUNTIME_UNREACHABLE = 'runtime_unreachable'   # a container whose runtime's CLI gave no answer
WHY_BY_HAND = (POD_OWNS, CONTAINER_INIT, RESTART_POLICY, GUEST_INIT, UNREACHABLE_INIT, GUEST_UNIT, SUPERVISED,
               RUNTIME_UNREACHABLE)

# Protection (gpu_decide.protection_code; the holder's `protected_code`).
PID_INIT, KTHREAD, OWN_TREE = 'pid_init', 'kthread', 'own_tree'
POD_SHIELD, INIT_SHIELD, INFRASTRUCTURE, PATTERN = 'pod', 'container_init', 'infrastructure', 'pattern'
PROTECTIONS = (PID_INIT, KTHREAD, OWN_TREE, POD_SHIELD, INIT_SHIELD, INFRASTRUCTURE, PATTERN)

Lever = collections.namedtuple('Lever', 'kind key owner argv refusal watch why')


def lever(kind, key=None, owner=None, argv=None, refusal=None, watch=None, why=None):
    return Lever(kind, key, owner, argv, refusal, watch, why)


# ---------------------------------------------------------------------------------------------
# The table: one row per way an owner is reached
# ---------------------------------------------------------------------------------------------

# A systemd manager: the system's, or a user's own (run as that user through her manager's
# private socket, gpu_observe.user_manager_call). `option`: the gpu_reclaim option allowing it.
UNITS = {
    gpu_owner.SYSTEM_MANAGER: {
        'lever': STOP_UNIT, 'option': 'stop_units', 'watch': WATCH_UNIT,
        'stop': ['systemctl', 'stop', '--no-block', '--', '{unit}'],
        'is_active': ['systemctl', 'is-active', '--', '{unit}'],
        'by_hand': ['systemctl', 'stop', '{unit}'],
    },
    gpu_owner.USER_MANAGER: {
        'lever': STOP_USER_UNIT, 'option': 'stop_units', 'watch': WATCH_UNIT,
        'stop': ['systemctl', '--user', 'stop', '--no-block', '--', '{unit}'],
        'is_active': ['systemctl', '--user', 'is-active', '--', '{unit}'],
        'by_hand': ['systemctl', '--user', 'stop', '{unit}'],
    },
}

# One row per container runtime or guest: the program that reaches it, how to read an owner's
# details (`{id}` and `{namespace}` filled in) and how that output is read, how to stop one
# (`stop` None: never from here: a pod is the kubelet's, a guest a whole operating system), the
# command a person runs to stop a unit inside a guest (`guest_stop`), and how a comeback is
# watched.
RUNTIMES = {
    'docker': {
        'cli': 'docker',
        'inspect': ['docker', 'inspect', '--type', 'container', '--', '{id}'],
        'parse': 'docker',
        'stop': ['docker', 'stop', '-t', '{grace}', '--', '{id}'],
        'watch': WATCH_CONTAINER,
    },
    'podman': {
        'cli': 'podman',
        'inspect': ['podman', 'container', 'inspect', '--', '{id}'],
        'parse': 'docker',
        'stop': ['podman', 'stop', '-t', '{grace}', '--', '{id}'],
        'watch': WATCH_CONTAINER,
    },
    'containerd': {
        'cli': 'nerdctl',
        'inspect': ['nerdctl', '--namespace', '{namespace}', 'container', 'inspect', '--', '{id}'],
        'parse': 'docker',
        'stop': ['nerdctl', '--namespace', '{namespace}', 'stop', '-t', '{grace}', '--', '{id}'],
        'watch': WATCH_CONTAINER,
    },
    'cri-containerd': {
        'cli': 'crictl',
        'inspect': ['crictl', 'inspect', '-o', 'json', '{id}'],
        'parse': 'crictl',
        'stop': None,
    },
    'cri-o': {
        'cli': 'crictl',
        'inspect': ['crictl', 'inspect', '-o', 'json', '{id}'],
        'parse': 'crictl',
        'stop': None,
    },
    'proxmox': {
        'cli': 'pct',
        'inspect': ['pct', 'config', '{id}'],
        'parse': 'pct',
        'stop': None,
        'guest_stop': ['pct', 'exec', '{id}', '--', 'systemctl', 'stop', '{unit}'],
        'stop_guest': ['pct', 'stop', '{id}'],
        'watch': WATCH_GUEST,
    },
    'lxc': {'cli': None, 'inspect': None, 'parse': None, 'stop': None,
            'guest_stop': ['lxc-attach', '-n', '{id}', '--', 'systemctl', 'stop', '{unit}'],
            'stop_guest': ['lxc-stop', '-n', '{id}'],
            'watch': WATCH_GUEST},
    'systemd-nspawn': {'cli': None, 'inspect': None, 'parse': None, 'stop': None,
                       'guest_stop': ['systemctl', '-M', '{id}', 'stop', '{unit}'],
                       'stop_guest': ['machinectl', 'stop', '{id}'],
                       'watch': WATCH_GUEST},
}

# Process supervisors: supervisord, runit, s6, pm2. Their rows also say how each is recognised
# on a holder's ancestry and how its status reads, so they are kept where that matching lives
# (gpu_supervisor.SUPERVISORS: identity, `status`, `stop`, `kill`, `manual`, `parse`); this is
# that same table, read here like the others (supervised_lever).
SUPERVISORS = supervisors.SUPERVISORS


def _fill(template, values):
    return [values.get(arg, arg) for arg in template]


def runtime_argv(runtime, action, owner, grace=None):
    """The argv for `action` ('inspect', 'stop', 'guest_stop', 'stop_guest': the whole guest, from
    its host) of `owner` through its runtime's
    row, or None when the runtime has no such command (a pod is never stopped from here)."""
    row = RUNTIMES.get(runtime)
    template = row.get(action) if row else None
    if not template:
        return None
    values = {'{id}': owner.id or '', '{namespace}': owner.namespace or 'default',
              '{grace}': '%d' % max(0, int(round(grace or 0))), '{unit}': owner.guest_unit or ''}
    return _fill(template, values)


def unit_argv(manager, action, unit):
    """The argv for `action` ('stop', 'is_active', 'by_hand') of `unit` on a systemd manager
    (gpu_owner.SYSTEM_MANAGER or USER_MANAGER)."""
    return _fill(UNITS[manager][action], {'{unit}': unit})


# ---------------------------------------------------------------------------------------------
# The levers of one holder
# ---------------------------------------------------------------------------------------------

def _owner(holder):
    return holder.owner or gpu_owner.new_owner(gpu_owner.NONE)


def is_container_init(holder):
    return holder.protected_code == INIT_SHIELD


def matches(holder, match_patterns):
    if not match_patterns:
        return True
    return any(p.search(holder.name) or p.search(holder.cmdline) for p in match_patterns)


def skip_code(holder, match_patterns):
    """Why the ladder leaves this holder alone (a reason code), or None when it is a target."""
    if holder.pid <= 1:
        return INIT
    if holder.protected:
        return PROTECTED
    if holder.state == 'zombie':
        return ZOMBIE
    if not matches(holder, match_patterns):
        return UNMATCHED
    owner = _owner(holder)
    if owner.kind == gpu_owner.SUPERVISOR:
        # Its supervisor restarts what is killed: only its own stop is a lever (gpu_supervisor).
        return supervisors.skip_code(owner)
    if runtime_unreachable(owner):
        # Its restart policy could not be read, and its runtime's stop is the lever: nothing is
        # signalled (a killed holder may come straight back), the failure names the command.
        return owner.cli_error['code']
    return None


def runtime_unreachable(owner):
    """Whether the owner is a container root named whose runtime's CLI (which this module
    would stop it with) is missing, hung or refused."""
    row = RUNTIMES.get(owner.runtime) or {}
    return owner.kind == gpu_owner.CONTAINER and bool(owner.cli_error) and bool(row.get('stop')) \
        and owner.controlled_by == gpu_owner.ROOT and bool(owner.id)


def signal_lever(holder, match_patterns):
    """The ladder's own lever, SIGTERM then SIGKILL on the holder (gpu_act.send_signal)."""
    return lever(SIGNAL, (holder.pid, holder.start_time), _owner(holder),
                 refusal=skip_code(holder, match_patterns))


def unit_lever(holder, protected_units=(), vendor_units=None, allowed=True, is_protected=None):
    """`systemctl stop UNIT` for the system service owning the holder: only where root named the
    cgroup and systemd confirmed the unit owns it (gpu_trust.STOP_UNIT); never a unit of
    `protected_units` or one `is_protected(unit, vendor_units)` names (gpu_decide.protected_unit)."""
    unit = holder.unit
    owner = _owner(holder)
    if not unit or not unit.endswith('.service'):
        return lever(STOP_UNIT, unit, owner, refusal=NOT_A_SERVICE)
    row = UNITS[gpu_owner.SYSTEM_MANAGER]
    refusal = trust.refusal(STOP_UNIT, holder.owner)
    if refusal is None and (unit in protected_units or (is_protected and is_protected(unit, vendor_units))):
        refusal = NEVER_STOPPED
    if refusal is None and not allowed:
        refusal = OPTION_OFF
    restarts = holder.unit_restart not in (None, 'no')
    return lever(STOP_UNIT, unit, owner, unit_argv(gpu_owner.SYSTEM_MANAGER, 'stop', unit), refusal,
                 row['watch'] if restarts else None)


def user_unit_lever(holder, allowed=True):
    """`systemctl --user stop UNIT` as the user, for her own confirmed service
    (gpu_trust.STOP_USER_UNIT)."""
    owner = _owner(holder)
    key = (owner.uid, owner.unit)
    refusal = trust.refusal(STOP_USER_UNIT, owner)
    if refusal is None and not allowed:
        refusal = OPTION_OFF
    argv = unit_argv(gpu_owner.USER_MANAGER, 'stop', owner.unit) if refusal is None else None
    restarts = holder.unit_restart not in (None, 'no')
    return lever(STOP_USER_UNIT, key, owner, argv, refusal,
                 UNITS[gpu_owner.USER_MANAGER]['watch'] if restarts else None)


def restart_policy(holder):
    """The restart policy of the holder's container when its runtime brings it back."""
    owner = _owner(holder)
    policy = owner.restart_policy
    if owner.kind == gpu_owner.CONTAINER and policy and policy != 'no':
        return policy
    return None


def container_lever(holder, match_patterns=(), protected_ids=frozenset(), allowed=True, grace=None):
    """The runtime's stop for the holder's container: only a container its runtime confirmed is
    the holder's, in cgroups root named (gpu_trust.STOP_CONTAINER), of a runtime that stops from
    here (never a pod's); never the caller's own, never for a holder protected for another reason
    than being the container's init, never one outside `match`."""
    owner = _owner(holder)
    key = (owner.runtime, owner.id)
    if owner.kind != gpu_owner.CONTAINER or not owner.id:
        return lever(STOP_CONTAINER, key, owner, refusal=trust.NOT_THAT_OWNER)
    refusal = trust.refusal(STOP_CONTAINER, owner)
    argv = runtime_argv(owner.runtime, 'stop', owner, grace)
    if refusal is None and not argv:
        refusal = NO_STOP
    if refusal is None and holder.protected and not is_container_init(holder):
        refusal = PROTECTED
    if refusal is None and not matches(holder, match_patterns):
        refusal = UNMATCHED
    if refusal is None and owner.id in protected_ids:
        refusal = CALLERS
    if refusal is None and not allowed:
        refusal = OPTION_OFF
    return lever(STOP_CONTAINER, key, owner, argv, refusal,
                 WATCH_CONTAINER if restart_policy(holder) else None)


def supervised_lever(holder, match_patterns=(), allowed=True, grace=0):
    """One program stopped through its own supervisor (a row of SUPERVISORS): only a program its
    supervisor, matched by identity, named in its status, whose CLI answered; never a protected
    or zombie holder's, never one outside `match`."""
    owner = _owner(holder)
    if owner.kind != gpu_owner.SUPERVISOR:
        return lever(STOP_SUPERVISED, None, owner, refusal=trust.NOT_THAT_OWNER)
    key = supervisors.key(owner)
    if not supervisors.stoppable(owner):
        refusal = supervisors.skip_code(owner)
    elif holder.protected:
        refusal = PROTECTED
    elif holder.state == 'zombie':
        refusal = ZOMBIE
    elif not matches(holder, match_patterns):
        refusal = UNMATCHED
    else:
        refusal = None if allowed else OPTION_OFF
    argv = supervisors.argv(owner.runtime, 'stop', owner.supervisor, owner.id, grace) \
        if owner.id and owner.supervisor else None
    return lever(STOP_SUPERVISED, key, owner, argv, refusal, WATCH_SUPERVISOR)


def guest_unit(holder):
    """(guest cgroup, service inside it) for a holder run by a guest's own systemd service: the
    key of its WATCH_GUEST watch; None otherwise."""
    owner = _owner(holder)
    unit = owner.guest_unit
    if owner.kind == gpu_owner.GUEST and unit and unit.endswith('.service'):
        return owner.cgroup.split('/' + unit)[0], unit
    return None


def respawner_lever(parent, match_patterns, holds_gpu):
    """The live ancestor that respawned ended holders, as the next target: refused when it is
    protected, when `match` is given and it does not match, or, without `match`, when it holds
    a GPU itself."""
    if parent.protected:
        refusal = PROTECTED
    elif match_patterns:
        refusal = None if matches(parent, match_patterns) else UNMATCHED
    else:
        refusal = HOLDS_GPU if holds_gpu else None
    return lever(STOP_RESPAWNER, (parent.pid, parent.start_time), _owner(parent),
                 ['kill', '%d' % parent.pid], refusal, WATCH_PARENT)


def by_hand(holder):
    """The lever a person pulls for a holder whose owner calls for more than the signal ladder
    (a pod, a container's init or restart policy, a guest's init or unit), its `why` saying
    which; None when the owner calls for nothing beyond the signals."""
    owner = _owner(holder)
    kind = owner.kind
    if kind == gpu_owner.SUPERVISOR:
        return supervised_lever(holder)._replace(why=SUPERVISED)
    if kind == gpu_owner.POD:
        return lever(DELETE_POD, owner.pod, owner, refusal=NO_STOP, why=POD_OWNS)
    if runtime_unreachable(owner):
        return lever(STOP_CONTAINER, (owner.runtime, owner.id), owner,
                     runtime_argv(owner.runtime, 'stop', owner, grace=10), owner.cli_error['code'],
                     why=RUNTIME_UNREACHABLE)
    container = container_lever(holder, grace=10)
    if container.refusal in (None, OPTION_OFF, UNMATCHED, CALLERS, PROTECTED) and container.argv:
        if is_container_init(holder):
            return container._replace(why=CONTAINER_INIT)
        if restart_policy(holder):
            return container._replace(why=RESTART_POLICY)
        return None
    if is_container_init(holder):
        if kind == gpu_owner.GUEST:
            argv = runtime_argv(owner.runtime, 'stop_guest', owner) if owner.id else None
            return lever(STOP_BY_HAND, owner.id, owner, argv, refusal=NO_STOP, why=GUEST_INIT)
        return lever(STOP_BY_HAND, owner.id, owner, refusal=NO_STOP, why=UNREACHABLE_INIT)
    if guest_unit(holder):
        argv = runtime_argv(owner.runtime, 'guest_stop', owner) if owner.id else None
        return lever(STOP_GUEST_UNIT, guest_unit(holder), owner, argv, NO_STOP,
                     (RUNTIMES.get(owner.runtime) or {}).get('watch', WATCH_GUEST), why=GUEST_UNIT)
    return None


def of(holder, match_patterns=(), protected_units=(), protected_ids=frozenset(), options=None, is_protected=None):
    """The one lever the holder's owner calls for, by the owner's kind: a supervised program's
    supervisor stop, a container's runtime stop, a system unit's or a user's unit's stop, a pod's
    or guest's lever a person pulls (by_hand), else the signal ladder itself. `options` maps
    the gpu_reclaim options that allow a lever (stop_units, stop_containers, stop_supervised) to
    their values (all true when not given)."""
    options = options or {}
    owner = _owner(holder)
    kind = owner.kind
    if kind == gpu_owner.SUPERVISOR:
        return supervised_lever(holder, match_patterns, options.get('stop_supervised', True))
    if kind == gpu_owner.CONTAINER:
        chosen = container_lever(holder, match_patterns, protected_ids, options.get('stop_containers', True))
        if chosen.argv or chosen.refusal != NO_STOP:
            return chosen
    if kind in (gpu_owner.POD, gpu_owner.GUEST, gpu_owner.CONTAINER):
        return by_hand(holder) or signal_lever(holder, match_patterns)
    if owner.manager == gpu_owner.SYSTEM_MANAGER and (holder.unit or '').endswith('.service'):
        return unit_lever(holder, protected_units, allowed=options.get('stop_units', True), is_protected=is_protected)
    if owner.manager == gpu_owner.USER_MANAGER:
        return user_unit_lever(holder, options.get('stop_units', True))
    return signal_lever(holder, match_patterns)
