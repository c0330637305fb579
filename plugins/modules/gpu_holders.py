#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_holders
short_description: Find every process holding each NVIDIA GPU, by the resource, not by name
version_added: "1.0.0"
description:
  - Reads NVML (through nvidia-ml-py) for each GPU's memory and the contexts the driver lists,
    and C(/proc) for every process that has a per-GPU device node (C(/dev/nvidia<minor>)) open
    or mapped, and merges them per process.
  - A process is a C(context) holder of a GPU when NVML lists it there, or, for a process NVML
    does not list, when it maps that GPU's device node and NVML charges the GPU's memory to no
    live process here (the forked child that inherited a dead parent's context). It is a
    C(handle) holder of a GPU whose node it has open or mapped without a context there, since a real
    CUDA process opens and maps the node of every visible GPU. Processes that only have shared
    nodes (C(/dev/nvidiactl), C(/dev/nvidia-uvm)) open, such as monitoring tools, are returned
    apart as RV(clients).
  - Device nodes are mapped to GPU indices through NVML's minor numbers, never by assuming
    that C(/dev/nvidiaN) is GPU N.
  - Names each holder's owner (RV(holders[].owner)), read from C(/proc/PID/cgroup), as a systemd
    unit, a docker, podman or containerd container, a Kubernetes pod, or an LXC, Proxmox or
    systemd-nspawn guest, with its readable name where the runtime's CLI is on the host.
  - Marks processes that must never be signalled (PID 1, kernel threads, every process of a
    Kubernetes pod, the init of a container or guest, this module and the session that runs
    it, GPU and cluster infrastructure such as nvidia-persistenced, nv-hostengine, dcgm-exporter, nv-fabricmanager, Xorg, MPS, slurmstepd, orted, plus
    O(protect)).
  - Protection is by identity, never by what a local user can make. A pod counts only in the
    kubelet's cgroups root named; a container's init only when its runtime's inspect gives that
    init (a guest's init where root named the guest's cgroup), never the PID 1 of a namespace
    any user can make; an infrastructure name only for a process running as root from a
    root-owned executable, in a confirmed system unit never stopped, or that systemd names the
    main process of one (a user's manager). A user's holder titled C(sshd) is not protected.
  - Explains in RV(diagnosis) what a process list cannot show, such as memory held by no visible
    process, NVML PIDs that do not exist here, D-state holders, zombies, holders whose
    systemd unit would restart them, and peer memory (NCCL, CUDA IPC) that a process with its
    context on another GPU keeps allocated.
  - 'Without root (no C(CAP_SYS_PTRACE)), other users'' processes are unreadable or, with
    C(hidepid), invisible; RV(diagnosis) then says first "Run as root (become: true)" and never
    blames unexplained memory on a leaked context.'
  - Read-only; never changes the host.
author:
  - gpuops.reclaim maintainers (@gpuops)
options:
  handles:
    description:
      - Read every process's file descriptors and mappings, to report handle holders
        (RV(gpus[].handles)), RV(clients) and peers as well as contexts.
      - With V(false), when NVML charges every used MiB of the selected GPUs (beyond
        O(free_threshold_mib), and the up to 8 MiB the driver itself uses for each listed context
        after the first) to live processes here that have the device open, only those
        processes are read, which costs a fraction of a scan of every process on a busy host;
        RV(clients), handle holders and peers are then not looked for. Every process is still
        read when memory is unexplained (a forked child holding an inherited context, a process
        that closed its fds). RV(scan) says which was done.
    type: bool
    default: true
  health:
    description:
      - Read each selected GPU's health into RV(gpus[].health), whether NVML reaches it, row
        remapping, volatile uncorrectable ECC errors, retired pages pending, the driver's recovery
        action field, and critical Xid errors in the kernel log.
      - Each read is bounded by O(nvml_timeout); one that fails or hangs is named in
        C(facts.unread) of RV(gpus[].health) and the reads after a hung one are not made.
    type: bool
    default: true
  xid_since:
    description:
      - Count Xid errors logged at or after this time (epoch seconds), e.g. the last good start
        of the server on these GPUs. Null counts every Xid of this boot.
    type: float
  xid_log:
    description:
      - Read Xid lines from this file instead of the kernel log (C(journalctl -k)); each line as
        C(journalctl -k -o short-unix) prints it (epoch seconds first). The file must be a
        regular file only root (or the module's user) may write. The lab's stand-in driver
        writes one (C(fakegpu xid)).
    type: path
extends_documentation_fragment:
  - gpuops.reclaim.gpu_survey
  - gpuops.reclaim.read_only
seealso:
  - module: gpuops.reclaim.gpu_reclaim
notes:
  - Inside a container NVML may list host PIDs or none at all; such PIDs are never treated as
    local processes and are explained in RV(diagnosis).
"""

EXAMPLES = r"""
- name: Who holds GPU 2?
  gpuops.reclaim.gpu_holders:
    gpus: ["2"]
  register: gpu2

- name: Show the holders that may be killed
  ansible.builtin.debug:
    msg: "{{ gpu2.holders | rejectattr('protected') | map(attribute='pid') | list }}"

- name: Fail early when any GPU is held (a drift check)
  gpuops.reclaim.gpu_holders:
  register: all_gpus
  failed_when: not all_gpus.free

- name: Treat our own exporter as infrastructure
  gpuops.reclaim.gpu_holders:
    protect: ["^my-gpu-exporter$"]
"""

RETURN = r"""
gpus:
  description: One entry per selected GPU.
  returned: success
  type: list
  elements: dict
  contains:
    index:
      description: "NVML index."
      type: int
      returned: success
    uuid:
      description: "GPU UUID."
      type: str
      returned: success
    name:
      description: "Product name."
      type: str
      returned: success
    pci_bus_id:
      description: "PCI bus id."
      type: str
      returned: success
    minor_number:
      description: "Minor number of the GPU's device node /dev/nvidia<minor>."
      type: int
      returned: success
    memory_total_mib:
      description: "Total memory in MiB."
      type: int
      returned: success
    memory_used_mib:
      description: "Used memory in MiB, excluding reserved (what nvidia-smi shows)."
      type: int
      returned: success
    memory_reserved_mib:
      description: "Memory the driver reserves for itself, in MiB."
      type: int
      returned: success
    persistence_mode:
      description: "Whether persistence mode is on, or null when unknown."
      type: bool
      returned: success
    holders:
      description: "PIDs holding a context on this GPU."
      type: list
      elements: int
      returned: success
    handles:
      description: "PIDs with this GPU's device node open or mapped but no context on it; they block a reset."
      type: list
      elements: int
      returned: success
    peers:
      description: >-
        PIDs that map peer memory of this GPU (NCCL, CUDA IPC): NVML charges its used memory to no
        process, and they map its device node while their context is on another GPU. The memory
        stays until they exit (gpu_reclaim's O(gpuops.reclaim.gpu_reclaim#module:peers)).
      type: list
      elements: int
      returned: success
    free:
      description: "No context on it and used memory within O(free_threshold_mib)."
      type: bool
      returned: success
    health:
      description:
        - "With O(health): what the driver says of this GPU's health, judged (issue 30). C(code) is
          the worst problem found: lost (NVML answers GPU is lost), recovery_action (the driver's
          field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION asks for an action), row_remap_failed,
          critical_xid, row_remap_pending, ecc_uncorrected (volatile uncorrectable ECC errors),
          retired_pages_pending; or unread (nothing wrong was read but a read failed or hung) or
          healthy."
        - "C(lever): what NVIDIA prescribes for the problems found, the heaviest of them: reboot,
          service (field diagnostics, RMA), drain_reset, drain_p2p, reset (once nothing holds the
          GPU); null when healthy or unread."
        - "C(facts): C(lost), C(remapped_rows) ({correctable, uncorrectable, pending, failed} or
          null), C(ecc_volatile_uncorrected), C(retired_pages_pending) (null where Not Supported:
          Ampere and later remap rows instead), C(recovery_action) (0 none, 1 GPU reset, 2 node
          reboot, 3 drain P2P, 4 drain and reset, 5 bus reset), C(xids) (each {xid, at, text}
          logged for this GPU since O(xid_since)), C(critical_xids), C(problems) (every code
          found, worst first), C(unsupported) (reads the GPU does not support), C(unread)
          (read -> {code: failed, hung or skipped, text}), C(took_ms) (read -> milliseconds)."
        - "C(message): the sentence (null when healthy): the GPU, each fact and the lever."
      type: dict
      returned: when O(health)
      sample: {code: row_remap_pending, lever: reset, message: "GPU 1 is unhealthy: a row remapping is pending ...",
               facts: {lost: false, remapped_rows: {correctable: 0, uncorrectable: 1, pending: 1, failed: 0},
                       ecc_volatile_uncorrected: 0, retired_pages_pending: null, recovery_action: 0, xids: [],
                       critical_xids: [], problems: [row_remap_pending], unsupported: [retired_pages_pending],
                       unread: {}, took_ms: {driver: 0.1, remapped_rows: 0.05}}}
  sample:
    - {index: 2, uuid: GPU-5d1c..., name: NVIDIA H200, pci_bus_id: "00000000:3B:00.0", minor_number: 2,
       memory_total_mib: 143771, memory_used_mib: 76107, memory_reserved_mib: 615, persistence_mode: true,
       holders: [194909], handles: [], free: false}
holders:
  description: One entry per process holding a selected GPU.
  returned: success
  type: list
  elements: dict
  contains:
    pid:
      description: "Process id in this PID namespace."
      type: int
      returned: success
    start_time:
      description: "Start time in clock ticks after boot; with pid the process identity."
      type: int
      returned: success
    name:
      description: "Process name (comm)."
      type: str
      returned: success
    cmdline:
      description: "Command line."
      type: str
      returned: success
    user:
      description: "Owner."
      type: str
      returned: success
    state:
      description: "running, sleeping, disk-sleep, zombie, stopped, ..."
      type: str
      returned: success
    wchan:
      description: "Kernel function a disk-sleep process waits in, else null."
      type: str
      returned: success
    ppid:
      description: "Parent PID."
      type: int
      returned: success
    parent_name:
      description: "Parent's name when known (the process that must reap a zombie)."
      type: str
      returned: success
    unit:
      description: "The system manager's unit owning it (from /proc/PID/cgroup), or null; a unit
        of a user's own manager is in RV(holders[].owner.unit) with owner.manager C(user)."
      type: str
      returned: success
    unit_restart:
      description: "The unit's Restart= setting, or null."
      type: str
      returned: success
    unit_active:
      description: "The unit's ActiveState, or null."
      type: str
      returned: success
    gpus:
      description: "Indices of the GPUs it holds (context or handle)."
      type: list
      elements: int
      returned: success
    context_gpus:
      description: "Indices of the GPUs where it holds a context."
      type: list
      elements: int
      returned: success
    peer_gpus:
      description: "Indices of the GPUs whose memory, charged by NVML to no process, it maps from its context elsewhere (NCCL/IPC peer memory)."
      type: list
      elements: int
      returned: success
    gpu_memory_mib:
      description: "MiB per GPU index as NVML charges it, or null when NVML does not list it."
      type: dict
      returned: success
    evidence:
      description: "Subset of nvml, fd, mmap."
      type: list
      elements: str
      returned: success
    kind:
      description: "context (it holds a context on at least one GPU, see context_gpus) or handle (device nodes only)."
      type: str
      returned: success
    other_pid_namespace:
      description: "It runs in another PID namespace than this module (a container)."
      type: bool
      returned: success
    owner:
      description:
        - "What owns it, read from /proc/PID/cgroup (cgroup v1, v2 or hybrid); the outermost owner
          wins (a docker container inside an LXC guest belongs to the guest, seen from the host)."
        - "Where the runtime's CLI is on this host (docker, podman, nerdctl, crictl, pct), its
          readable name, restart policy and pod come from it; otherwise they are null."
      type: dict
      returned: success
      contains:
        kind:
          description: "pod (Kubernetes; never signalled), container, guest (LXC, Proxmox, systemd-nspawn),
            user (a cgroup a local user named: her delegated subtree below user@UID.service, or below
            a directory root does not own; never a system unit, container or pod), supervisor (a
            program of a process supervisor: supervisord, runit, s6, pm2; see C(supervisor)),
            service, session, scope (another systemd scope) or none."
          type: str
        runtime:
          description: "docker, podman, containerd (nerdctl, ctr), cri-containerd, cri-o, lxc, proxmox,
            systemd-nspawn, systemd (for units), for kind supervisor supervisord, runit, s6 or pm2,
            or null."
          type: str
        id:
          description: "Container id (64 hex digits), guest name or Proxmox VMID, or null."
          type: str
        name:
          description: "Readable name from the runtime's CLI (container name, guest hostname), or null."
          type: str
        namespace:
          description: "containerd namespace of a containerd container, else null."
          type: str
        unit:
          description: "This host's systemd unit owning it (a service, session, scope or the
            container's scope), or for kind user the innermost service or scope of that user's own
            manager, or null; a guest's own units are never this host's. Only names that pass
            systemd's unit-name grammar (no glob characters)."
          type: str
        manager:
          description: "Whose systemd manager C(unit) belongs to: system, user (the manager of user
            C(uid)), or null."
          type: str
        controlled_by:
          description: "Who named the cgroup: root, user (user C(uid); its names choose no root lever
            and no shield), or unknown (a directory that could not be read: treated like user)."
          type: str
        uid:
          description: "For controlled_by user, the user who named the cgroup, else null."
          type: int
        confirmed:
          description: "Whether the unit's manager confirmed that its C(ControlGroup) is this cgroup
            (systemctl show), or, for a container, its runtime gave an init PID in this container;
            null when there is nothing to confirm. A system unit or a container is stopped only
            when confirmed."
          type: bool
        guest_unit:
          description: "The unit inside a guest or container that runs it (e.g. sglang.service in an
            LXC guest), or null."
          type: str
        pod:
          description: "For kind pod, C({namespace, name, uid}); namespace and name need crictl or docker
            labels, the uid comes from the cgroup path. Null otherwise."
          type: dict
        restart_policy:
          description: "The container's restart policy from its runtime (always, unless-stopped,
            on-failure, no), or null when unknown."
          type: str
        cgroup:
          description: "The cgroup path the owner was read from."
          type: str
        supervisor:
          description:
            - "For kind supervisor (then C(name) is the program, C(id) what its supervisor's CLI
              names it by: the supervisord program, the runit or s6 service directory, the pm2
              name, and C(unit) the supervisor's systemd unit): C(runtime)'s facts, else null."
            - "C(pid), C(start_time): the supervisor (supervisord, runsvdir, s6-svscan, pm2's
              daemon); C(program_pid): its child on the holder's path; C(service): the service
              directory (runit, s6: the monitor's cwd); C(conf): supervisord's C(-c); C(home),
              C(uid): pm2's home and user."
          type: dict
        cli_error:
          description:
            - "Null, or C({code, text}) when the owner's CLI (a container's runtime, a supervisor's
              status) was asked and gave no answer: C(code) cli_missing (not on PATH),
              cli_timeout (no answer within O(nvml_timeout)), cli_failed (a refusing exit or output
              not understood), or for a supervisor supervisor_not_listed (its status lists no
              program with that PID)."
            - "M(gpuops.reclaim.gpu_reclaim) signals no such holder of a container or supervisor:
              its failure names the command to run by hand."
          type: dict
      sample: {kind: container, runtime: podman, id: 9408f0bbe98e121b565cc3d4090a128d9894b03676992794f62c58c6a037b74b,
               name: sglang, namespace: null, unit: libpod-9408f0bbe98e121b565cc3d4090a128d9894b03676992794f62c58c6a037b74b.scope,
               guest_unit: null, pod: null, restart_policy: always, controlled_by: root, uid: null,
               manager: system, confirmed: true,
               cgroup: /machine.slice/libpod-9408f0bbe98e121b565cc3d4090a128d9894b03676992794f62c58c6a037b74b.scope}
    ignores_sigterm:
      description: "Its signal mask ignores SIGTERM (SigIgn), so only SIGKILL ends it."
      type: bool
      returned: success
    sigterm_dropped:
      description: "It is PID 1 of its own PID namespace and has no SIGTERM handler (SigCgt): the
        kernel drops a SIGTERM sent to it, so only SIGKILL ends it."
      type: bool
      returned: success
    tracer_pid:
      description: "The PID tracing it (TracerPid, a debugger or strace), or null."
      type: int
      returned: success
    tracer_name:
      description: "The tracer's name, or null."
      type: str
      returned: success
    protected:
      description: "Never signalled by this collection."
      type: bool
      returned: success
    protected_reason:
      description: "Why it is protected, or null."
      type: str
      returned: success
    protected_code:
      description:
        - "Why it is protected, as a code for callers and tests (read it, not the sentence): C(pid_init),
          C(kthread), C(own_tree) (this module's caller or child), C(pod), C(container_init),
          C(infrastructure), C(pattern) (O(protect)); null when not protected."
      type: str
      returned: success
clients:
  description:
    - Processes with only shared NVIDIA nodes open (monitors, NVML users).
    - The keys of RV(holders) but C(peer_gpus) (a client holds no GPU, so none is sorted among the GPUs).
  returned: success
  type: list
  elements: dict
free:
  description: Every selected GPU is free.
  returned: success
  type: bool
diagnosis:
  description: Plain sentences about what the process list alone cannot explain.
  returned: success
  type: list
  elements: str
  sample:
    - "GPU 3: 92134 MiB used with no process visible here: either processes in another PID namespace hold it
      (run this on the host that owns them, e.g. the node around this container) or a context leaked in the
      driver (reset the GPU or reboot)."
backend:
  description: "Where GPU facts came from: nvml or nvidia-smi."
  returned: success
  type: str
scan:
  description:
    - V(full) when every process was read; V(listed) when only the processes NVML lists were
      (O(handles=false) and NVML explained all the memory).
  returned: success
  type: str
  choices: [full, listed]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_health as health
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_flow import (
    SURVEY_ARGUMENT_SPEC, survey_param_error, survey_result, surveyor_from_params)


def main():
    module = AnsibleModule(argument_spec=dict(SURVEY_ARGUMENT_SPEC, handles=dict(type='bool', default=True),
                                              health=dict(type='bool', default=True),
                                              xid_since=dict(type='float'), xid_log=dict(type='path')),
                           supports_check_mode=True)
    error = survey_param_error(module.params)
    if error:
        module.fail_json(msg=error)
    try:
        surveyor = surveyor_from_params(module.params)
        result = survey_result(surveyor.survey(full=module.params['handles']))
        if module.params['health']:
            add_health(result['gpus'], surveyor, module.params)
    except (ValueError, observe.ObserveError) as exc:
        module.fail_json(msg=str(exc))
    if surveyor.backend.warning:
        module.warn(surveyor.backend.warning)
    module.exit_json(changed=False, **result)


def add_health(rows, surveyor, params):
    """Each row's `health` (gpu_health's verdict and gpu_say's sentence)."""
    records, xids, xid_unread = observe.take_health(
        surveyor.backend, [row['index'] for row in rows], surveyor.nvml_timeout,
        xid_since=params['xid_since'], xid_log=params['xid_log'])
    verdicts = health.verdicts(rows, records, xids, xid_unread)
    for row in rows:
        verdict = verdicts[row['index']]
        verdict['message'] = say.health(row['index'], verdict, held_by=row['holders'])
        row['health'] = verdict


if __name__ == '__main__':
    main()
