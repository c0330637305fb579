#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_reclaim
short_description: Free NVIDIA GPUs by escalating from unit stop to SIGKILL, and prove the memory is back
version_added: "1.0.0"
description:
  - Finds the holders of the selected GPUs (O(gpus)) exactly as M(gpuops.reclaim.gpu_holders)
    does, then escalates on them only; processes that hold only other GPUs are never touched
  - 0. stops the container that owns a holder through its runtime (O(stop_containers)), and the
    program of a holder that a process supervisor runs through that supervisor (O(stop_supervised));
  - 1. stops the systemd service unit that owns a holder (O(stop_units)), so C(Restart=) cannot
    bring it back; a unit of a user's own manager is stopped through that manager, as that user;
  - Levers and shields follow a trust boundary. Only cgroups root named choose a system unit
    stop, a runtime stop, or a pod's or container init's protection; a cgroup in a user's
    delegated subtree (below C(user@UID.service)) or below a directory root does not own names
    at most that user's own processes and units. A unit counts only when systemd confirms that
    its C(ControlGroup) is the holder's cgroup and its name passes systemd's unit-name grammar
    (no glob reaches systemctl); a container only when its runtime's inspect gives an init PID
    in the holder's container. Process names, command lines and PID namespaces shield nothing
    by themselves (see M(gpuops.reclaim.gpu_holders)).
  - 2. sends SIGTERM (and SIGCONT right after it to a stopped holder, as systemd does) and waits
    up to O(term_timeout), returning as soon as they are gone; a process whose signal mask
    ignores SIGTERM (C(SigIgn) in C(/proc/PID/status)), that is PID 1 of its own PID namespace
    with no SIGTERM handler (C(SigCgt); the kernel drops the signal), or that a tracer holds
    stopped, gets SIGKILL right away, since waiting for it frees nothing;
  - 3. sends SIGKILL to the survivors;
  - 4. rescans up to O(passes) times for holders that appeared or were left (respawns, forked
    children holding an inherited context, orphans) and treats them the same. Before it calls
    the GPUs free it watches the live ancestors of what it ended (up to PID 1, its own process
    tree, a systemd manager or a protected process; nothing for orphans of PID 1) for up to
    3 seconds, and no longer than one of them lives. An ancestor under which a new process runs
    the program of an ended one again (the same executable; whatever its title or command
    line), or takes a GPU context, respawns it (a shell or Python loop, or a loop restarting the
    launcher of the holder); it and what it started are stopped (SIGSTOP, so none starts
    another) and become the targets when it matches O(match) (or, without O(match), holds no
    GPU) and is not protected; otherwise the task fails naming it (PID, name, command line) and
    the command that ends it;
  - 5. polls NVML until the used memory is back within O(free_threshold_mib) or
    O(release_timeout) runs out, with no fixed sleeps; a GPU that only holders it may not or
    could not end (protected, outside O(match), zombies, alive after SIGKILL) keep, or whose
    memory no visible process holds and does not fall, is not waited for, and the task fails at
    once;
  - 6. with O(allow_reset), resets a GPU that is still held with no process left on it
    (persistence mode off for the reset and restored), and verifies again.
  - It signals context holders only, so it reads only the processes NVML lists when NVML
    charges every used MiB of the selected GPUs (beyond O(free_threshold_mib), and the up to 8 MiB
    the driver itself uses for each listed context after the first) to live processes here, as
    M(gpuops.reclaim.gpu_holders) does with O(gpuops.reclaim.gpu_holders#module:handles=false);
    every process is read whenever memory is unexplained (also in each rescan, so a forked child
    holding a dead parent's context is found), with O(peers), and before a reset. Handle holders
    (C(handles) in RV(before) and RV(after), handle-kind entries in RV(holders)) are then only
    reported where every process was read.
  - Before every signal the PID is re-identified by its start time (through a pidfd where the
    kernel has them); a PID reused since detection is never signalled. PID 0, 1, negative
    PIDs, this module's own process tree and protected processes are never signalled.
  - Fails, when a selected GPU is not free at the end, with a message naming the GPU, the MiB
    still used, each PID left with its state, and the next lever (reset, reboot, the host
    outside this container).
author:
  - gpuops.reclaim maintainers (@gpuops)
requirements:
  - root, to signal other users' processes and to stop units.
attributes:
  check_mode:
    support: full
    description:
      - Runs the same ladder and returns its steps in RV(actions) (results C(would ...)), sending
        nothing; each process is assumed to exit on the signal it would get.
  diff_mode:
    support: none
    description: The change is a set of stopped processes, reported in RV(actions).
options:
  term_timeout:
    description:
      - Seconds to wait after a unit stop or SIGTERM before SIGKILL (the grace period).
    type: float
    default: 30.0
  release_timeout:
    description:
      - Seconds to wait, polling NVML, for the memory to come back once the holders are gone.
    type: float
    default: 60.0
  passes:
    description:
      - How many rescans look for holders that appeared or were left after the first round.
    type: int
    default: 3
  stop_units:
    description:
      - Stop the systemd service unit that owns a holder instead of fighting its C(Restart=).
      - Only a system unit whose cgroup root named and whose C(ControlGroup) systemd confirms is
        the holder's; a user's own service (in her delegated subtree, confirmed by her manager) is
        stopped as her, through her manager (C(systemctl --user stop) on its private socket).
      - Units of this module's own session and infrastructure units (ssh, dbus, dcgm, ...)
        are never stopped.
    type: bool
    default: true
  stop_containers:
    description:
      - Stop the docker, podman or containerd (nerdctl) container that owns a holder through its
        runtime (C(podman stop -t GRACE ID), C(docker stop -t GRACE ID) with O(term_timeout) as
        the grace, 0 with O(force)), before any signal, so its restart policy cannot bring the
        holder back and a container's PID 1 holding a GPU is reached. Containers are never
        removed.
      - The owner is read from C(/proc/PID/cgroup), in cgroups root named only; the runtime's
        CLI must be on the host and its inspect must give an init PID in that container (a
        container id a user wrote into her own cgroup names is never stopped).
      - A Kubernetes pod's processes are never signalled and its containers never stopped; the
        failure names the pod and says to delete or evict it.
      - A container's PID 1 is protected only when its runtime confirms the container (or it is
        a guest's init); the PID 1 of a namespace any user can make (C(unshare -Urpf)) is not.
      - With V(false), a holder whose container restarts it (its runtime reports a restart
        policy) is left alone, since killing it would only bring it back, and the failure names
        the container.
    type: bool
    default: true
  stop_supervised:
    description:
      - "Stop the program of a holder that a process supervisor runs through that supervisor, before
        any signal, so its autorestart cannot bring the holder back: supervisord (C(supervisorctl -c
        CONF stop PROGRAM)), runit (C(sv -w GRACE force-stop DIR)), s6 (C(s6-svc -wd -T MS -d DIR)),
        pm2 (C(pm2 stop NAME), run as the daemon's user). Every other program of that supervisor,
        the supervisor and its systemd unit keep running; the unit is never stopped whole
        (O(stop_units) does not apply to it). The program is watched to stay down (its supervisor's
        status) before the GPUs count as free."
      - "The supervisor is recognised by identity on the holder's ancestry, never by a title or a
        command line: its unit's MainPID (systemd's record), a root-owned executable, root-owned
        service directories; the program from the supervisor's own status, matched by PID (see
        M(gpuops.reclaim.gpu_holders), owner kind C(supervisor))."
      - "A supervised holder is never signalled. With V(false), or when the supervisor's CLI is
        missing, does not answer within O(nvml_timeout) or refuses, it is left and the failure names
        the exact command to run by hand (e.g. C(supervisorctl -c /etc/supervisor/supervisord.conf
        stop worker))."
    type: bool
    default: true
  match:
    description:
      - Regular expressions; when given, only holders whose name or command line matches one
        are signalled. The others are reported in RV(remaining).
    type: list
    elements: str
    default: []
  force:
    description:
      - Skip the grace of steps 1 and 2, SIGKILL at once (the "use all levers" case).
    type: bool
    default: false
  allow_reset:
    description:
      - As the last resort, C(nvidia-smi --gpu-reset) a GPU that is still held with no process
        left on it (a leaked context).
      - Refused, before anything is signalled, when the module cannot read other users'
        processes (not root, no C(CAP_SYS_PTRACE)), since memory it cannot explain is then no
        evidence of a leak. Run as root (C(become=true)).
    type: bool
    default: false
  spare_units:
    description:
      - systemd units (C(sglang.service); a name without a suffix means C(.service)) whose
        processes are kept, to free strays beside a healthy server without touching it.
      - Their holders are never signalled and their units never stopped; they are returned in
        RV(spared), not in RV(remaining).
      - A selected GPU then counts as free when no other process holds a context on it and its
        used memory less the memory NVML charges to the spared processes is at most
        O(free_threshold_mib). Memory NVML charges to no process still counts.
      - A name that is not a unit name fails before anything is signalled.
    type: list
    elements: str
    default: []
  peers:
    description:
      - Also target processes that map peer memory on a selected GPU while their context is on
        another GPU (NCCL or CUDA IPC; after a tensor-parallel rank died, the surviving ranks keep
        its buffers allocated, charged by NVML to no process). Such a process ends, so its own
        GPUs are freed too.
      - Without it, they are never signalled; a GPU they keep held fails naming them, their GPU,
        and this option.
    type: bool
    default: false
  lock_timeout:
    description:
      - Seconds to wait for another gpu_reclaim run on the same host (a pipeline and a drift
        timer, say) to finish. Runs as root take a host lock (C(flock) on C(/run/gpuops/gpu-reclaim.lock))
        so their ladders never interleave; the waiting run then surveys what the first left and
        reports that. When the wait runs out the task fails naming the other run, having
        signalled nothing. Check mode takes no lock.
      - The lock's directory C(/run/gpuops) is made owned by root, mode 0700, so no other user can
        hold or replace the lock; a directory or file there that is not root's alone (a link,
        another owner, group or other access) fails the run naming it, having signalled nothing.
        A run that is not root takes no host lock (it may signal only its own user's processes).
      - This lock is apart from the C(gpuops.reclaim.reclaim_timer) role's run lock, which its
        script holds around a whole playbook run; a run under that lock still takes this one.
    type: float
    default: 300.0
  metrics:
    description:
      - Also write the run's metrics file for node_exporter, as M(gpuops.reclaim.run_metrics) writes it
        with this run's result as its only O(gpuops.reclaim.run_metrics#module:reclaims) and this module's
        O(free_threshold_mib), after the reclaim (on failure too, as C(reclaim_failed)). In check mode it
        is rendered and nothing is written.
      - C(playbooks/reclaim.yml) passes it for a host whose run ends with its stray reclaim (no
        inference server), so that host needs one module call instead of two (issue 31 item 5).
      - A file that cannot be read or written, or a bad value here, never fails the reclaim; RV(metrics)
        is then left out, and the playbook's M(gpuops.reclaim.run_metrics) task writes the file (or fails
        saying why) as for any other host.
    type: dict
    suboptions:
      dir:
        description: The textfile collector's directory; an empty string writes nothing.
        type: str
        default: /var/lib/prometheus/node-exporter
      name:
        description: The file's name in O(metrics.dir), ending in C(.prom).
        type: str
        default: gpuops_reclaim.prom
      started:
        description: When the run started, in seconds since the Unix epoch (the controller's clock).
        type: float
        required: true
      duration_s:
        description:
          - How long the run took before this task, in seconds; the module adds its own time until
            it writes the file.
        type: float
        required: true
      interval:
        description: As M(gpuops.reclaim.run_metrics)'s O(gpuops.reclaim.run_metrics#module:interval).
        type: str
extends_documentation_fragment:
  - gpuops.reclaim.gpu_survey
seealso:
  - module: gpuops.reclaim.gpu_holders
notes:
  - O(protect) and O(match) patterns are evaluated with a time bound (2 s per pattern and
    process); a pattern that exceeds it (catastrophic backtracking) fails the task naming it,
    before anything is signalled.
  - In check mode the steps come from the observations of a host nothing was done to; holders a
    real run would find on rescan (respawns, forks) cannot be known in advance.
"""

EXAMPLES = r"""
- name: Free GPU 2 after a crashed tensor-parallel server left an orphan on it
  gpuops.reclaim.gpu_reclaim:
    gpus: ["2"]

- name: Use all levers on every GPU, including a reset of leaked memory
  gpuops.reclaim.gpu_reclaim:
    force: true
    allow_reset: true

- name: Only touch SGLang processes; keep the notebook kernel
  gpuops.reclaim.gpu_reclaim:
    match: ["sglang", "launch_server"]
    protect: ["jupyter"]
    term_timeout: 20

- name: Free strays on the server's GPUs, keep the server
  gpuops.reclaim.gpu_reclaim:
    gpus: ["0", "1"]
    spare_units: ["sglang.service"]

- name: Free every GPU except those a server is assigned to
  gpuops.reclaim.gpu_reclaim:
    exclude: ["0", "1"]

- name: What would it do?
  gpuops.reclaim.gpu_reclaim:
  check_mode: true
  register: plan
"""

RETURN = r"""
changed:
  description: True when a step changed the host (a container or unit stopped, a signal sent, a GPU reset); in check mode, when one would.
  returned: always
  type: bool
actions:
  description:
    - What was done, in order, one entry per step; in check mode the same steps a real run takes
      from the same observation, each only recorded (results C(would ...)).
  returned: always
  type: list
  elements: dict
  contains:
    step:
      description:
        - "stop_container, stop_supervised (a program stopped through its own supervisor, then watched
          to stay down), stop_unit, stop_user_unit (a unit of a user's own manager, stopped as that
          user), sigstop (a respawner and what it started, before they are ended),
          sigterm, sigcont (right after SIGTERM, to a stopped holder or a stopped respawner), sigkill,
          unreachable, rescan, respawn (a watched ancestor ran an ended program again, or started a new
          holder), settle (the live ancestors watched before calling the GPUs free), watch_respawn (after killing
          a guest's service from its host, whether the guest's systemd started it again), wait_release,
          persistence_off, reset, persistence_on."
      type: str
      returned: always
    target:
      description: "What the step acted on: C(PID 194909 (sglang::schedul)), a unit name, C(GPU 2)."
      type: str
      returned: always
    result:
      description:
        - "What happened, e.g. C(exited after SIGTERM in 0.12 s), C(still running 30.00 s after SIGTERM),
          C(sent; ignored (SigIgn\\): SIGKILL at once), C(sent; dropped by the kernel (PID 1 of its PID
          namespace, no SIGTERM handler\\): SIGKILL at once), C(gone) (exited before), C(reused) (the PID is
          another process now, not signalled), C(refused: ...), C(stopped in 0.84 s), C(ok),
          C(failed (rc=N\\): ...), C(memory back after 0.40 s)."
        - "In check mode C(would send SIGTERM), C(would stop it ...), C(would run ...)."
      type: str
      returned: always
    code:
      description:
        - "The code C(result) was written from: read it, never C(result)'s words. A signal's V(sent),
          V(gone), V(reused) or refusal (V(pid_never), V(pid_protected), V(no_start_time),
          V(not_permitted)); what a signalled holder did (V(exited), V(still_running),
          V(sent_futile): SIGKILL at once, V(alive_after_kill_step)); an owner's stop
          (V(unit_stopped), V(unit_stopping), V(stop_failed), V(manager_not_running), V(no_stop),
          V(container_stopped), V(supervised_stopped)); a command's V(command_ok) or
          V(command_failed); the ladder's own steps (V(rescan_found), V(respawner_target),
          V(respawner_refused), V(settle_bound), V(settle_none_alive), V(guest_not_back),
          V(guest_back), V(not_waited), V(memory_back), V(memory_held), V(reset_skipped)); in check
          mode V(would_stop_unit), V(would_stop_container), V(would_stop_supervised),
          V(would_signal), V(would_kill_after_term), V(would_run), V(would_wait)."
      type: str
      returned: always
    changed:
      description: "Whether this step changed the host (in check mode: would)."
      type: bool
      returned: always
    at_s:
      description: "Seconds since the module started, when the step was taken."
      type: float
      returned: always
    took_s:
      description: "Seconds the step took: for unit stops and reset commands, how long the command
        ran; for a signal that ended its process, from the signal until the process was gone."
      type: float
      returned: when the step waits for a command, or a signalled process was seen gone
    pid:
      description: "The process, for signal and unreachable steps."
      type: int
      returned: when a process is concerned
    name:
      description: "The process's or the container's name."
      type: str
      returned: when a process or a container is concerned
    gpus:
      description: "GPU indices: those the signalled process holds, or those waited on (wait_release)."
      type: list
      elements: int
      returned: for signal and wait_release steps
    unit:
      description: "The unit, for stop_unit and stop_user_unit."
      type: str
      returned: when a unit is concerned
    uid:
      description: "The user whose own manager stopped the unit, for stop_user_unit."
      type: int
      returned: for stop_user_unit
    container:
      description: "The container id, for stop_container."
      type: str
      returned: when a container is concerned
    runtime:
      description: "The container's runtime (docker, podman, containerd), for stop_container; the
        supervisor (supervisord, runit, s6, pm2), for stop_supervised."
      type: str
      returned: when a container or a supervisor is concerned
    program:
      description: "The supervised program, for stop_supervised (C(unit) is then the supervisor's unit)."
      type: str
      returned: for stop_supervised
    command:
      description: "The stop of stop_supervised as a person would run it by hand."
      type: str
      returned: for stop_supervised
    gpu:
      description: "The GPU index, for reset steps."
      type: int
      returned: when a GPU is concerned
    pids:
      description: "The holders a rescan found left or new; the new processes a respawn step saw; the ancestors a settle step watched."
      type: list
      elements: int
      returned: for rescan, respawn and settle
    guest_units:
      description: "The guest's services watched, for watch_respawn."
      type: list
      elements: str
      returned: for watch_respawn
    waited_s:
      description: "Seconds waited for the memory."
      type: float
      returned: for wait_release
    watched_s:
      description: "Seconds the ancestors were watched (at most C(bound_s); less when none was left alive)."
      type: float
      returned: for settle
    bound_s:
      description: "How long ancestors are watched at most."
      type: float
      returned: for settle
  sample:
    - {at_s: 0.012, step: sigterm, target: "PID 194909 (sglang::schedul)", pid: 194909, name: "sglang::schedul",
       gpus: [2], result: "still running 30.00 s after SIGTERM", changed: true}
    - {at_s: 30.034, step: sigkill, target: "PID 194909 (sglang::schedul)", pid: 194909, name: "sglang::schedul",
       gpus: [2], result: "exited after SIGKILL in 0.02 s", changed: true}
before:
  description: The GPU table (as M(gpuops.reclaim.gpu_holders) returns in C(gpus)) before acting.
  returned: always
  type: list
  elements: dict
after:
  description: The GPU table at the end.
  returned: always
  type: list
  elements: dict
elapsed_s:
  description: Seconds from start to the final verification.
  returned: always
  type: float
free:
  description: Every selected GPU is free at the end (with O(spare_units), free of every process but the spared ones).
  returned: always
  type: bool
holders:
  description:
    - The holders of the selected GPUs as the first survey found them, the same list
      M(gpuops.reclaim.gpu_holders) returns in its C(holders) (with
      O(gpuops.reclaim.gpu_holders#module:handles=false), so handle holders only where every process was read),
      so that a caller needs no separate survey to decide or to report what was there.
  returned: always
  type: list
  elements: dict
spared:
  description: Holders of the selected GPUs owned by a unit of O(spare_units), as the last survey found them; never signalled.
  returned: always
  type: list
  elements: dict
remaining:
  description:
    - Holders left on the selected GPUs, each with a C(reason), and each live ancestor that kept
      respawning holders and was not ended (C(kind) C(respawner)).
    - Each also carries C(reason_code), why it is left, for callers and tests to read instead of
      the sentence. C(init) PID 1 or below; C(protected) (its C(protected_reason) says why);
      C(zombie) its parent must reap it; C(unmatched) outside O(match); C(survived) a target
      still alive after the ladder; C(peer_memory) maps peer memory of a GPU still held (its
      C(lever) says what to do); C(device_open) a handle on a GPU still held (blocks a reset);
      C(respawns) an ancestor that kept respawning holders; C(supervised) a supervisor's program left
      by O(stop_supervised=false); C(cli_missing), C(cli_timeout), C(cli_failed) a holder of a
      container or a supervisor whose CLI is not on PATH, did not answer within O(nvml_timeout)
      or refused (nothing signalled; its C(reason) names the command to run by hand);
      C(supervisor_not_listed), C(supervisor_stop_failed), C(supervisor_restarted) its supervisor
      listed no such program, did not put it down, or started it again.
  returned: always
  type: list
  elements: dict
diagnosis:
  description: Plain sentences about the final state (see M(gpuops.reclaim.gpu_holders)).
  returned: always
  type: list
  elements: str
backend:
  description: "Where GPU facts came from: nvml or nvidia-smi."
  returned: always
  type: str
host_lock:
  description: The host lock this run held, and how long it waited for another run first.
  returned: when not in check mode
  type: dict
  contains:
    path:
      description: "The lock file; null for a run that is not root, which takes no host lock."
      type: str
      returned: always
    waited_s:
      description: "Seconds spent waiting for the lock (0 when no other run held it)."
      type: float
      returned: always
    waited_for:
      description:
        - "Who held the lock when this run had to wait: what another gpu_reclaim run wrote into the
          lock file (C(PID N since TIME)); for a holder that wrote nothing (C(flock(1)), say),
          C(PID N (command)) as C(/proc/locks) names it; C(another process) when neither says.
          Null when none was waited for."
      type: str
      returned: always
  sample: {path: /run/gpuops/gpu-reclaim.lock, waited_s: 4.21, waited_for: "PID 20817 since 2026-11-30T22:41:07+0000"}
metrics:
  description:
    - What O(metrics) wrote, as M(gpuops.reclaim.run_metrics) returns it (C(file), C(written), C(previous),
      and C(metrics), the file's text, except beside a file that module did not write).
  returned: when O(metrics) is set and the file could be read (and, not in check mode, written)
  type: dict
  sample: {file: /var/lib/prometheus/node-exporter/gpuops_reclaim.prom, written: true, previous: carried,
           metrics: "# gpuops.reclaim run metrics ..."}
msg:
  description: When not free, what is left and the next lever.
  returned: failure
  type: str
  sample: "GPU 2 (GPU-5d1c...) still holds 76107 MiB after 12.4 s: PID 194909 (sglang::schedul) disk-sleep:
    it is in uninterruptible sleep and ignores SIGKILL: reset the GPU (allow_reset: true) or reboot the host."
"""

import time

from ansible.module_utils.basic import AnsibleModule

# Before the other module_utils: on a managed host they then load as compiled by an earlier run
# (gpu_bytecode; compiling them was most of what this module paid over a ping, issue 31 item 5).
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_bytecode  # noqa: F401 pylint: disable=unused-import
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_flow import (
    RECLAIM_ARGUMENT_SPEC, SURVEY_ARGUMENT_SPEC, ladder_from_params, pattern_error, reclaim_param_error)


METRICS_SPEC = dict(type='dict', options=dict(
    dir=dict(type='str', default='/var/lib/prometheus/node-exporter'),
    name=dict(type='str', default='gpuops_reclaim.prom'),
    started=dict(type='float', required=True),
    duration_s=dict(type='float', required=True),
    interval=dict(type='str'),
))


def main():
    started = time.monotonic()
    module = AnsibleModule(argument_spec=dict(SURVEY_ARGUMENT_SPEC, metrics=METRICS_SPEC, **RECLAIM_ARGUMENT_SPEC),
                           supports_check_mode=True)
    params = module.params
    error = reclaim_param_error(params)
    if error:
        fail(module, started, msg=error)
    try:
        ladder = ladder_from_params(params, module.check_mode)
        blind = say.blind(ladder.surveyor.access)
        if blind and params['allow_reset']:
            fail(module, started, msg=say.reset_refused_blind(blind))
        if module.check_mode:
            result = ladder.run()
        else:
            # Imported here: the module's files are compiled at every run, and check mode
            # takes no lock.
            from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_lock import LockTimeout, LockUnsafe, host_lock
            try:
                # One ladder per host at a time; the lock goes with this process, however it ends.
                with host_lock(params['lock_timeout']) as lock:
                    result = ladder.run()
            except (LockTimeout, LockUnsafe) as exc:
                fail(module, started, msg=str(exc), actions=[], elapsed_s=round(time.monotonic() - started, 3))
            result['host_lock'] = lock.report()
    except pattern_error() as exc:
        fail(module, started, msg='%s. Nothing was signalled.' % exc, actions=[],
             elapsed_s=round(time.monotonic() - started, 3))
    except (ValueError, observe.ObserveError) as exc:
        fail(module, started, msg=str(exc))
    if ladder.surveyor.backend.warning:
        module.warn(ladder.surveyor.backend.warning)
    if 'msg' in result:
        fail(module, started, **result)
    add_metrics(module, started, result)
    module.exit_json(**result)


def fail(module, started, **result):
    """fail_json, after the run's metrics (as reclaim_failed) when they were asked for."""
    add_metrics(module, started, result, failed=True)
    module.fail_json(**result)


def add_metrics(module, started, result, failed=False):
    """Write the run's metrics file (O(metrics)) with this result, and put what was written in
    result['metrics']. Any trouble is left to the playbook's run_metrics task: nothing is added."""
    asked = module.params['metrics']
    if asked is None:
        return
    # Imported here: only the playbook's hosts without a server ask for it, and the module's
    # files are compiled at every run.
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_metrics_file as metrics_file
    params = dict(asked, duration_s=asked['duration_s'] + (time.monotonic() - started),
                  failure={'stage': 'reclaim', 'msg': result.get('msg')} if failed else None,
                  reclaims=[result], surveys=[], server=None, free_threshold_mib=module.params['free_threshold_mib'])
    if metrics_file.param_error(params):
        return
    if not params['dir']:
        result['metrics'] = dict(file=None, written=False, previous=None)
        return
    try:
        written, warnings = metrics_file.write_run(params, module.check_mode)
    except Exception:  # pylint: disable=broad-except
        # The reclaim's result stands whatever the metrics file does; run_metrics, which the
        # playbook then runs, says what went wrong.
        return
    for warning in warnings:
        module.warn(warning)
    result['metrics'] = written


if __name__ == '__main__':
    main()
