# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Decide: pure functions from an observation to holders, protection, diagnosis and targets.

No I/O here: tests drive every rule with hand-built observations and no processes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import copy
import os
import re

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_holder
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
# gpu_owner reads a cgroup with the families' recognisers, which gpu_families hands it on import.
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_families  # noqa: F401 pylint: disable=unused-import
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_peers as peers
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_trust as trust

# Processes whose death hurts the host more than a held GPU (display servers, schedulers, MPI),
# whatever the GPU vendor; the vendor's own daemons come from its backend (snapshot.infrastructure).
# Matched against the process name and the base name of argv[0]; comm is cut at 15 chars.
INFRASTRUCTURE = (
    'Xorg', 'X', 'Xwayland', 'gdm-x-session', 'slurmstepd', 'slurmd', 'orted', 'prted', 'systemd',
    'init', 'sshd', 'containerd-shim', 'containerd-shim-runc-v2', 'kubelet',
)
_COMM_LEN = 15
# Units whose stop would cut the operator off or hurt the host, whatever runs inside them
# (the vendor's units come from its backend).
PROTECTED_UNIT_PATTERN = re.compile(
    r'^(ssh|sshd|dbus|systemd-.*|user@.*|getty@.*|serial-getty@.*|slurmd|slurmstepd|kubelet|'
    r'containerd|docker)\.service$')
# A decision's code with the facts its sentence names (gpu_say writes it).
Finding = collections.namedtuple('Finding', 'code facts')
# A PID above the kernel's hard limit (4194304) or 0 comes from mismatched driver bindings.
PID_MAX_LIMIT = 4194304


def infrastructure_name(name, cmdline, names=INFRASTRUCTURE):
    argv0 = os.path.basename(cmdline.split(' ', 1)[0]) if cmdline else ''
    for infra in names:
        if name == infra or argv0 == infra:
            return infra
    if len(name) == _COMM_LEN:  # the kernel cut the name: compare prefixes
        for infra in names:
            if infra.startswith(name):
                return infra
    return None


def protection_code(proc, own_tree, patterns, owner=None, vendor_infrastructure=(), vendor_units=None,
                    units=None):
    """(code, detail): why a process must never be signalled (gpu_lever's protection codes;
    detail: the infrastructure name or the pattern), or (None, None). `proc` is a
    gpu_observe.ProcState, `owner` its gpu_owner record (read from its cgroup when not given;
    `confirmed` filled in by gpu_trust.confirm), `vendor_infrastructure` the GPU backend's
    daemon names, `vendor_units` its unit pattern and `units` the system units' facts (MainPID).

    Shields are granted by identity only (gpu_trust.refusal): a pod from cgroups root named, a
    container init its runtime confirmed, a guest's init, an infrastructure name on a root
    process with a root-owned executable or in a confirmed system unit never stopped. A
    title, a cgroup name or a PID namespace a user made shields nothing.
    """
    if proc.pid <= 1:
        return lever.PID_INIT, None
    if proc.kthread:
        return lever.KTHREAD, None
    if proc.pid in own_tree:
        return lever.OWN_TREE, None
    owner = owner or gpu_owner.owner_from_cgroup(proc.cgroup, getattr(proc, 'cgroup_uids', None))
    if trust.refusal(trust.SHIELD_POD, owner) is None:
        # The kubelet owns every process of a pod: signalled from under it, a pod's process is
        # restarted or its pod rescheduled; only the Kubernetes API may end it.
        return lever.POD_SHIELD, None
    if namespace_init(proc) and trust.refusal(trust.SHIELD_INIT, owner) is None:
        return lever.INIT_SHIELD, None
    infra = infrastructure_name(proc.name, proc.cmdline, INFRASTRUCTURE + tuple(vendor_infrastructure))
    if infra and trust.refusal(trust.SHIELD_INFRASTRUCTURE, owner, identity_of(proc, units, vendor_units),
                               protected_unit=protected_unit(owner.unit, vendor_units)) is None:
        return lever.INFRASTRUCTURE, infra
    for pattern in patterns:
        if pattern.search(proc.name) or pattern.search(proc.cmdline):
            return lever.PATTERN, pattern.pattern
    return None, None


def namespace_init(proc):
    """Whether a gpu_observe.ProcState is PID 1 of a PID namespace below this one (NSpid ends in 1)."""
    return bool(proc.nspid and len(proc.nspid) > 1 and proc.nspid[-1] == 1)


def identity_of(proc, units=None, vendor_units=None):
    """What gpu_trust needs of a gpu_observe.ProcState: its uids, its executable's owner, and
    whether systemd names it the main process of a system unit never stopped (a user's
    manager is user@UID.service's, running as the user)."""
    main_of = [unit for unit, facts in (units or {}).items()
               if facts and facts.main_pid == proc.pid and protected_unit(unit, vendor_units)]
    return {'uids': getattr(proc, 'uids', None), 'exe_uid': getattr(proc, 'exe_uid', None),
            'main_of_protected_unit': bool(main_of)}


def protected_unit(unit, vendor_units=None):
    """True for a unit never stopped (PROTECTED_UNIT_PATTERN, the backend's unit pattern)."""
    return bool(unit) and bool(PROTECTED_UNIT_PATTERN.match(unit) or (
        vendor_units is not None and vendor_units.match(unit)))


def resolve_gpus(requested, gpus, exclude=()):
    """Indices of the requested GPUs (index, UUID or PCI bus id) less the excluded ones; every
    GPU when none is requested.

    Raises ValueError naming the option (gpus or exclude), the unknown value and the GPUs that exist.
    """
    by_key = {}
    for gpu in gpus:
        by_key[str(gpu.index)] = gpu.index
        by_key[gpu.uuid.lower()] = gpu.index
        bus = gpu.pci_bus_id.lower()
        by_key[bus] = gpu.index
        by_key[bus[4:] if bus.startswith('0000') else bus] = gpu.index

    def lookup(values, name):
        found = set()
        for value in values:
            key = str(value).strip().lower()
            if key not in by_key:
                existing = ', '.join('%d (%s, %s)' % (g.index, g.uuid, g.pci_bus_id) for g in gpus) or 'none'
                raise ValueError('%s: %r matches no GPU on this host; GPUs here: %s' % (name, value, existing))
            found.add(by_key[key])
        return found

    chosen = lookup(requested, 'gpus') if requested else set(gpu.index for gpu in gpus)
    return sorted(chosen - lookup(exclude, 'exclude'))


def _holdings(proc, node_to_index, nvml_gpus):
    """Per GPU index, which evidence shows this process holding it."""
    evidence = {}
    for index in nvml_gpus:
        evidence.setdefault(index, set()).add('nvml')
    for kind, paths in (('fd', proc.dev_fds), ('mmap', proc.dev_maps)):
        for path in paths:
            if path in node_to_index:
                evidence.setdefault(node_to_index[path], set()).add(kind)
    return evidence


def touches_gpu(proc, gpu):
    """Whether the process has one of this GPU's own device nodes open or mapped. A context on a
    GPU keeps its node open and mapped (FIELD_NOTES: the forked child inherited both), so a
    listed PID without it is not that context's process: NVML goes on listing a dead parent's PID
    while its forked child keeps the context (FIELD_NOTES), and a process that reused the PID
    may hold other GPUs (a rank of another server) and must not get that GPU's signals."""
    nodes = set(gpu.nodes)
    return any(path in nodes for path in proc.dev_fds) or any(path in nodes for path in proc.dev_maps)


def orphaned_gpus(snapshot, free_threshold_mib):
    """GPUs whose memory NVML does not pin on a live process here.

    Either NVML charges a PID that is gone, a zombie, from another namespace or reused by a
    process that does not hold this GPU (a forked child may hold that memory through inherited
    mappings), or it lists nobody while memory is used.
    """
    def holds_here(pid, gpu):
        proc = snapshot.procs.get(pid)
        return proc is not None and proc.state != 'zombie' and touches_gpu(proc, gpu)

    orphaned = set()
    for gpu in snapshot.gpus:
        pids = [pid for pid, _mib in gpu.processes]
        if not all(holds_here(pid, gpu) for pid in pids):
            orphaned.add(gpu.index)
        elif not pids and gpu.used_mib > free_threshold_mib:
            orphaned.add(gpu.index)
    return orphaned


# What the driver uses for each context and charges to no process: on a real H200 (driver 580) the
# used memory exceeded the sum of NVML's process list by 8 MiB with 1 context, 14 with 2, 49 with 8
# and 141 with 24 (tests/gpu reports, s2, s3, s12). free_threshold_mib covers the first context's
# share; each further listed context may add up to this much.
CONTEXT_UNCHARGED_MIB = 8


def uncharged_allowance_mib(gpu, free_threshold_mib):
    """MiB of a GPU's used memory that may be charged to no process while NVML's list still
    explains it: the threshold, plus the driver's own share of each listed context beyond the
    first (CONTEXT_UNCHARGED_MIB). Without it, 24 ranks on one H200 (141 MiB charged to nobody)
    made gpu_reclaim read every process's fds and maps before its first signal, which came at
    0.084 s; 8 ranks (49 MiB) at 0.035 s (tests/gpu s12, run10)."""
    contexts = len(set(pid for pid, _mib in gpu.processes))
    return free_threshold_mib + CONTEXT_UNCHARGED_MIB * max(0, contexts - 1)


def uncharged_gpus(gpus, selected, free_threshold_mib):
    """Indices of the selected GPUs whose used memory, beyond what uncharged_allowance_mib allows,
    the driver charges to no process at all (its list is empty or sums to less)."""
    found = []
    for gpu in gpus:
        if gpu.index not in selected:
            continue
        charged = sum(mib or 0 for _pid, mib in gpu.processes)
        if gpu.used_mib - charged > uncharged_allowance_mib(gpu, free_threshold_mib) \
                and not any(mib is None for _pid, mib in gpu.processes):
            found.append(gpu.index)
    return found


def full_scan_code(snapshot, selected, free_threshold_mib):
    """Why a snapshot that read only the processes NVML lists is not enough: a Finding (gpu_lever's
    LISTED_HOLDS_NOTHING, NO_MEMORY_GIVEN, UNCHARGED_MEMORY, with the GPU and the PID or the
    MiB), or None.

    It is enough when NVML charges every used MiB of each selected GPU, beyond what
    free_threshold_mib and the driver's own share of each context allow (uncharged_allowance_mib),
    to processes that live here (not gone, not zombies, not from another namespace) and hold the
    device: then contexts are NVML's list and no other process can hold that memory. Otherwise a
    forked child with inherited mappings, or a process that closed its fds, may hold it: every
    process must be read.
    """
    for gpu in snapshot.gpus:
        if gpu.index not in selected:
            continue
        charged = 0
        for pid, mib in gpu.processes:
            proc = snapshot.procs.get(pid)
            if proc is None or proc.state in ('zombie', 'zombie-leader') or not touches_gpu(proc, gpu):
                return Finding(lever.LISTED_HOLDS_NOTHING, {'gpu': gpu.index, 'pid': pid})
            if mib is None:
                return Finding(lever.NO_MEMORY_GIVEN, {'gpu': gpu.index, 'pid': pid})
            charged += mib
        if gpu.used_mib - charged > uncharged_allowance_mib(gpu, free_threshold_mib):
            return Finding(lever.UNCHARGED_MEMORY, {'gpu': gpu.index, 'used_mib': gpu.used_mib, 'charged_mib': charged})
    return None


def context_gpus_of(evidence, listed, orphaned):
    """Where a process holds a context, from its evidence per GPU.

    A real CUDA process opens and maps the device node of every visible GPU, also where it
    has no context (measured on a 2x H200 host), so a mapping alone cannot name its GPUs.
    NVML's list is the truth for the processes it lists; a process it does not list holds a
    context only on a mapped GPU whose memory NVML charges to nobody alive (the forked child
    that inherited a dead parent's context).
    """
    if listed:
        return sorted(listed)
    return sorted(i for i, ev in evidence.items() if 'mmap' in ev and i in orphaned)


# A process that holds a GPU, as sort_processes found it before its owner is resolved: its
# gpu_observe.ProcState, the GPUs it holds a node of, NVML's MiB per GPU, its evidence, kind
# ('context' or 'handle'), context GPUs and peer GPUs (gpu_holder.Holder's fields).
Held = collections.namedtuple('Held', 'proc gpus listed evidence kind context_gpus peer_gpus')


def sort_processes(snapshot, free_threshold_mib):
    """Sort a snapshot's processes into (held, clients, unconfirmed), before any owner is read.

    held: Held, per process holding a particular GPU (context or handle).
    clients: the gpu_observe.ProcState of processes with only shared nodes (nvidiactl,
    nvidia-uvm) open: monitors, NVML users.
    unconfirmed: NVML-listed PIDs that resolve here to a process holding no NVIDIA device, i.e.
    a PID from another namespace or a reused one (code UNCONFIRMED_PID), or to one without the
    listed GPU's own node (UNCONFIRMED_GPU, for those GPUs). They are never acted on for them.
    """
    # Device nodes are mapped to GPUs through what the backend says each GPU's nodes are
    # (NVIDIA: /dev/nvidia<minor> with the driver's minor), never by the number in the name.
    node_to_index = dict((node, gpu.index) for gpu in snapshot.gpus for node in gpu.nodes)
    by_index = dict((gpu.index, gpu) for gpu in snapshot.gpus)
    orphaned = orphaned_gpus(snapshot, free_threshold_mib)
    nvml_mem = {}
    for gpu in snapshot.gpus:
        for pid, mib in gpu.processes:
            nvml_mem.setdefault(pid, {})[gpu.index] = mib
    held, clients, unconfirmed = [], [], []
    # A process whose fds or maps this module may not read (another user's, without root) shows
    # no device even when it holds one: NVML's word stands for it.
    unreadable = set(entry[0] for entry in snapshot.unreadable)
    for pid in sorted(snapshot.procs):
        proc = snapshot.procs[pid]
        if pid == snapshot.own_pid or proc.ppid == snapshot.own_pid:
            continue  # this module and the helpers it runs (nvidia-smi, systemctl) hold no GPU
        listed = nvml_mem.get(pid, {})
        touches_device = bool(proc.dev_fds or proc.dev_maps) or pid in unreadable
        if listed and not touches_device and proc.state != 'zombie':
            unconfirmed.append({'pid': pid, 'name': proc.name, 'gpus': sorted(listed),
                                'code': lever.UNCONFIRMED_PID})
            continue
        if listed and pid not in unreadable and proc.state != 'zombie':
            # NVML's word for a GPU stands only where the process has that GPU's node.
            foreign = sorted(i for i in listed if i in by_index and not touches_gpu(proc, by_index[i]))
            if foreign:
                unconfirmed.append({'pid': pid, 'name': proc.name, 'gpus': foreign,
                                    'code': lever.UNCONFIRMED_GPU})
                listed = dict((i, mib) for i, mib in listed.items() if i not in foreign)
        evidence = _holdings(proc, node_to_index, listed)
        if not evidence:
            if touches_device:
                clients.append(proc)
            continue
        context_gpus = context_gpus_of(evidence, listed, orphaned)
        all_evidence = set()
        for ev in evidence.values():
            all_evidence |= ev
        held.append(Held(proc, sorted(evidence), listed, all_evidence, 'context' if context_gpus else 'handle',
                         context_gpus, peers.peer_gpus_of(evidence, listed, context_gpus, orphaned)))
    return held, clients, unconfirmed


def classify(snapshot, protect_patterns, own_tree, units, free_threshold_mib, facts=None,
             owners=None, sorted_procs=None, named=None):
    """Turn a snapshot into (holders, clients, unconfirmed): gpu_holder.Holder records, each
    built once, and the unconfirmed entries (sort_processes says which is which).

    `units`: system unit -> (Restart, ActiveState, ControlGroup); `facts`: {'user_units':
    (uid, unit) -> the same from that user's manager, 'runtimes': (runtime, id) -> its
    inspect, 'vendor_units': the backend's unit pattern} (gpu_trust.confirm). `owners`: PID ->
    the final owner of a holder, resolved before (gpu_survey.Surveyor._owners: named by its
    runtime, a supervisor's program); a holder not in it, and every client, has the owner its
    cgroup names (cgroup_owner). `sorted_procs`: what sort_processes returned for this snapshot,
    when the caller sorted it already to know whose owners to resolve. `named`: PID -> the owner
    its cgroup names, where the caller read it already to resolve `owners` (read once per holder).
    """
    units = units or {}
    facts = dict(facts or {}, units=units)
    owners = owners or {}
    named = named or {}
    held, client_procs, unconfirmed = sorted_procs or sort_processes(snapshot, free_threshold_mib)
    holders = [holder_of(h.proc, snapshot, h.gpus, h.listed, h.evidence, h.kind, protect_patterns, own_tree,
                         units, h.context_gpus, facts, owner=owners.get(h.proc.pid), peer_gpus=h.peer_gpus,
                         named=named.get(h.proc.pid))
               for h in held]
    clients = [holder_of(proc, snapshot, [], {}, set(), 'client', protect_patterns, own_tree, units, [], facts)
               for proc in client_procs]
    return holders, clients, unconfirmed


def cgroup_owner(proc, units=None, facts=None):
    """The owner a process's cgroup names (gpu_owner.owner_from_cgroup), `confirmed` filled in
    by gpu_trust.confirm with what its manager or runtime says (classify's `units`, `facts`)."""
    facts = facts or {}
    owner = gpu_owner.owner_from_cgroup(proc.cgroup, getattr(proc, 'cgroup_uids', None))
    return owner._replace(confirmed=trust.confirm(owner, units or {}, facts.get('user_units'), facts.get('runtimes')))


def holder_of(proc, snapshot, gpus, listed, evidence, kind, patterns, own_tree, units, context_gpus,
              facts=None, owner=None, peer_gpus=None, named=None):
    """The gpu_holder.Holder of one process. `unit` is a unit of the system manager only; a unit
    of a user's manager stays in `owner`. `owner` is its final owner when resolved before
    (classify's `owners`), else the one its cgroup names (`named` when read before, else read here).

    Protection is judged on the owner its cgroup names, as root named it: a supervisor's program
    (recognised by ancestry) gives it no shield and takes none away."""
    facts = facts or {}
    named = named or cgroup_owner(proc, units, facts)
    code, detail = protection_code(proc, own_tree, patterns, named, snapshot.infrastructure,
                                   facts.get('vendor_units'), units)
    owner = owner or named
    reason = say.protection(code, detail, proc.pid)
    unit = owner.unit if owner.manager == gpu_owner.SYSTEM_MANAGER else None
    if unit:
        facts_of_unit = units.get(unit)
        restart, active = (facts_of_unit.restart, facts_of_unit.active) if facts_of_unit else (None, None)
    elif owner.manager == gpu_owner.USER_MANAGER:
        facts_of_unit = (facts.get('user_units') or {}).get((owner.uid, owner.unit))
        restart, active = (facts_of_unit.restart, facts_of_unit.active) if facts_of_unit else (None, None)
    else:
        restart, active = None, None
    other_ns = bool(snapshot.own_pidns and proc.pidns and proc.pidns != snapshot.own_pidns)
    parent = snapshot.procs.get(proc.ppid)
    parent_name = parent.name if parent else snapshot.related_names.get(proc.ppid)
    tracer = snapshot.procs.get(proc.tracer_pid)
    tracer_name = tracer.name if tracer else snapshot.related_names.get(proc.tracer_pid)
    return gpu_holder.Holder(
        pid=proc.pid,
        start_time=proc.start_time,
        name=proc.name,
        cmdline=proc.cmdline,
        user=proc.user,
        state=proc.state,
        wchan=proc.wchan,
        ppid=proc.ppid,
        parent_name=parent_name,
        unit=unit,
        unit_restart=restart,
        unit_active=active,
        gpus=gpus,
        context_gpus=context_gpus,
        gpu_memory_mib=dict((str(i), m) for i, m in sorted(listed.items())) or None,
        evidence=sorted(evidence),
        kind=kind,
        other_pid_namespace=other_ns,
        owner=owner,
        ignores_sigterm=proc.ignores_sigterm,
        # The kernel drops a signal whose action is the default for a PID namespace's init
        # (SIGKILL and SIGSTOP from an ancestor namespace excepted): with no handler of its own,
        # SIGTERM never reaches it (found on an H100: the ladder waited term_timeout for nothing).
        sigterm_dropped=namespace_init(proc) and not proc.handles_sigterm and not proc.ignores_sigterm,
        tracer_pid=proc.tracer_pid,
        tracer_name=tracer_name if proc.tracer_pid else None,
        protected=reason is not None,
        protected_reason=reason,
        protected_code=code,
        peer_gpus=peer_gpus,
    )


_UNIT_SUFFIXES = ('.service', '.scope')
_OTHER_UNIT_SUFFIXES = ('.socket', '.timer', '.target', '.mount', '.automount', '.path', '.slice',
                        '.device', '.swap')
_UNIT_NAME = re.compile(r'^[A-Za-z0-9:_.@\\-]+$')


def unit_names(values, option):
    """Unit names as systemd spells them ('sglang' -> 'sglang.service'); a malformed one raises
    ValueError naming the option and the value."""
    names = []
    for value in values or []:
        name = str(value).strip()
        if not _UNIT_NAME.match(name) or name.startswith('.'):
            raise ValueError('%s: %r is not a systemd unit name (e.g. sglang.service)' % (option, value))
        if not name.endswith(_UNIT_SUFFIXES):
            if name.endswith(_OTHER_UNIT_SUFFIXES):
                raise ValueError('%s: %r is a %s unit; only services and scopes own processes'
                                 % (option, value, name.rsplit('.', 1)[-1]))
            name += '.service'
        if name not in names:
            names.append(name)
    return names


def snapshot_without(snapshot, holders, ended_pids):
    """A copy of `snapshot` as it would read with the processes `ended_pids` gone: their
    processes dropped and the memory the driver charges to them returned; memory charged to an
    exited PID is returned too on a GPU where every process that inherited it is gone.
    (Check mode walks on with it after a step it only recorded.)"""
    inheritors = {}
    for holder in holders:
        if 'nvml' not in holder.evidence:
            for index in holder.context_gpus:
                inheritors.setdefault(index, []).append(holder.pid)
    dead = set(snapshot.nvml_missing_pids) | set(
        pid for pid, proc in snapshot.procs.items() if proc.state == 'zombie')
    gpus = []
    for gpu in snapshot.gpus:
        heirs = inheritors.get(gpu.index, [])
        orphan_freed = bool(heirs) and all(pid in ended_pids for pid in heirs)
        gone = set(pid for pid, _mib in gpu.processes
                   if pid in ended_pids or (orphan_freed and pid in dead))
        copied = copy.copy(gpu)
        copied.processes = [(pid, mib) for pid, mib in gpu.processes if pid not in gone]
        copied.used_mib = max(0, gpu.used_mib - sum(mib or 0 for pid, mib in gpu.processes if pid in gone))
        gpus.append(copied)
    projected = copy.copy(snapshot)
    projected.gpus = gpus
    projected.procs = dict((pid, proc) for pid, proc in snapshot.procs.items() if pid not in ended_pids)
    return projected


def unit_from_cgroup(text, dir_uids=None):
    """The system manager's unit (service or scope) owning a process, from /proc/PID/cgroup
    text; None for a process of a guest (its units are the guest's), of a pod, or in a cgroup
    a user named (a unit there is at most her own manager's)."""
    owner = gpu_owner.owner_from_cgroup(text, dir_uids)
    return owner.unit if owner.manager == gpu_owner.SYSTEM_MANAGER else None


def gpu_table(snapshot, holders, selected, free_threshold_mib, spared_pids=frozenset()):
    """The per-GPU rows of the result, for the selected GPUs.

    A spared process (gpu_reclaim's spare_units) neither makes its GPU held nor counts
    against the threshold with the memory NVML charges to it; memory NVML does not charge to
    any process counts as always.
    """
    rows = []
    for gpu in snapshot.gpus:
        if gpu.index not in selected:
            continue
        contexts = [h for h in holders if gpu.index in h.context_gpus]
        handles = [h for h in holders if gpu.index in h.gpus and h not in contexts]
        unspared = [h for h in contexts if h.pid not in spared_pids]
        used_by_others = gpu.used_mib - spared_mib(gpu, spared_pids)
        rows.append({
            'index': gpu.index,
            'uuid': gpu.uuid,
            'name': gpu.name,
            'pci_bus_id': gpu.pci_bus_id,
            'minor_number': gpu.minor,
            'memory_total_mib': gpu.total_mib,
            'memory_used_mib': gpu.used_mib,
            'memory_reserved_mib': gpu.reserved_mib,
            'persistence_mode': gpu.persistence_mode,
            'holders': [h.pid for h in contexts],
            'handles': [h.pid for h in handles],
            'peers': [h.pid for h in peers.peers_of_gpu(holders, gpu.index)],
            'free': used_by_others <= free_threshold_mib and not unspared,
        })
    return rows


def spared_mib(gpu, spared_pids):
    """MiB NVML charges on `gpu` (a gpu_observe.GpuState) to the spared processes."""
    return sum(mib or 0 for pid, mib in gpu.processes if pid in spared_pids)


def findings(snapshot, holders, unconfirmed, rows, spared_pids=frozenset(), blind=False):
    """Everything an operator could not see in a process list, as Findings (gpu_lever's diagnosis
    codes, with the facts each sentence names); gpu_say.diagnosis writes them.

    `blind` (gpu_access): this module cannot read other users' processes; memory nobody visible
    holds is then never blamed on a leak (no reset advice).
    """
    found = []
    selected = set(row['index'] for row in rows)
    missing = set(snapshot.nvml_missing_pids)
    for gpu in snapshot.gpus:
        if gpu.index not in selected:
            continue
        row = [r for r in rows if r['index'] == gpu.index][0]
        contexts = [h for h in holders if gpu.index in h.context_gpus]
        zombies = set(h.pid for h in holders if h.state == 'zombie')
        gone = [(pid, mib) for pid, mib in gpu.processes if pid in missing or pid in zombies]
        impossible = [(pid, mib) for pid, mib in gone if pid <= 0 or pid > PID_MAX_LIMIT]
        unresolved = [(pid, mib) for pid, mib in gone if (pid, mib) not in impossible]
        for pid, mib in impossible:
            found.append(Finding(lever.IMPOSSIBLE_PID, {'gpu': gpu.index, 'pid': pid, 'mib': mib}))
        inheritors = [h for h in contexts if 'nvml' not in h.evidence]
        mappers = peers.peers_of_gpu(holders, gpu.index)
        for pid, mib in unresolved:
            if mappers:
                continue  # explained below: the memory is peer memory of a live process
            facts = {'gpu': gpu.index, 'pid': pid, 'mib': mib}
            if blind:
                found.append(Finding(lever.LISTED_UNSEEN, facts))
            elif inheritors:
                found.append(Finding(lever.LISTED_EXITED, dict(facts, inheritors=inheritors)))
            else:
                found.append(Finding(lever.LISTED_MISSING, facts))
        if mappers:
            found.extend(Finding(lever.PEER_MEMORY, {'row': row, 'holder': holder})
                         for row, holder in peers.peer_mappers(holders, [row]))
        elif not row['free'] and not contexts and not gone and gpu.used_mib > 0:
            found.append(Finding(lever.MEMORY_UNSEEN if blind else lever.MEMORY_UNEXPLAINED,
                                 {'gpu': gpu.index, 'used_mib': gpu.used_mib}))
    for entry in unconfirmed:
        found.append(Finding(entry['code'], entry))
    for holder in holders:
        if not set(holder.gpus) & selected:
            continue
        if holder.state == 'disk-sleep':
            found.append(Finding(lever.DISK_SLEEP, holder))
        elif holder.state == 'zombie' and not any(
                'nvml' not in h.evidence and set(h.context_gpus) & set(holder.gpus)
                for h in holders):
            found.append(Finding(lever.ZOMBIE, holder))
        elif holder.tracer_pid:
            found.append(Finding(lever.TRACED, holder))
        elif holder.state == 'stopped':
            found.append(Finding(lever.STOPPED, holder))
        elif holder.state == 'zombie-leader':
            found.append(Finding(lever.ZOMBIE_LEADER, holder))
        if holder.unit and holder.unit_restart not in (None, 'no') and holder.pid not in spared_pids:
            found.append(Finding(lever.UNIT_RESTARTS, holder))
        if set(holder.context_gpus) & selected and lever.by_hand(holder) is not None:
            found.append(Finding(lever.OWNER_LEVER, holder))
        if holder.other_pid_namespace and not holder.protected:
            found.append(Finding(lever.OTHER_PID_NAMESPACE, holder))
    if snapshot.unreadable and not blind:
        # Not blind means this module holds CAP_SYS_PTRACE: "run as root" would be the wrong
        # lever (seen on a real H200 VM whose sandbox init refuses even root).
        found.append(Finding(lever.UNREADABLE, {'pids': sorted(set(entry[0] for entry in snapshot.unreadable))}))
    return found


def holder_matches(holder, match_patterns):
    return lever.matches(holder, match_patterns)


def plan_targets(holders, selected, match_patterns, spared_pids=frozenset(), peers_too=False):
    """Split the context holders of the selected GPUs into (targets, left): targets are
    gpu_holder.Holder records, left gpu_holder.Left ones, each with its reason and code.

    Handle-only holders are never targets: on a real host every CUDA process has every GPU's
    node open, so a handle names no GPU the process uses, and killing it frees no memory.
    Spared holders are neither: the caller asked to keep them, so nothing is left to report.
    With `peers_too`, a process that maps peer memory on a selected GPU (its context elsewhere)
    is a target too.
    """
    selected = set(selected)
    targets, left = [], []
    for holder in holders:
        if not peers.holder_gpus(holder, peers_too) & selected or holder.pid in spared_pids:
            continue
        code = skip_code(holder, match_patterns)
        if code:
            left.append(holder.left(code, say.skip(holder, code)))
        else:
            targets.append(holder)
    return targets, left


# Why a holder stays on a GPU, as the `remaining` entries' reason_code (gpu_reclaim's RETURN):
# the first four from skip_code (gpu_lever), the rest from the run's report (gpu_result).
INIT, PROTECTED, ZOMBIE, UNMATCHED = lever.INIT, lever.PROTECTED, lever.ZOMBIE, lever.UNMATCHED
SURVIVED, PEER_MEMORY, DEVICE_OPEN, RESPAWNS = lever.SURVIVED, lever.PEER_MEMORY, lever.DEVICE_OPEN, lever.RESPAWNS

skip_code = lever.skip_code
is_container_init = lever.is_container_init
container_restarts = lever.restart_policy
runtime_unreachable = lever.runtime_unreachable


def containers_to_stop(holders, selected, match_patterns, protected_ids=frozenset()):
    """Containers owning holders of the selected GPUs that their runtime may stop, first seen
    first (gpu_lever.container_lever): a container's init is reachable no other way, and a
    restart policy brings back whatever is killed inside."""
    selected = set(selected)
    found = []
    for holder in holders:
        if not set(holder.context_gpus) & selected:
            continue
        chosen = lever.container_lever(holder, match_patterns, protected_ids)
        if chosen.refusal is None and all(c.id != chosen.owner.id for c in found):
            found.append(chosen.owner)
    return found


def supervised_to_stop(holders, selected, match_patterns):
    """The supervisor owners (gpu_supervisor) of holders of the selected GPUs whose program its
    supervisor may stop (gpu_lever.supervised_lever), first seen first, each once."""
    selected = set(selected)
    found, seen = [], set()
    for holder in holders:
        if not set(holder.context_gpus) & selected:
            continue
        chosen = lever.supervised_lever(holder, match_patterns)
        if chosen.refusal is None and chosen.key not in seen:
            seen.add(chosen.key)
            found.append(chosen.owner)
    return found


def sigterm_futile_code(holder):
    """Why SIGTERM cannot end this holder, so SIGKILL follows at once (gpu_lever.SIGTERM_IGNORED,
    SIGTERM_DROPPED, TRACED_STOPPED), or None."""
    if holder.ignores_sigterm:
        return lever.SIGTERM_IGNORED
    if holder.sigterm_dropped:
        return lever.SIGTERM_DROPPED
    if holder.state == 'tracing-stop':
        return lever.TRACED_STOPPED
    return None


def units_to_stop(targets, protected_units, vendor_units=None):
    """System service units that own targets and may be stopped, in first-seen order
    (gpu_lever.unit_lever): only where root named the cgroup and systemd confirmed the unit
    owns it; never one of `protected_units`, PROTECTED_UNIT_PATTERN or `vendor_units`."""
    units = []
    for holder in targets:
        chosen = lever.unit_lever(holder, protected_units, vendor_units, is_protected=protected_unit)
        if chosen.refusal is None and chosen.key not in units:
            units.append(chosen.key)
    return units


def user_units_to_stop(targets):
    """(uid, unit) of the services of users' own managers that own targets, confirmed by that
    manager (gpu_lever.user_unit_lever), in first-seen order."""
    found = []
    for holder in targets:
        chosen = lever.user_unit_lever(holder)
        if chosen.refusal is None and chosen.key not in found:
            found.append(chosen.key)
    return found


def stoppable_container(holder):
    """The holder's container when its runtime can stop it from here and confirmed that the
    container is the holder's, in cgroups root named (gpu_lever.container_lever)."""
    chosen = lever.container_lever(holder)
    if chosen.refusal in (None, lever.PROTECTED, lever.UNMATCHED) and chosen.argv:
        return chosen.owner
    return None
