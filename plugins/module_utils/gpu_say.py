# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Say: the sentences of the decisions, written from their codes (gpu_lever's, gpu_trust's).

Decisions return codes; this is the one place that turns them into the `reason`,
`protected_reason`, lever and failure sentences a person reads. Nothing compares a sentence to
decide anything. Text that users chose goes through gpu_text.escape_text first.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_health_codes as health_codes
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_supervisor as supervisors
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text

RUN_AS_ROOT = 'run as root (become: true)'
CONTAINER_INIT = "init of a container's PID namespace"
POD_PROTECTED = 'part of a Kubernetes pod (the kubelet owns it)'


class Said(str):
    """A sentence that carries the code and the facts it was written from: callers decide on
    `code` and read `facts` (a command's rc and output), never the words. (`str(said)` is the
    plain text: what goes into a result.)"""

    def __new__(cls, text, code=None, facts=None):
        said = str.__new__(cls, text)
        said.code = code
        said.facts = facts or {}
        return said


def protection(code, detail=None, pid=None):
    """The `protected_reason` of a gpu_decide.protection_code."""
    if code is None:
        return None
    if code == lever.PID_INIT:
        return 'PID %d is the init process' % pid
    if code == lever.KTHREAD:
        return 'kernel thread'
    if code == lever.OWN_TREE:
        return 'part of the process tree running this module (its caller or its own child)'
    if code == lever.POD_SHIELD:
        return POD_PROTECTED
    if code == lever.INIT_SHIELD:
        return CONTAINER_INIT
    if code == lever.INFRASTRUCTURE:
        return 'GPU or cluster infrastructure (%s)' % detail
    return 'matches protect pattern %r' % detail


def skip(holder, code):
    """The `reason` sentence for a gpu_lever.skip_code."""
    if code not in (lever.INIT, lever.PROTECTED, lever.ZOMBIE, lever.UNMATCHED):
        return owner_clause(holder, lever.by_hand(holder))   # its owner's lever is the reason
    if code == lever.INIT:
        return 'PID %d is never signalled' % holder.pid
    if code == lever.PROTECTED:
        return 'protected: %s' % holder.protected_reason
    if code == lever.ZOMBIE:
        return 'zombie: its parent PID %s (%s) must reap it' % (holder.ppid, escape_text(holder.parent_name))
    return 'does not match the match filter'


def respawner_refusal(parent, code):
    """Why a respawning ancestor was not made the target (gpu_lever.respawner_lever's refusal), or
    not ended (gpu_lever.PASSES_RAN_OUT)."""
    if code is None:
        return None
    if code == lever.PROTECTED:
        return 'it is protected (%s)' % parent.protected_reason
    if code == lever.UNMATCHED:
        return 'it does not match `match`'
    if code == lever.PASSES_RAN_OUT:
        return 'the passes ran out before it was ended'
    return 'it holds a GPU itself'


def sigterm_futile(holder, code):
    """Why SIGTERM cannot end this holder (gpu_decide.sigterm_futile_code), or None."""
    if code is None:
        return None
    if code == lever.SIGTERM_IGNORED:
        return 'ignored (SigIgn)'
    if code == lever.SIGTERM_DROPPED:
        return 'dropped by the kernel (PID 1 of its PID namespace, no SIGTERM handler)'
    return ('traced by PID %s (%s) and stopped: it acts on no signal but SIGKILL until its '
            'tracer lets it go' % (holder.tracer_pid, escape_text(holder.tracer_name) or 'unknown'))


def remaining(code, peer_gpus=()):
    """The `reason` of a holder still on a GPU after the ladder, for the codes gpu_flow's report
    gives (gpu_lever.SURVIVED, PEER_MEMORY with the held GPUs it maps, DEVICE_OPEN)."""
    if code == lever.PEER_MEMORY:
        return 'maps peer memory of GPU %s' % ','.join(str(i) for i in peer_gpus)
    if code == lever.DEVICE_OPEN:
        return 'has the device open (blocks a reset)'
    return 'survived the ladder'


def held(holder, code):
    """Why a holder keeps its GPU, so the GPU is not waited for (gpu_flow's wait_release codes:
    gpu_lever.ALIVE_AFTER_KILL, GUEST_RESTARTS, LEFT), as the predicate after its PID."""
    if code == lever.ALIVE_AFTER_KILL:
        return 'is alive after SIGKILL (state %s)' % holder.state
    if code == lever.GUEST_RESTARTS:
        return 'is back: %s' % owner_clause(holder, lever.by_hand(holder))
    return 'is left: %s' % (holder.reason or 'not a target')


def respawn_message(parent):
    """The failure sentence for a parent that keeps respawning holders and was not ended. The
    init of a guest or container is never signalled (`kill` from here would end the whole
    guest): its owner names the lever."""
    said = owner_clause(parent, lever.by_hand(parent)) if lever.is_container_init(parent) else None
    if parent.pid == 1:
        said = ('it is PID 1, the init of the guest or container this runs in (or of this host), never '
                'signalled, and restarts what it runs for as long as it runs: stop that guest or '
                'container from its host (`pct stop VMID` on a Proxmox host, `lxc-stop -n NAME`), or '
                'change what its init runs')
    if said:
        return ('PID %d (%s, command line %r) respawns the GPU holders (%s): %s.'
                % (parent.pid, escape_text(parent.name), parent.cmdline, parent.respawned, said))
    return ('PID %d (%s, command line %r) respawns the GPU holders (%s): %s; end it first (`kill %d`), '
            'or run again with `match` covering it.'
            % (parent.pid, escape_text(parent.name), parent.cmdline, parent.respawned, parent.reason,
               parent.pid))


def _argv(argv):
    return ' '.join(escape_text(arg) for arg in argv)


def owner_clause(holder, by_hand):
    """The clause naming the lever that the holder's owner calls for (gpu_lever.by_hand), or None."""
    if by_hand is None:
        return None
    owner = by_hand.owner
    what = gpu_owner.describe(owner)
    why = by_hand.why
    if why == lever.SUPERVISED:
        return supervised(owner)
    if why == lever.RUNTIME_UNREACHABLE:
        return ('it runs in %s, and %s: nothing was signalled (its restart policy is unknown); stop the '
                'container by hand once %s answers: `%s`' % (what, escape_text(owner.cli_error['text']),
                                                             owner.runtime, _argv(by_hand.argv)))
    if why == lever.POD_OWNS:
        pod = owner.pod or {}
        if pod.get('name'):
            how = '`kubectl delete pod -n %s %s`' % (escape_text(pod.get('namespace')), escape_text(pod['name']))
        else:
            how = ('find it with `kubectl get pods -A -o custom-columns=NS:.metadata.namespace,'
                   'NAME:.metadata.name,UID:.metadata.uid | grep %s`' % pod.get('uid'))
        return ('it belongs to %s and is never signalled from under the kubelet: delete or evict '
                'the pod (%s, or drain the node)' % (what, how))
    if why == lever.CONTAINER_INIT:
        return ('it is the init of %s, which this module never signals: stop the container '
                '(stop_containers: true, or `%s`)' % (what, ' '.join(by_hand.argv)))
    if why == lever.RESTART_POLICY:
        return ('its %s restarts it (restart policy %s): stop the container '
                '(stop_containers: true, or `%s`)' % (what, lever.restart_policy(holder), ' '.join(by_hand.argv)))
    if why == lever.GUEST_INIT:
        how = ' (`%s`)' % _argv(by_hand.argv) if by_hand.argv else ''
        return ('it is the init of %s, which this module never signals: stop the guest itself%s '
                'only if the whole guest must go, or change what its init runs' % (what, how))
    if why == lever.UNREACHABLE_INIT:
        named = what if owner.kind == gpu_owner.CONTAINER else (
            'a container (cgroup %s)' % escape_text(owner.cgroup) if owner.cgroup else 'a container')
        return ('it is the init of %s whose runtime this module cannot reach, and it is never '
                'signalled: stop that container with the tool that started it (docker, podman, '
                'nerdctl stop), or from the host around it' % named)
    how = _argv(by_hand.argv) if by_hand.argv else 'systemctl stop %s inside the guest' % escape_text(owner.guest_unit)
    return ('it runs in %s, whose own systemd restarts what is killed from here: stop the unit '
            'in the guest (`%s`)' % (what, how))


def supervised(owner):
    """The clause naming what a person does about a supervised holder that is still there, from
    its owner's `cli_error` code (gpu_supervisor's and gpu_owner's); the names and commands are
    gpu_owner.describe's phrase and gpu_supervisor's facts (manual, status_command)."""
    sup = owner.supervisor or {}
    error = owner.cli_error or {}
    what = gpu_owner.describe(owner)
    command = supervisors.manual(owner)
    code = error.get('code')
    if code in (gpu_owner.CLI_MISSING, gpu_owner.CLI_TIMEOUT, gpu_owner.CLI_FAILED, supervisors.NOT_LISTED):
        find = '' if owner.id else (' (find the program whose pid is %s with `%s`)'
                                    % (sup.get('program_pid'), supervisors.status_command(owner)))
        return ('it is run by %s, whose autorestart brings back what is killed, and %s: nothing was '
                'signalled; stop the program by hand once the supervisor answers: `%s`%s'
                % (what, escape_text(error.get('text')), command, find))
    if code in (supervisors.CAME_BACK, supervisors.STOP_FAILED):
        return 'it is run by %s, and %s: stop the program by hand: `%s`' % (
            what, escape_text(error.get('text')), command)
    return ('it is run by %s, whose autorestart brings back what is killed: stop the program through '
            'its supervisor (stop_supervised: true, or `%s`)' % (what, command))


def next_lever(holder):
    """What a person can do about a holder the ladder could not remove."""
    if holder.lever:
        return holder.lever
    said = owner_clause(holder, lever.by_hand(holder))
    # A pod's or container's init is protected for a reason its owner names best.
    if said and holder.protected_code in (lever.POD_SHIELD, lever.INIT_SHIELD):
        return said
    if holder.protected:
        return ('it is protected (%s): stop it deliberately, outside this module, if it really '
                'must go' % holder.protected_reason)
    if holder.state == 'disk-sleep':
        return ('it is in uninterruptible sleep%s and ignores SIGKILL: reset the GPU '
                '(allow_reset: true) or reboot the host'
                % (' in %s' % escape_text(holder.wchan) if holder.wchan else ''))
    if holder.state == 'zombie':
        return 'stop or restart its parent PID %s (%s), which must reap it' % (
            holder.ppid, holder.parent_name or 'unknown')
    if holder.reason_code == lever.UNMATCHED:
        return 'it does not match `match`: widen the filter or stop it yourself'
    if said:
        return said
    if holder.unit and holder.unit_restart not in (None, 'no'):
        return 'its unit %s restarts it (Restart=%s): use stop_units: true or `%s`' % (
            holder.unit, holder.unit_restart,
            ' '.join(lever.unit_argv(gpu_owner.SYSTEM_MANAGER, 'by_hand', holder.unit)))
    if holder.state == 'tracing-stop' and holder.tracer_pid:
        # Measured on the lab's 6.18 kernel: a traced process SIGKILLed stops in its exit
        # (ptrace_stop from do_exit, PTRACE_EVENT_EXIT), its fds and memory still held, until
        # its tracer resumes it; a stopped strace never does. Continuing the tracer ends it.
        return ('it is traced by PID %s (%s) and stays in its exit, GPU memory held, until the tracer '
                'lets it go: continue the tracer (`kill -CONT %s` if it is stopped) or end it'
                % (holder.tracer_pid, escape_text(holder.tracer_name) or 'unknown', holder.tracer_pid))
    owner = holder.owner or gpu_owner.new_owner(gpu_owner.NONE)
    if owner.manager == gpu_owner.USER_MANAGER and holder.unit_restart not in (None, 'no'):
        return ("its unit %s of user %s's own manager restarts it (Restart=%s): that user stops it "
                "(`%s`)" % (escape_text(owner.unit), owner.uid, holder.unit_restart,
                            _argv(lever.unit_argv(gpu_owner.USER_MANAGER, 'by_hand', owner.unit))))
    return 'it survived SIGKILL: check `cat /proc/%d/stack`, then reset the GPU or reboot' % holder.pid


def failure_message(rows, remaining, elapsed_s, allow_reset, respawners=(), blind_sentence=None):
    """One actionable sentence per GPU that is still not free, and one per parent that keeps
    respawning holders; when this module cannot read other users' processes, that comes first
    and no reset or reboot is advised."""
    parts = ([blind_sentence] if blind_sentence else []) + [respawn_message(parent) for parent in respawners]
    for row in rows:
        if row['free']:
            continue
        on_gpu = [h for h in remaining if row['index'] in h.gpus]
        if on_gpu and blind_sentence:
            who = '; '.join('PID %d (%s) %s: %s' % (h.pid, escape_text(h.name), h.state, next_lever(h)
                                                    if h.lever or h.protected
                                                    else RUN_AS_ROOT + ' to signal it')
                            for h in on_gpu)
        elif on_gpu:
            who = '; '.join('PID %d (%s) %s: %s' % (h.pid, escape_text(h.name), h.state, next_lever(h))
                            for h in on_gpu)
        elif blind_sentence:
            who = 'no process visible to this module: %s to see and free its holders' % RUN_AS_ROOT
        elif allow_reset:
            who = ('no process visible here and the reset did not free it: reboot the host, or if '
                   'this is a container, free it from the host that owns the GPU')
        else:
            who = ('no process visible here: a leaked context or a holder in another PID namespace; '
                   'reset or reboot (allow_reset: true resets the GPU), or, if this is a container, '
                   'free it from the host that owns the GPU')
        parts.append('GPU %d (%s) still holds %d MiB after %.1f s: %s.'
                     % (row['index'], row['uuid'], row['memory_used_mib'], elapsed_s, who))
    return ' '.join(parts)


_COMM_LEN = 15


def title(holder):
    """The process title as the operator knows it: the kernel cuts /proc/PID/comm at 15
    characters ('sglang::schedul'), so a cut name is completed from the command line. Control
    characters are escaped (gpu_text.escape_text): it goes into sentences."""
    name = holder.name
    first = (holder.cmdline or '').split(' ', 1)[0]
    if len(name) == _COMM_LEN and first.startswith(name):
        return escape_text(first)
    return escape_text(name)


def _peer_clause(holder, index):
    contexts = ','.join(str(i) for i in holder.context_gpus)
    return ('maps GPU %d, its context is on GPU %s: NCCL/IPC peer memory; reclaim GPU %s too or set '
            'peers: true' % (index, contexts, contexts))


def peer_lever(holder, index):
    """What to do about peer memory on GPU `index` held through this process (gpu_peers)."""
    return 'it %s' % _peer_clause(holder, index)


def peer_memory(row, holder):
    """The diagnosis sentence for a GPU not free whose memory a process with its context
    elsewhere maps (gpu_lever.PEER_MEMORY, gpu_peers.peer_mappers)."""
    return ('GPU %d: %d MiB used that NVML charges to no process: PID %d (%s) %s.'
            % (row['index'], row['memory_used_mib'], holder.pid, title(holder), _peer_clause(holder, row['index'])))


def kinship(depth):
    """What a respawner is to the process it brought back, in words (gpu_respawn's depth)."""
    return {1: 'parent', 2: 'grandparent'}.get(depth, 'ancestor %d levels up' % depth)


def full_scan(finding):
    """Why a survey of NVML's processes alone is not enough (gpu_decide.full_scan_code), or None."""
    if finding is None:
        return None
    facts = finding.facts
    if finding.code == lever.LISTED_HOLDS_NOTHING:
        return 'GPU %d: NVML lists PID %d, which holds nothing here' % (facts['gpu'], facts['pid'])
    if finding.code == lever.NO_MEMORY_GIVEN:
        return 'GPU %d: NVML gives no memory for PID %d' % (facts['gpu'], facts['pid'])
    if finding.code != lever.UNCHARGED_MEMORY:
        raise ValueError('no sentence for the full-scan code %r' % (finding.code,))
    return 'GPU %d: %d MiB used, %d MiB charged to processes' % (facts['gpu'], facts['used_mib'], facts['charged_mib'])


def who(holder):
    """A process as every sentence and action target names it: its PID and escaped name."""
    return 'PID %d (%s)' % (holder.pid, escape_text(holder.name))


def finding(found):
    """The diagnosis sentence of one gpu_decide.Finding (gpu_lever's diagnosis codes)."""
    code, facts = found.code, found.facts
    if code == lever.IMPOSSIBLE_PID:
        return ('GPU %d: NVML reports impossible PID %d (%s MiB): the nvidia-ml-py bindings do not match '
                'the driver; such a PID is never signalled.' % (facts['gpu'], facts['pid'], facts['mib']))
    if code == lever.LISTED_UNSEEN:
        return ('GPU %d: NVML lists PID %d (%s MiB), which this module cannot see: %s.'
                % (facts['gpu'], facts['pid'], facts['mib'], RUN_AS_ROOT))
    if code == lever.LISTED_EXITED:
        heirs = facts['inheritors']
        return ('GPU %d: NVML charges %s MiB to PID %d, which has exited; %s still map%s the device '
                '(inherited from it), so the memory stays until %s.'
                % (facts['gpu'], facts['mib'], facts['pid'], ', '.join(who(h) for h in heirs),
                   's' if len(heirs) == 1 else '', 'that process exits' if len(heirs) == 1 else 'they exit'))
    if code == lever.LISTED_MISSING:
        return ('GPU %d: NVML lists PID %d (%s MiB) but no such process exists in this PID namespace: it '
                'runs in another namespace (a container or its host) and must be stopped from there, or it '
                'died with a context still pinned (reset or reboot).' % (facts['gpu'], facts['pid'], facts['mib']))
    if code == lever.PEER_MEMORY:
        return peer_memory(facts['row'], facts['holder'])
    if code == lever.MEMORY_UNSEEN:
        return ('GPU %d: %d MiB used with no process visible to this module: %s to see its holders.'
                % (facts['gpu'], facts['used_mib'], RUN_AS_ROOT))
    if code == lever.MEMORY_UNEXPLAINED:
        return ('GPU %d: %d MiB used with no process visible here: either processes in another PID '
                'namespace hold it (run this on the host that owns them, e.g. the node around this '
                'container) or a context leaked in the driver (reset the GPU or reboot).'
                % (facts['gpu'], facts['used_mib']))
    if code == lever.UNCONFIRMED_PID:
        return ('NVML lists PID %d on GPU %s, but PID %d here (%s) holds no NVIDIA device: the PID comes '
                'from another PID namespace or was reused; it is not treated as a holder.'
                % (facts['pid'], ','.join(str(i) for i in facts['gpus']), facts['pid'], escape_text(facts['name'])))
    if code == lever.UNCONFIRMED_GPU:
        return ('NVML lists PID %d on GPU %s, but PID %d here (%s) has none of that GPU\'s device nodes open '
                'or mapped: the PID was reused or comes from another PID namespace; it is not treated as '
                'that GPU\'s holder (the process that holds its context, if any, is looked for in /proc).'
                % (facts['pid'], ','.join(str(i) for i in facts['gpus']), facts['pid'], escape_text(facts['name'])))
    if code == lever.UNREADABLE:
        pids = facts['pids']
        return ('Could not read the fds or maps of %d process(es) (%s) although this module may read every '
                'process: a security policy (AppArmor, SELinux, Yama, a sandbox) refuses it; a GPU holder '
                'among them is not seen here.' % (len(pids), ', '.join(str(p) for p in pids[:10])))
    return _holder_finding(code, facts)


def _holder_finding(code, holder):
    """The diagnosis sentence of a finding about one holder (its facts are the gpu_holder.Holder)."""
    if code not in _HOLDER_FINDINGS:
        raise ValueError('no sentence for the diagnosis code %r' % (code,))
    named = who(holder)
    if code == lever.DISK_SLEEP:
        return ('%s is in uninterruptible sleep (D%s): signals take effect only when the kernel call '
                'returns; if it stays, the GPU needs a reset or the host a reboot.'
                % (named, ', wchan %s' % escape_text(holder.wchan) if holder.wchan else ''))
    if code == lever.ZOMBIE:
        return ('%s is a zombie still charged with GPU memory: its parent PID %s (%s) must reap it; stop '
                'or restart that parent.' % (named, holder.ppid, escape_text(holder.parent_name) or 'unknown'))
    if code == lever.TRACED:
        return ('%s is traced by PID %s (%s)%s: the tracer decides what becomes of its signals; SIGKILL '
                'still ends it (gpu_reclaim sends it without waiting out the grace when it is stopped), or '
                'detach the tracer.' % (named, holder.tracer_pid, escape_text(holder.tracer_name) or 'unknown',
                                        ' and stopped (state t)' if holder.state == 'tracing-stop' else ''))
    if code == lever.STOPPED:
        return ('%s is stopped (SIGSTOP, state T): it acts on SIGTERM only once continued; gpu_reclaim '
                'sends SIGCONT right after SIGTERM.' % named)
    if code == lever.ZOMBIE_LEADER:
        return ('%s is a zombie leader: its main thread exited while its other threads still hold the GPU, '
                'so no parent can reap it; a signal to the PID ends the whole thread group.' % named)
    if code == lever.UNIT_RESTARTS:
        return ('%s belongs to %s with Restart=%s: killing it brings it back; stop the unit (stop_units: '
                'true).' % (named, holder.unit, holder.unit_restart))
    if code == lever.OWNER_LEVER:
        return '%s holds GPU %s: %s.' % (named, ','.join(str(i) for i in holder.context_gpus),
                                         owner_clause(holder, lever.by_hand(holder)))
    return '%s runs in another PID namespace (a container) than this module.' % named


# The diagnosis codes whose facts are one holder.
_HOLDER_FINDINGS = (lever.DISK_SLEEP, lever.ZOMBIE, lever.TRACED, lever.STOPPED, lever.ZOMBIE_LEADER,
                    lever.UNIT_RESTARTS, lever.OWNER_LEVER, lever.OTHER_PID_NAMESPACE)


def diagnosis(findings, blind_sentence=None):
    """The diagnosis sentences of gpu_decide.findings; `blind_sentence` (gpu_access: this module
    cannot read other users' processes) comes first."""
    return ([blind_sentence] if blind_sentence else []) + [finding(found) for found in findings]


def _supervised_stopped(facts):
    left = facts.get('left')
    return ("stopped in %.2f s (`%s`); down by its supervisor's word, still down %.2f s later%s"
            % (facts['waited'], facts['command'], facts['watched'],
               '; PID %s outlived it (signalled next)' % ', '.join(str(p) for p in left) if left else ''))


def _not_waited(facts):
    """Why each GPU of a wait_release step is not waited for, GPU by GPU."""
    why = ['GPU %d: %s' % (index, ', '.join('%s %s' % (who(h), held(h, code)) for h, code in kept))
           for index, kept in facts['blocked']]
    return why + ['GPU %d: memory held by no visible process and not falling' % index for index in facts['unseen']]


# The action log's `result` of each step outcome (gpu_lever's step codes), from its facts.
_STEPS = {
    lever.SENT: 'sent',
    lever.GONE: 'gone',
    lever.REUSED: 'reused',
    lever.PID_NEVER: 'refused: PID %(pid)r is never signalled',
    lever.PID_PROTECTED: 'refused: PID %(pid)d is protected',
    lever.NO_START_TIME: 'refused: PID %(pid)d has no recorded start time',
    lever.NOT_PERMITTED: 'refused: not permitted to signal PID %(pid)d as this user: ' + RUN_AS_ROOT.replace('%', '%%'),
    lever.UNIT_STOPPED: lambda f: ('stopped in %.2f s' % f['waited']) + (
        ' through the manager of user %s' % f['uid'] if f.get('uid') is not None else ''),
    lever.UNIT_STOPPING: 'stopping (still deactivating after %(timeout)ss)',
    lever.STOP_FAILED: 'failed: %(output)s',
    lever.MANAGER_NOT_RUNNING: 'failed: the manager of user %(uid)s does not run',
    lever.NO_STOP: 'refused: %(runtime)s containers are never stopped by this module',
    lever.CONTAINER_STOPPED: 'stopped',
    lever.SUPERVISED_STOPPED: _supervised_stopped,
    lever.SCOPE_STARTED: 'started',
    lever.COMMAND_OK: 'ok',
    lever.COMMAND_FAILED: 'failed (rc=%(rc)d): %(output)s',
    lever.WOULD_STOP_UNIT: lambda f: 'would stop it %s(waiting up to %ss)' % (
        'through the manager of user %s ' % f['uid'] if f.get('uid') is not None else '', f['timeout']),
    lever.WOULD_STOP_CONTAINER: 'would stop it (grace %(grace)ss)',
    lever.WOULD_STOP_SUPERVISED: lambda f: 'would run `%s`' % ' '.join(f['argv']),
    lever.WOULD_SIGNAL: 'would send %(signal)s',
    lever.WOULD_KILL_AFTER_TERM: 'would send %(signal)s if it outlives SIGTERM',
    lever.WOULD_RUN: lambda f: 'would run %s' % ' '.join(f['argv']),
    lever.WOULD_WAIT: 'would wait up to %(timeout)ss for the memory',
    lever.RESCAN_FOUND: 'found %(count)d holder(s) left or new',
    lever.RESPAWNER_TARGET: lambda f: '%s; the %s becomes the target' % (came_back(**f['back']), kinship(f['depth'])),
    lever.RESPAWNER_REFUSED: lambda f: '%s; not signalled: %s' % (
        came_back(**f['back']), respawner_refusal(f['parent'], f['refusal'])),
    lever.SETTLE_BOUND: lambda f: 'no respawn within %.2f s (the bound); alive, not signalled: PID %s' % (
        f['bound'], ', '.join(str(p) for p in f['alive'])),
    lever.SETTLE_NONE_ALIVE: 'no respawn: none of them alive after %(took).2f s',
    lever.GUEST_NOT_BACK: 'nothing came back within %(waited).1f s',
    lever.GUEST_BACK: lambda f: 'came back after %.1f s: %s' % (f['waited'], ', '.join(
        'PID %d (%s)' % (h.pid, gpu_owner.describe(h.owner)) for h in f['holders'])),
    lever.NOT_WAITED: lambda f: 'not waited: nothing left that could free it (%s)' % '; '.join(_not_waited(f)),
    lever.MEMORY_BACK: 'memory back after %(waited).2f s',
    lever.MEMORY_HELD: 'memory still held after %(waited).1f s',
    lever.RESET_SKIPPED: lambda f: 'skipped: PIDs %s still use the device' % ', '.join(str(p) for p in f['pids']),
    lever.SENT_FUTILE: 'sent; %(why)s: SIGKILL at once',
    lever.EXITED: 'exited after %(signal)s in %(took).2f s',
    lever.STILL_RUNNING: 'still running %(took).2f s after %(signal)s',
    lever.ALIVE_AFTER_KILL_STEP: 'alive after SIGKILL (state %(state)s)',
}


def not_adopted(code, pid, owner=None):
    """Why PID is not adopted into a scope (gpu_lever's ADOPT_* codes, gpu_adopt.refusal)."""
    if code == lever.ADOPT_NEVER:
        return 'PID %d is never adopted (init or this run\'s own tree)' % pid
    if code == lever.ADOPT_GONE:
        return 'PID %d exited before adoption' % pid
    if code == lever.ADOPT_REUSED:
        return 'PID %d is now another process (start time changed): left alone' % pid
    if code == lever.ADOPT_KTHREAD:
        return 'PID %d is a kernel thread: left alone' % pid
    if code == lever.ADOPT_OWNED:
        return ('PID %d belongs to %s, which stops it: left to that owner, not adopted'
                % (pid, gpu_owner.describe(owner)))
    return 'PID %d: %s' % (pid, code)


def adopt_error(code, **facts):
    """Why an adoption stopped (gpu_lever's ADOPT_NO_START_TIME ... ADOPT_STOP_FAILED), with the
    lever that is left."""
    if code == lever.ADOPT_NO_START_TIME:
        return ('no start time was recorded for PID %s when it was found: without it this run cannot tell it '
                'from a process that took its number since, so nothing was adopted or stopped. Run again (it is '
                'read afresh), or stop the hand-started server yourself' % ', '.join(str(p) for p in facts['pids']))
    if code == lever.ADOPT_SCOPE_REFUSED:
        return 'systemd refused the scope %s: %s' % (facts['scope'], facts['result'])
    if code == lever.ADOPT_NO_CGROUP:
        return ('systemd gave the scope %s no control group to verify; left running, nothing '
                'stopped: look at it with `systemctl status %s`' % (facts['scope'], facts['scope']))
    if code == lever.ADOPT_STRANGERS:
        return ('%s holds PID %s, which is no process this run planned (a number reused between '
                'the check and the move): the scope is left running, nothing stopped. Look at it '
                'with `systemctl status %s` and stop what belongs to the old server by hand'
                % (facts['scope'], ', '.join(str(p) for p in facts['pids']), facts['scope']))
    if code == lever.ADOPT_STOP_FAILED:
        return 'systemctl stop %s: %s' % (facts['scope'], facts['result'])
    raise KeyError(code)


def came_back(ended, new_pids, after_s):
    """What a watched ancestor brought back (a respawn step's result; a respawner's `respawned`)."""
    return 'PID(s) %s came back as PID %s %.2f s after the first was ended' % (
        ', '.join(str(p) for p in sorted(ended)), ', '.join(str(p) for p in new_pids), after_s)


def interrupted(error, actions):
    """The failure when the driver stopped answering after the ladder acted."""
    return ('%s The ladder had taken %d action(s) before that (see actions); the GPUs were not verified.'
            % (error, actions))


def step(code, **facts):
    """The action log's `result` for what a step did (gpu_lever's step codes), as a Said."""
    form = _STEPS[code]
    return Said(form(facts) if callable(form) else form % facts, code, facts)


def blind(access):
    """The first diagnosis sentence of a module that may not read every process (a
    gpu_access.ProcAccess), else None."""
    if not access.blind:
        return None
    hidden = (' /proc is mounted with hidepid=%s, so other users\' processes do not even show.'
              % access.hidepid) if access.hidepid not in (None, '0', 'off') else ''
    return ('%s: this module runs as %s (UID %d) without CAP_SYS_PTRACE and cannot read other '
            'users\' processes, so holders of the GPUs may be invisible or unreadable to it.%s '
            'Memory it cannot explain is no evidence of a leaked context.'
            % (RUN_AS_ROOT.capitalize(), access.user, access.euid, hidden))


def reset_refused_blind(blind_sentence):
    """gpu_reclaim's refusal of allow_reset by a module that may not read every process."""
    return 'allow_reset refused: %s Nothing was signalled.' % blind_sentence


# An owner's CLI (a runtime's, a supervisor's) that gave no answer: the `text` beside the code of
# a `cli_error` (gpu_owner.CLI_MISSING, CLI_TIMEOUT, CLI_FAILED; gpu_supervisor's STOP_FAILED,
# CAME_BACK, NOT_LISTED). Decisions read the code; the text names the command and what it said.
STATUS_FAILED = 'its status failed'


def cli_not_on_path(cli):
    return '%s is not on PATH here' % cli


def cli_no_answer(argv, timeout):
    return '`%s` did not answer within %ss' % (' '.join(argv), timeout)


def cli_unfinished(argv, timeout):
    """A command that changes the host (a stop, a reset step) still running at its bound."""
    return '%s did not finish within %ss' % (' '.join(argv), timeout)


def cli_not_started(argv, exc):
    return '`%s` could not start: %s' % (' '.join(argv), exc)


def cli_failed(argv, status, output):
    """`status`: how it ended ('rc=N')."""
    return '`%s` failed (%s): %s' % (' '.join(argv), status, output[-300:])


def cli_no_user(uid):
    return 'user %s does not exist' % uid


def cli_said(argv, output):
    return '`%s`: %s' % (' '.join(argv), output)


def status_after_stop(output):
    return 'its status after the stop: %s' % output[-300:]


def not_down(argv, rc, output, bound):
    return '`%s` (rc=%d: %s) and the program is not down after %ss' % (' '.join(argv), rc, output[-200:], bound)


def program_back(pid, watched):
    return 'it started the program again (PID %s) %.2f s after it read down' % (pid, watched)


def not_listed(pid):
    return 'its status lists no program with PID %d' % pid


# GPU health (gpu_health; issue 30 item 6): what was read, and the lever NVIDIA prescribes.
_RECOVERY_ACTIONS = {1: 'GPU reset', 2: 'node reboot', 3: 'drain P2P', 4: 'drain and reset',
                     5: 'GPU reset through the bus'}


def _health_fact(code, facts):
    if code == health_codes.LOST:
        return 'NVML answers "GPU is lost" (it fell off the bus)'
    if code == health_codes.RECOVERY_ACTION:
        action = facts['recovery_action']
        return "the driver's recovery action field reads %d (%s)" % (action, _RECOVERY_ACTIONS.get(action, 'unknown'))
    if code == health_codes.ROW_REMAP_FAILED:
        return 'a row remapping failed (%d uncorrectable rows remapped): the GPU has no spare rows left' % (
            facts['remapped_rows']['uncorrectable'])
    if code == health_codes.CRITICAL_XID:
        last = [x for x in facts['xids'] if x['xid'] in facts['critical_xids']][-1]
        return 'critical Xid %s in the kernel log since the last good start (last: Xid %d at %s: %s)' % (
            ', '.join(str(x) for x in facts['critical_xids']), last['xid'],
            _utc(last['at']), escape_text(last['text'][:160]))
    if code == health_codes.ROW_REMAP_PENDING:
        return 'a row remapping is pending (it takes effect at the next GPU reset)'
    if code == health_codes.ECC_UNCORRECTED:
        return '%d volatile uncorrectable ECC errors since the driver loaded' % facts['ecc_volatile_uncorrected']
    if code == health_codes.RETIRED_PENDING:
        return 'retired pages are pending (they are retired at the next GPU reset)'
    raise ValueError('no sentence for the health code %r' % (code,))


def _utc(at):
    import time
    return time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(at))


def health_lever(lever_code, index, held_by=None):
    """The lever NVIDIA prescribes, as the command or step a person takes for GPU `index`
    (`held_by`: the PIDs that still hold it, which a reset must wait for)."""
    if lever_code == health_codes.RESET:
        reset = '`nvidia-smi --gpu-reset -i %d`' % index
        if held_by:
            return 'reset the GPU once nothing holds it (held by PID %s: stop them, then %s)' % (
                ', '.join(str(pid) for pid in held_by), reset)
        return 'reset the GPU (nothing holds it): %s' % reset
    if lever_code == health_codes.REBOOT:
        return 'reboot the node'
    if lever_code == health_codes.DRAIN_RESET:
        return 'drain the GPU work on the node, then reset the GPU (`nvidia-smi --gpu-reset -i %d`)' % index
    if lever_code == health_codes.DRAIN_P2P:
        return 'drain the work that uses peer-to-peer (NVLink) with this GPU'
    if lever_code == health_codes.SERVICE:
        return "take the GPU out of service and run NVIDIA's field diagnostics (RMA if they fail)"
    raise ValueError('no sentence for the health lever %r' % (lever_code,))


def health(index, verdict, held_by=None):
    """One GPU's health in a sentence: the GPU, every problem read, and the lever; None when
    healthy. For `unread`, which read failed or hung and why."""
    facts = verdict['facts']
    if verdict['code'] == health_codes.HEALTHY:
        return None
    if verdict['code'] == health_codes.UNREAD:
        return 'GPU %d: its health is not fully known: %s' % (index, '; '.join(
            '%s %s (%s)' % (read, item['code'], item['text'])
            for read, item in sorted(facts['unread'].items(), key=lambda pair: (pair[1]['code'] != 'hung', pair[0]))))
    return 'GPU %d is unhealthy: %s. NVIDIA prescribes: %s.' % (
        index, '; '.join(_health_fact(code, facts) for code in facts['problems']),
        health_lever(verdict['lever'], index, held_by))
