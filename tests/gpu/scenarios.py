"""The scenarios of the real-GPU suite; each gets a Ctx (suite.py) and records checks and numbers.

Every module call restricts itself to this run's processes (`match: [run id]`) and GPUs, except
s11's: it runs gpu_reclaim as users run it (no `match`, no `gpus`), and only when every process
that holds a GPU context is this run's own (on the device machine, every one is).
"""
import os
import shlex
import shutil
import select
import signal
import subprocess
import time

from suite import (MIB, WORKLOAD, Nvml, Skip, StepError, alive, comm_of, nvidia_nodes, proc_identity,
                   pynvml, smi_table, wait_for)

TERM_TIMEOUT = 3
RELEASE_TIMEOUT = 30


def _by_pid(result, pid, key='holders'):
    for holder in result.get(key) or []:
        if holder.get('pid') == pid:
            return holder
    return None


def _reclaim_args(ctx, gpus, **extra):
    args = {'gpus': [str(g) for g in gpus], 'match': [ctx.suite.run_id],
            'term_timeout': TERM_TIMEOUT, 'release_timeout': RELEASE_TIMEOUT}
    args.update(extra)
    return args


def _baseline_free(ctx, gpus):
    return all(ctx.suite.baseline.get(g, 0) <= 128 for g in gpus)


def _node(ctx, gpu):
    return '/dev/nvidia%d' % ctx.suite.minor.get(gpu, gpu)


def _actions(result):
    """(step, pid, outcome): outcome 'sent' for a signal that reached its process (the action
    changed the host), else the action's result sentence."""
    return [(a.get('step'), a.get('pid'),
             'sent' if a.get('step') in ('sigterm', 'sigkill') and a.get('changed') else a.get('result'))
            for a in result.get('actions') or []]


def _verify_free_after(ctx, gpus, pids, started):
    """After a reclaim: every PID gone, NVML lists none of them, memory back to the baseline."""
    gone, waited = wait_for(lambda: not [p for p in pids if alive(p)], 10)
    ctx.check('all holders of ours are gone after gpu_reclaim', gone,
              [p for p in pids if alive(p)])
    ok, waited, used = ctx.suite.wait_baseline(gpus, timeout=10)
    ctx.num('verified_free_s_from_reclaim_start', round(time.monotonic() - started, 3))
    ctx.check('NVML memory back to baseline on GPUs %s' % gpus, ok,
              {'used_mib': used, 'baseline_mib': dict((g, ctx.suite.baseline[g]) for g in gpus)})
    with Nvml() as nv:
        listed = dict((g, sorted(set(nv.procs(g)) & set(pids))) for g in gpus)
    ctx.check('NVML lists none of our PIDs any more', not any(listed.values()), listed)


# --- 1 ----------------------------------------------------------------------------------------------------

def s1_nvml_facts(ctx):
    suite = ctx.suite
    gpus = suite.test_gpus
    mib = 1024
    ready = suite.wait_ready(suite.start('hold', ['--gpu', '0:%d' % mib, '--title',
                                                  '%s s1-holder' % suite.run_id], 's1'))
    pid = ready['pid']
    ctx.num('torch_import_s', ready['runtime'].get('import_s'))
    ctx.num('alloc_s', ready['allocs']['0']['alloc_s'])
    with Nvml() as nv:
        procs = dict((g, nv.procs(g)) for g in range(len(nv.handles)))
        used0 = nv.used_bytes(0) // MIB
    listed = procs[0].get(pid)
    ctx.check('NVML lists the torch PID as a compute process on GPU 0', pid in procs[0], procs[0])
    ctx.num('nvml_listed_mib', listed)
    ctx.num('gpu0_used_minus_baseline_mib', used0 - suite.baseline[0])
    if listed is not None:
        ctx.num('context_overhead_mib', listed - mib)
        ctx.check('listed memory is the tensor plus a context (%d..%d MiB)' % (mib, mib + 2048),
                  mib <= listed <= mib + 2048, listed)
        ctx.check('GPU 0 used memory grew by about what NVML charges the PID (within 64 MiB + 5%)',
                  abs((used0 - suite.baseline[0]) - listed) <= 64 + listed * 0.05,
                  {'used_delta': used0 - suite.baseline[0], 'listed': listed}, hard=False)
    if len(gpus) > 1:
        ctx.check('the PID is not listed on GPU 1', pid not in procs[1], procs[1])
    nodes = nvidia_nodes(pid)
    ctx.num('holder_device_nodes', nodes)
    ctx.check('the holder maps %s (its context)' % _node(ctx, 0), _node(ctx, 0) in nodes['mmap'],
              nodes)
    if len(gpus) > 1:
        ctx.num('holder_opens_gpu1_node_without_context', _node(ctx, 1) in nodes['fd'])

    # SIGKILL, then poll the driver as fast as it answers.
    proc = suite.popens[-1]
    base = suite.baseline[0] + 64
    gone_ms = freed_ms = exit_ms = None
    polls = 0
    with Nvml() as nv:
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        while time.perf_counter() - t0 < 30:
            now_ms = (time.perf_counter() - t0) * 1000
            if exit_ms is None and proc.poll() is not None:
                exit_ms = round(now_ms, 2)
            if gone_ms is None and pid not in nv.procs(0):
                gone_ms = round((time.perf_counter() - t0) * 1000, 2)
            if freed_ms is None and nv.used_bytes(0) // MIB <= base:
                freed_ms = round((time.perf_counter() - t0) * 1000, 2)
            polls += 1
            if gone_ms is not None and freed_ms is not None and exit_ms is not None:
                break
            time.sleep(0.001)
    proc.wait(timeout=10)
    suite.release_ms_s1 = freed_ms
    ctx.num('sigkill_to_reaped_ms', exit_ms)
    ctx.num('sigkill_to_pid_unlisted_ms', gone_ms)
    ctx.num('release_latency_ms', freed_ms)
    ctx.num('nvml_polls', polls)
    ctx.check('used memory back to baseline after SIGKILL (within 30 s)', freed_ms is not None)
    ctx.check('NVML stops listing the PID after SIGKILL', gone_ms is not None)


# --- 2 ----------------------------------------------------------------------------------------------------

def s2_holders_vs_smi(ctx):
    suite = ctx.suite
    gpus = suite.test_gpus
    alloc = {0: 1024, 1: 512}
    spec = []
    for g in gpus:
        spec += ['--gpu', '%d:%d' % (g, alloc[g])]
    ready = suite.wait_ready(suite.start('hold', spec + ['--title', '%s s2-holder' % suite.run_id], 's2'))
    pid = ready['pid']
    with Nvml() as nv:
        direct = dict((g, nv.procs(g).get(pid)) for g in gpus)
    smi_before = smi_table()
    call, res = ctx.ansible('gpu_holders', {})
    smi_after = smi_table()
    ctx.num('gpu_holders_ansible_wall_s', call['wall_s'])
    ctx.check('gpu_holders succeeded', call['rc'] == 0 and not res.get('failed'), res.get('msg'))
    ctx.check('backend is nvml', res.get('backend') == 'nvml', res.get('backend'))
    rows = dict((r['index'], r) for r in res.get('gpus') or [])
    ctx.check('same GPUs (index, uuid) as nvidia-smi',
              sorted((i, r['uuid']) for i, r in rows.items())
              == sorted((i, r['uuid']) for i, r in smi_after.items()),
              {'module': sorted(rows), 'nvidia_smi': sorted(smi_after)})
    diffs = {}
    for index, row in rows.items():
        smi_used = [t[index]['used_mib'] for t in (smi_before, smi_after) if index in t]
        diffs[index] = min(abs(row['memory_used_mib'] - u) for u in smi_used) if smi_used else None
    ctx.num('used_mib_module_vs_smi_abs_diff', diffs)
    ctx.num('table', dict((i, {'module_used': r['memory_used_mib'], 'reserved': r['memory_reserved_mib'],
                               'smi_used': smi_after.get(i, {}).get('used_mib'),
                               'total': r['memory_total_mib'], 'free': r['free'], 'holders': r['holders']})
                          for i, r in rows.items()))
    ctx.check('used MiB within 16 MiB of nvidia-smi on every GPU',
              all(d is not None and d <= 16 for d in diffs.values()), diffs)
    holder = _by_pid(res, pid)
    ctx.check('the torch holder is listed', holder is not None)
    if holder:
        ctx.num('holder_entry', dict((k, holder.get(k)) for k in (
            'pid', 'name', 'kind', 'evidence', 'gpus', 'context_gpus', 'gpu_memory_mib', 'protected')))
        ctx.check('kind is context', holder.get('kind') == 'context', holder.get('kind'))
        ctx.check('evidence includes nvml, fd and mmap',
                  set(['nvml', 'fd', 'mmap']) <= set(holder.get('evidence') or []), holder.get('evidence'))
        ctx.check('it holds GPUs %s' % gpus, set(gpus) <= set(holder.get('context_gpus') or []),
                  holder.get('context_gpus'))
        mem = holder.get('gpu_memory_mib') or {}
        ctx.check('its memory per GPU is what NVML charges it',
                  all(mem.get(str(g)) is not None and direct[g] is not None
                      and abs(mem[str(g)] - direct[g]) <= 16 for g in gpus),
                  {'module': mem, 'pynvml': direct})
        ctx.check('not protected', not holder.get('protected'), holder.get('protected_reason'))
    everyone = (res.get('holders') or []) + (res.get('clients') or [])
    selfish = [h['pid'] for h in everyone if 'AnsiballZ' in (h.get('cmdline') or '')]
    ctx.check('the module does not list itself (no AnsiballZ process among holders or clients)',
              not selfish, selfish)
    ctx.num('clients', [(h.get('pid'), h.get('name')) for h in res.get('clients') or []])
    ctx.check('GPU 0 is reported not free', rows.get(0, {}).get('free') is False)


# --- 3 ----------------------------------------------------------------------------------------------------

def s3_seed_incident(ctx):
    suite = ctx.suite
    gpus = suite.test_gpus
    tp = len(gpus)
    child_mib, parent_mib, ignorer_mib = 2048, 1024, 512
    server = suite.start('server', ['--tp', str(tp), '--child-mib', str(child_mib), '--parent-mib',
                                    str(parent_mib), '--title', '%s s3-server' % suite.run_id], 's3srv')
    ignorer = suite.start('hold', ['--gpu', '0:%d' % ignorer_mib, '--ignore-term', '--title',
                                   '%s s3-ignores-sigterm' % suite.run_id], 's3ign')
    srv = suite.wait_ready(server)
    ign = suite.wait_ready(ignorer)
    parent = srv['pid']
    children = [c['pid'] for c in srv['children']]
    ctx.num('server_parent_pid', parent)
    ctx.num('children', [(c['pid'], c['gpu'], c['comm']) for c in srv['children']])
    ctx.num('sigterm_ignorer_pid', ign['pid'])
    with Nvml() as nv:
        listed = dict((g, nv.procs(g)) for g in gpus)
    for c in srv['children']:
        ctx.check('child TP%d (PID %d) listed on GPU %d' % (c['rank'], c['pid'], c['gpu']),
                  c['pid'] in listed[c['gpu']], listed[c['gpu']])

    # The crash: SIGKILL the parent only.
    t0 = time.perf_counter()
    os.kill(parent, signal.SIGKILL)
    server[0].wait(timeout=10)
    with Nvml() as nv:
        unlisted, waited = wait_for(lambda: parent not in nv.procs(0), 10, 0.002)
    ctx.num('parent_sigkill_to_unlisted_ms', round((time.perf_counter() - t0) * 1000, 1))
    ctx.check('the dead parent is no longer listed by NVML', unlisted)
    reparent = dict((c, proc_identity(c)) for c in children)
    ctx.num('children_after_parent_kill', dict(
        (c, {'alive': alive(c), 'ppid': r[1] if r else None, 'new_parent': comm_of(r[1]) if r else None})
        for c, r in reparent.items()))
    ctx.check('every child survives its parent, re-parented',
              all(alive(c) and reparent[c] and reparent[c][1] != parent for c in children))
    with Nvml() as nv:
        held = dict((c['pid'], nv.procs(c['gpu']).get(c['pid'])) for c in srv['children'])
    ctx.num('orphans_nvml_mib', held)
    ctx.check('the orphans keep their memory (>= %d MiB each)' % child_mib,
              all(v is not None and v >= child_mib for v in held.values()), held)

    # What a user sees, then the fix.
    _unused, seen = ctx.ansible('gpu_holders', {'gpus': [str(g) for g in gpus]})
    for c in children + [ign['pid']]:
        h = _by_pid(seen, c)
        ctx.check('gpu_holders finds PID %d as a context holder' % c, h and h.get('kind') == 'context',
                  h and {k: h.get(k) for k in ('name', 'ppid', 'evidence', 'gpu_memory_mib')})
    started = time.monotonic()
    call, res = ctx.ansible('gpu_reclaim', _reclaim_args(ctx, gpus))
    ctx.num('reclaim_ansible_wall_s', call['wall_s'])
    ctx.num('reclaim_module_elapsed_s', res.get('elapsed_s'))
    ctx.num('actions', _actions(res) and [dict((k, a.get(k)) for k in ('at_s', 'step', 'pid', 'name', 'result'))
                                          for a in res['actions']])
    ctx.num('driver_release_latency_ms_from_s1', suite.release_ms_s1)
    strict = _baseline_free(ctx, gpus)
    ctx.check('gpu_reclaim reports free', res.get('free') is True and not res.get('failed'),
              res.get('msg'), hard=strict)
    ctx.check('changed is true', res.get('changed') is True)
    acts = _actions(res)
    for c in children + [ign['pid']]:
        ctx.check('SIGTERM sent to PID %d' % c, ('sigterm', c, 'sent') in acts)
    ctx.check('SIGKILL sent to the SIGTERM-ignoring PID %d' % ign['pid'],
              ('sigkill', ign['pid'], 'sent') in acts)
    # The ignorer's SigIgn mask holds SIGTERM, so the ladder kills it without the grace: its
    # SIGTERM step says so (it would say 'still running 3.00 s after SIGTERM' after the grace).
    ign_term = [a.get('code') for a in res.get('actions') or []
                if a.get('step') == 'sigterm' and a.get('pid') == ign['pid']]
    ctx.check('SIGKILL at once for the provable ignorer, no %ss grace waited' % TERM_TIMEOUT,
              ign_term == ['sent_futile'], ign_term)
    ctx.check('the orphans, which handle SIGTERM, got no SIGKILL',
              not any(s == 'sigkill' and p in children for s, p, r in acts), acts)
    ctx.check('no PID outside this run was signalled',
              all(p in children + [ign['pid']] for s, p, r in acts if s in ('sigterm', 'sigkill')), acts)
    _verify_free_after(ctx, gpus, children + [ign['pid']], started)


# --- 4 ----------------------------------------------------------------------------------------------------

def s4_forked_child(ctx):
    suite = ctx.suite
    mib = 1024
    started_w = suite.start('hold', ['--gpu', '0:%d' % mib, '--fork-child', '--title',
                                     '%s s4-parent' % suite.run_id], 's4')
    ready = suite.wait_ready(started_w)
    parent, child = ready['pid'], ready['forked'][0]
    ctx.num('parent_pid', parent)
    ctx.num('child_pid', child)
    ctx.num('child_device_nodes_before', nvidia_nodes(child))
    ctx.check('the forked child maps %s (inherited)' % _node(ctx, 0),
              _node(ctx, 0) in nvidia_nodes(child)['mmap'], nvidia_nodes(child))
    os.kill(parent, signal.SIGKILL)
    started_w[0].wait(timeout=10)          # reaped: the parent is really gone
    # Memory a dead process held alone is back within s1's measured release latency; watch
    # three times that (1.5 s when s1 did not run) for the parent to drop from NVML's list or
    # the memory to fall, and stop at once if either happens.
    window = 3 * suite.release_ms_s1 / 1000.0 if suite.release_ms_s1 else 1.5
    ctx.num('watched_after_parent_death_s', round(window, 3))
    with Nvml() as nv:
        wait_for(lambda: parent not in nv.procs(0) or nv.used_bytes(0) // MIB - suite.baseline[0] < mib,
                 window, 0.01)
        procs0 = nv.procs(0)
        used = nv.used_bytes(0) // MIB
    ctx.num('nvml_lists_after_parent_death', dict((str(k), v) for k, v in procs0.items()))
    ctx.num('gpu0_used_minus_baseline_mib', used - suite.baseline[0])
    dead_listed = parent in procs0
    ctx.num('nvml_still_lists_dead_parent', dead_listed)
    ctx.check('NVML still charges the dead parent PID %d' % parent, dead_listed, procs0)
    ctx.check('the memory stays while the forked child lives', used - suite.baseline[0] >= mib,
              used - suite.baseline[0])
    ctx.check('the forked child is alive', alive(child))
    _unused, seen = ctx.ansible('gpu_holders', {'gpus': ['0']})
    h = _by_pid(seen, child)
    ctx.check('gpu_holders finds the forked child', h is not None)
    if h:
        fields = ('kind', 'evidence', 'gpus', 'context_gpus', 'gpu_memory_mib', 'ppid')
        ctx.num('child_entry', dict((k, h.get(k)) for k in fields))
        ctx.check('as a context holder through its mapping (mmap), not NVML',
                  h.get('kind') == 'context' and 'mmap' in (h.get('evidence') or [])
                  and 'nvml' not in (h.get('evidence') or []), h.get('evidence'))
    diag = seen.get('diagnosis') or []
    ctx.check('diagnosis names the dead parent and the child that holds its memory',
              any(str(parent) in s and str(child) in s for s in diag), diag)
    ctx.check('GPU 0 not free', not all(r.get('free') for r in seen.get('gpus') or []))
    started = time.monotonic()
    call, res = ctx.ansible('gpu_reclaim', _reclaim_args(ctx, [0]))
    ctx.num('reclaim_module_elapsed_s', res.get('elapsed_s'))
    ctx.num('actions', [dict((k, a.get(k)) for k in ('at_s', 'step', 'pid', 'result'))
                        for a in res.get('actions') or []])
    ctx.check('gpu_reclaim reports free', res.get('free') is True and not res.get('failed'),
              res.get('msg'), hard=_baseline_free(ctx, [0]))
    ctx.check('the child was signalled', any(p == child and r == 'sent' for _unused, p, r in _actions(res)))
    ctx.check('the dead parent PID was never signalled',
              not any(p == parent for _unused, p, _r in _actions(res)))
    _verify_free_after(ctx, [0], [child], started)


# --- 5 ----------------------------------------------------------------------------------------------------

def s5_reset_check_mode(ctx):
    suite = ctx.suite
    ready = suite.wait_ready(suite.start('hold', ['--gpu', '0:512', '--title', '%s s5-holder' % suite.run_id],
                                         's5'))
    pid = ready['pid']
    ident = proc_identity(pid)
    call, res = ctx.ansible('gpu_reclaim', _reclaim_args(ctx, [0], allow_reset=True), check=True)
    plan = res.get('actions') or []
    ctx.num('plan', [dict((k, a.get(k)) for k in ('step', 'pid', 'gpu', 'result')) for a in plan])
    ctx.check('check mode run succeeded', call['rc'] == 0 and not res.get('failed'), res.get('msg'))
    ctx.check('the plan has steps', bool(plan))
    ctx.check('every step is only planned', all(str(a.get('code', '')).startswith('would_') for a in plan),
              [a.get('result') for a in plan])
    ctx.check('the plan signals our holder (sigterm, then sigkill)',
              [a.get('step') for a in plan if a.get('pid') == pid] == ['sigterm', 'sigkill'])
    ctx.check('changed reports what would change', res.get('changed') is True)
    ctx.num('reset_planned', [a.get('gpu') for a in plan if a.get('step') == 'reset'])
    # A signal sent is pending (or, if fatal, the process is exiting) by the time the module
    # has returned: no wait needed to see one.
    pending = _pending_signals(pid)
    ctx.check('the holder is alive and the same process, no signal pending (nothing was signalled)',
              alive(pid) and proc_identity(pid)[1:] == ident[1:] and pending == 0, pending)
    with Nvml() as nv:
        ctx.check('NVML still lists the holder', pid in nv.procs(0))
    rc_smi_ok = smi_table()
    ctx.check('nvidia-smi still answers (no reset happened)', 0 in rc_smi_ok)


# --- 6 ----------------------------------------------------------------------------------------------------

def s6_protected(ctx):
    suite = ctx.suite
    prot = suite.start('hold', ['--gpu', '0:512', '--comm', 'nv-hostengine', '--title',
                                'nv-hostengine %s s6-protected' % suite.run_id], 's6prot')
    victim = suite.start('hold', ['--gpu', '0:512', '--title', '%s s6-victim' % suite.run_id], 's6vic')
    p = suite.wait_ready(prot)
    v = suite.wait_ready(victim)
    ctx.num('protected', {'pid': p['pid'], 'comm': p['comm'], 'cmdline': p['cmdline']})
    ctx.num('victim_pid', v['pid'])
    ctx.check('the protected process is named nv-hostengine', p['comm'] == 'nv-hostengine', p['comm'])
    _unused, seen = ctx.ansible('gpu_holders', {'gpus': ['0']})
    h = _by_pid(seen, p['pid'])
    ctx.check('gpu_holders lists it protected (infrastructure)',
              h is not None and h.get('protected') and 'nv-hostengine' in (h.get('protected_reason') or ''),
              h and h.get('protected_reason'))
    hv = _by_pid(seen, v['pid'])
    ctx.check('the ordinary holder is not protected', hv is not None and not hv.get('protected'))
    call, res = ctx.ansible('gpu_reclaim', _reclaim_args(ctx, [0], release_timeout=3))
    ctx.num('reclaim_rc', call['rc'])
    ctx.num('msg', res.get('msg'))
    ctx.num('actions', [dict((k, a.get(k)) for k in ('at_s', 'step', 'pid', 'result'))
                        for a in res.get('actions') or []])
    acts = _actions(res)
    ctx.check('the protected PID was never signalled', not any(pid == p['pid'] for _unused, pid, _r in acts), acts)
    ctx.check('the ordinary holder was signalled', ('sigterm', v['pid'], 'sent') in acts, acts)
    gone, _unused = wait_for(lambda: not alive(v['pid']), 10)
    ctx.check('the ordinary holder is gone', gone)
    ctx.check('the protected holder is alive', alive(p['pid']))
    ctx.check('gpu_reclaim fails (GPU 0 still held by a protected process)',
              res.get('failed') is True and res.get('free') is False, res.get('msg'))
    rem = _by_pid(res, p['pid'], key='remaining')
    ctx.check('remaining names it with reason_code protected', rem is not None and
              rem.get('reason_code') == 'protected', rem and rem.get('reason_code'))
    ctx.check('the failure message names the PID', str(p['pid']) in (res.get('msg') or ''), res.get('msg'))


def s7_other_gpu_untouched(ctx):
    """Every CUDA process opens and maps every GPU's node: reclaiming GPU 1 must spare GPU 0's."""
    suite = ctx.suite
    keep = suite.start('hold', ['--gpu', '0:1024', '--title', '%s s7-gpu0' % suite.run_id], 's7keep')
    victim = suite.start('hold', ['--gpu', '1:1024', '--title', '%s s7-gpu1' % suite.run_id], 's7vic')
    k = suite.wait_ready(keep)
    v = suite.wait_ready(victim)
    _unused, seen = ctx.ansible('gpu_holders', {'gpus': ['1']})
    hk = _by_pid(seen, k['pid'])
    ctx.num('gpu0_process_seen_from_gpu1', hk and dict((f, hk.get(f)) for f in
                                                       ('kind', 'gpus', 'context_gpus', 'evidence')))
    ctx.check('the GPU-0 process holds no context on GPU 1', hk is None or 1 not in (hk.get('context_gpus') or []),
              hk and hk.get('context_gpus'))
    row = [g for g in seen.get('gpus') or [] if g.get('index') == 1]
    ctx.num('gpu1_row', row and row[0])
    started = time.monotonic()
    call, res = ctx.ansible('gpu_reclaim', _reclaim_args(ctx, [1]))
    ctx.num('reclaim_rc', call['rc'])
    acts = _actions(res)
    ctx.num('actions', acts)
    ctx.check('gpu_reclaim frees GPU 1', res.get('free') is True, res.get('msg'))
    ctx.check('the GPU-1 holder was signalled', any(p == v['pid'] and r == 'sent' for _s, p, r in acts), acts)
    ctx.check('the GPU-0 process was never signalled', not any(p == k['pid'] for _s, p, _r in acts), acts)
    ctx.check('the GPU-0 process is alive', alive(k['pid']))
    _verify_free_after(ctx, [1], [v['pid']], started)


def _signalled(result, pid):
    return [s for s, p, r in _actions(result) if p == pid and s in ('sigterm', 'sigkill') and r == 'sent']


def _advises_reset(texts):
    """Sentences that send the operator to a GPU reset or a reboot."""
    return [t for t in texts if 'reset the gpu' in t.lower() or 'reboot' in t.lower()
            or 'allow_reset: true' in t]


# --- 8 ----------------------------------------------------------------------------------------------------

def s8_nccl_peer_memory(ctx):
    """Two NCCL ranks; rank 0 dies; rank 1 keeps peer memory on GPU 0 that NVML charges to nobody."""
    suite = ctx.suite
    init = os.path.join(suite.work, 'nccl-filestore')
    ranks = [suite.start('nccl-rank', ['--rank', str(r), '--world', '2', '--init-file', init, '--mib', '2048',
                                       '--title', 'sglang::scheduler_TP%d %s s8-rank%d' % (r, suite.run_id, r)],
                         's8rank%d' % r) for r in (0, 1)]
    ready = [suite.wait_ready(r, timeout=120) for r in ranks]
    if any(r.get('skip') for r in ready):
        raise Skip('; '.join(r['skip'] for r in ready if r.get('skip')))
    rank0, rank1 = ready[0]['pid'], ready[1]['pid']
    ctx.num('ranks', [dict((k, r.get(k)) for k in ('pid', 'gpu', 'comm', 'nccl_setup_s', 'nccl_version',
                                                   'first_all_reduce_sum')) for r in ready])
    with Nvml() as nv:
        before = dict((g, nv.procs(g)) for g in (0, 1))
    ctx.num('nvml_before', dict((g, dict((str(k), v) for k, v in p.items())) for g, p in before.items()))
    ctx.check('NVML lists rank 0 on GPU 0 and rank 1 on GPU 1', rank0 in before[0] and rank1 in before[1],
              before)
    ctx.num('rank1_device_nodes', nvidia_nodes(rank1))

    os.kill(rank0, signal.SIGKILL)
    ranks[0][0].wait(timeout=10)
    with Nvml() as nv:
        wait_for(lambda: rank0 not in nv.procs(0), 10, 0.01)
        # Let the driver release what rank 0 owned alone; what stays is held through rank 1.
        dropped, waited = wait_for(lambda: nv.used_bytes(0) // MIB <= suite.baseline[0] + 64, 3)
        held0 = nv.used_bytes(0) // MIB - suite.baseline[0]
        after = dict((g, nv.procs(g)) for g in (0, 1))
    ctx.num('gpu0_held_after_rank0_died_mib', held0)
    ctx.num('nvml_after', dict((g, dict((str(k), v) for k, v in p.items())) for g, p in after.items()))
    ctx.check('rank 1 is alive', alive(rank1))
    ctx.check('NVML charges GPU 0 memory to no process of ours', not (set(after[0]) & set([rank0, rank1])),
              after[0])
    ctx.check('rank 1 keeps peer memory on GPU 0 (291 MiB on the 2x H200 of FIELD_NOTES)', not dropped,
              {'held_mib': held0, 'watched_s': waited})
    if dropped:
        ctx.note('GPU 0 went back to its baseline once rank 0 died: this driver/NCCL kept no peer memory, '
                 'so the peer rule had nothing to explain and the rest of s8 did not run')
        return
    _unused, seen = ctx.ansible('gpu_holders', {'gpus': ['0']})
    diag = seen.get('diagnosis') or []
    ctx.num('diagnosis', diag)
    h = _by_pid(seen, rank1)
    fields = ('name', 'kind', 'gpus', 'context_gpus', 'peer_gpus', 'evidence')
    ctx.num('rank1_entry', h and dict((k, h.get(k)) for k in fields))
    ctx.check('gpu_holders lists rank 1 with peer_gpus [0]', h is not None and h.get('peer_gpus') == [0],
              h and h.get('peer_gpus'))
    ctx.check('the diagnosis names rank 1, GPU 1 and the peers lever',
              any(str(rank1) in d and 'peer memory' in d and 'GPU 1' in d and 'peers: true' in d for d in diag),
              diag)
    ctx.check('no reset or reboot advice while rank 1 maps GPU 0', not _advises_reset(diag),
              _advises_reset(diag))

    call, res = ctx.ansible('gpu_reclaim', _reclaim_args(ctx, [0], release_timeout=3))
    ctx.num('reclaim_gpu0_msg', res.get('msg'))
    ctx.num('reclaim_gpu0_elapsed_s', res.get('elapsed_s'))
    ctx.check('gpu_reclaim of GPU 0 alone fails', res.get('failed') is True and res.get('free') is False,
              res.get('msg'))
    ctx.check('rank 1 (context on GPU 1) was not signalled without peers', not _signalled(res, rank1),
              _actions(res))
    ctx.check('the failure names rank 1 and the peers lever',
              str(rank1) in (res.get('msg') or '') and 'peers: true' in (res.get('msg') or ''), res.get('msg'))
    ctx.check('the failure advises no reset or reboot', not _advises_reset([res.get('msg') or '']),
              res.get('msg'))

    started = time.monotonic()
    call, res = ctx.ansible('gpu_reclaim', _reclaim_args(ctx, [0], peers=True))
    ctx.num('reclaim_peers_elapsed_s', res.get('elapsed_s'))
    ctx.num('reclaim_peers_actions', _actions(res))
    ctx.check('gpu_reclaim with peers: true reports free', res.get('free') is True and not res.get('failed'),
              res.get('msg'), hard=_baseline_free(ctx, [0, 1]))
    ctx.check('rank 1 was signalled', bool(_signalled(res, rank1)), _actions(res))
    _verify_free_after(ctx, [0, 1], [rank1], started)


# --- 9 ----------------------------------------------------------------------------------------------------

def s9_stopped_holder(ctx):
    """A SIGSTOPped holder acts on SIGTERM only once continued: the ladder sends SIGCONT with it."""
    suite = ctx.suite
    ready = suite.wait_ready(suite.start('hold', ['--gpu', '0:1024', '--title', '%s s9-stopped' % suite.run_id],
                                         's9'))
    pid = ready['pid']
    os.kill(pid, signal.SIGSTOP)
    stopped, _unused = wait_for(lambda: (proc_identity(pid) or ('?',))[0] == 'T', 5)
    ctx.check('the holder is stopped (state T)', stopped, proc_identity(pid))
    _unused, seen = ctx.ansible('gpu_holders', {'gpus': ['0']})
    h = _by_pid(seen, pid)
    ctx.num('holder_state_reported', h and h.get('state'))
    started = time.monotonic()
    call, res = ctx.ansible('gpu_reclaim', _reclaim_args(ctx, [0], term_timeout=10))
    ctx.num('reclaim_elapsed_s', res.get('elapsed_s'))
    ctx.num('actions', [dict((k, a.get(k)) for k in ('at_s', 'step', 'pid', 'result'))
                        for a in res.get('actions') or []])
    ctx.check('gpu_reclaim reports free', res.get('free') is True and not res.get('failed'), res.get('msg'),
              hard=_baseline_free(ctx, [0]))
    # Without SIGCONT the stopped holder outlives term_timeout (10 s) and gets SIGKILL; with it,
    # its SIGTERM step ends with its exit and no SIGKILL follows (read from the action log).
    steps = [(a.get('step'), a.get('code')) for a in res.get('actions') or [] if a.get('pid') == pid]
    ctx.check('SIGTERM then SIGCONT, and it exited on SIGTERM without waiting out term_timeout 10',
              [s for s, _r in steps] == ['sigterm', 'sigcont'] and steps[0][1] == 'exited', steps)
    ctx.check('SIGTERM was enough once continued (no SIGKILL)', 'sigkill' not in _signalled(res, pid),
              _actions(res))
    _verify_free_after(ctx, [0], [pid], started)


# --- 10 ---------------------------------------------------------------------------------------------------

def _ppid(pid):
    try:
        with open('/proc/%d/stat' % pid) as handle:
            return int(handle.read().rsplit(')', 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def s10_container_init(ctx):
    """PID 1 of its own PID namespace (`unshare --pid --fork`, as `docker run` without --init), no runtime."""
    suite = ctx.suite
    unshare = shutil.which('unshare')
    if not unshare:
        raise Skip('no unshare(1) on this machine')
    if os.geteuid() != 0:
        raise Skip('unshare --pid needs root (euid %d)' % os.geteuid())
    # --mount-proc gives the holder its own /proc, as docker does; without it CUDA failed to
    # initialise as PID 1 on the H200 VM (error 304). The holder then knows only its namespace
    # PID (1): its host PID is the one child of the unshare process the runner started.
    started = suite.start('hold', ['--gpu', '0:1024', '--title', '%s s10-container-init' % suite.run_id], 's10',
                          prefix=[unshare, '--pid', '--fork', '--mount-proc'])
    ready = suite.wait_ready(started)
    children = [int(p) for p in os.listdir('/proc') if p.isdigit() and _ppid(int(p)) == started[0].pid]
    if len(children) != 1:
        raise StepError('unshare (PID %d) has children %s, not exactly one holder' % (started[0].pid, children))
    pid = ready['pid'] = children[0]
    ctx.num('holder', dict((k, ready.get(k)) for k in ('pid', 'ns_pid', 'ppid', 'comm')))
    if ready.get('ns_pid') != 1:
        raise StepError('the holder is PID %s in its namespace, not 1: unshare did not give it one' % ready.get('ns_pid'))
    with Nvml() as nv:
        listed = nv.procs(0)
    ctx.num('nvml_lists_host_pid', pid in listed)
    _unused, seen = ctx.ansible('gpu_holders', {'gpus': ['0']})
    h = _by_pid(seen, pid)
    ctx.num('holder_entry', h and dict((k, h.get(k)) for k in (
        'name', 'kind', 'context_gpus', 'evidence', 'protected', 'protected_reason', 'other_pid_namespace',
        'owner', 'unit')))
    ctx.num('gpu_holders_diagnosis', seen.get('diagnosis'))
    ctx.check('gpu_holders finds the container init as a context holder of GPU 0',
              h is not None and 0 in (h.get('context_gpus') or []), h and h.get('context_gpus'))
    ctx.check('it is reported in another PID namespace', h is not None and h.get('other_pid_namespace') is True,
              h and h.get('other_pid_namespace'))
    # Issue 22: any user can make a PID namespace (unshare -Urpf needs no privilege), so being PID 1
    # of one shields nothing; only a container its runtime confirms is reached through the runtime.
    ctx.check('no container runtime confirms it, so it is not protected', h is not None and not h.get('protected'),
              h and h.get('protected_reason'))
    started_at = time.monotonic()
    call, res = ctx.ansible('gpu_reclaim', _reclaim_args(ctx, [0]))
    ctx.num('reclaim_rc', call['rc'])
    ctx.num('reclaim_msg', res.get('msg'))
    ctx.num('reclaim_actions', _actions(res))
    ctx.check('gpu_reclaim signals the namespace init (its host PID) and frees GPU 0',
              'sigterm' in _signalled(res, pid) and res.get('free') is True and not res.get('failed'),
              {'actions': _actions(res), 'msg': res.get('msg')})
    _verify_free_after(ctx, [0], [pid], started_at)


# --- 11 ---------------------------------------------------------------------------------------------------

def _gpu_processes():
    """{PID: 'context' or 'handle'} of every process but this runner with an NVIDIA device node
    open or mapped: 'context' when NVML lists it or it maps a GPU's node (/dev/nvidiaN: a forked
    child can hold a dead parent's context that way), which gpu_reclaim may signal; 'handle'
    when it only has nodes open (nvidia-persistenced, a monitor), which it never signals."""
    with Nvml() as nv:
        listed = set(pid for g in range(len(nv.handles)) for pid in nv.procs(g))
    found = {}
    for name in os.listdir('/proc'):
        if name.isdigit() and int(name) != os.getpid():
            nodes = nvidia_nodes(int(name))
            maps_gpu = any(path[len('/dev/nvidia'):].isdigit() for path in nodes['mmap'])
            if int(name) in listed or maps_gpu:
                found[int(name)] = 'context'
            elif nodes['fd'] or nodes['mmap']:
                found[int(name)] = 'handle'
    return found


def s11_default_targets(ctx):
    """gpu_reclaim as users run it: no `match`, no `gpus` (every GPU, every unprotected holder)."""
    suite = ctx.suite
    last = suite.test_gpus[-1]
    holder = suite.start('hold', ['--gpu', '0:1024', '--title', '%s s11-holder' % suite.run_id], 's11')
    ignorer = suite.start('hold', ['--gpu', '%d:512' % last, '--ignore-term', '--title',
                                   '%s s11-ignores-sigterm' % suite.run_id], 's11ign')
    pids = [suite.wait_ready(holder)['pid'], suite.wait_ready(ignorer)['pid']]
    ours = set(suite.ours())
    others = dict((p, kind) for p, kind in _gpu_processes().items() if p not in ours)
    ctx.num('gpu_processes_not_ours', dict((p, '%s: %s' % (comm_of(p), kind)) for p, kind in others.items()))
    foreign = sorted(p for p, kind in others.items() if kind == 'context')
    if foreign:
        raise Skip('processes this run did not start hold a GPU context (NVML lists them, or they map a GPU): '
                   '%s; without `match`, gpu_reclaim would take them for its targets'
                   % ', '.join('PID %d (%s)' % (p, comm_of(p)) for p in foreign))
    busy = dict((g, used) for g, used in suite.baseline.items() if used > 128)
    if busy:
        raise Skip('GPUs in use before the suite started (MiB: %s): with every GPU selected, gpu_reclaim '
                   'could not call them free' % busy)
    started = time.monotonic()
    call, res = ctx.ansible('gpu_reclaim', {'term_timeout': TERM_TIMEOUT, 'release_timeout': RELEASE_TIMEOUT})
    acts = _actions(res)
    ctx.num('reclaim_module_elapsed_s', res.get('elapsed_s'))
    ctx.num('actions', [dict((k, a.get(k)) for k in ('at_s', 'step', 'pid', 'result'))
                        for a in res.get('actions') or []])
    ctx.check('gpu_reclaim with no match and no gpus reports free', res.get('free') is True and not res.get('failed'),
              res.get('msg'))
    ctx.check('it looked at every GPU', sorted(r.get('index') for r in res.get('after') or [])
              == list(range(suite.ngpus)), [r.get('index') for r in res.get('after') or []])
    signalled = set(p for s, p, r in acts if s in ('sigterm', 'sigkill') and r == 'sent')
    ctx.check('both holders of ours were signalled', set(pids) <= signalled, acts)
    ctx.check('no process but ours was signalled', signalled <= ours, sorted(signalled - ours))
    _verify_free_after(ctx, suite.test_gpus, pids, started)


def _pending_signals(pid):
    """The process's pending signal masks (thread and process-wide) ORed, or None when gone."""
    try:
        with open('/proc/%d/status' % pid) as handle:
            fields = dict(line.split(':', 1) for line in handle if ':' in line)
    except (IOError, OSError):
        return None
    return int(fields['SigPnd'], 16) | int(fields['ShdPnd'], 16)


# --- 12 ---------------------------------------------------------------------------------------------------

# (processes, the most MiB each): many small ranks; a TP-8 server's shape, 12 GiB a rank where GPU 0
# has room (the H200's 143771 MiB), less where it has not: 8 x 12 GiB and their contexts do not fit
# in an H100's 80 GB, where the suite failed (issue 31). rank_shapes() sizes them from free memory.
RANK_SHAPES = ((24, 1024), (8, 12288))
# Beside its tensor, each rank's CUDA context: 610 MiB on the H200 (s1's context_overhead_mib, runs
# 20-22), taken as 1 GiB for cards whose context is larger; and 5% of free memory left to the driver.
RANK_CONTEXT_MIB = 1024
RANK_FILL = 0.95


def rank_shapes(free_mib, shapes=RANK_SHAPES):
    """([(processes, MiB each)] that fit in free_mib, [why for each that does not]): each rank's
    memory is the shape's most, or the most whole GiB that fits with every rank's context."""
    fits, left_out = [], []
    for count, most in shapes:
        room = int(free_mib * RANK_FILL) // count - RANK_CONTEXT_MIB
        mib = min(most, room // 1024 * 1024)
        if mib >= 1024:
            fits.append((count, mib))
        else:
            left_out.append('%d x %d MiB: GPU 0 has %d MiB free, not room for %d ranks of 1 GiB with their contexts'
                            % (count, most, free_mib, count))
    return fits, left_out


def _start_ranks(ctx, count, mib, label):
    suite = ctx.suite
    started = [suite.start('hold', ['--gpu', '0:%d' % mib, '--ignore-term', '--title',
                                    '%s %s-%d' % (suite.run_id, label, i)], '%s%d' % (label, i))
               for i in range(count)]
    return [suite.wait_ready(s)['pid'] for s in started]


def _blind_kill_to_free(ctx, pids, timeout=30):
    """SIGKILL every PID at once; (seconds until NVML has answered that GPU 0 reads back at its
    baseline, seconds until every PID's whole thread group has ended, as its pidfd tells it and as
    gpu_reclaim's ladder reads it, seconds when the memory read that answered free was asked),
    each None when it did not happen within timeout. One NVML session opened before the kill,
    both polled every 2 ms. The floor is the answer's time: the read that answers free blocks
    while the driver tears the last context down (run19: 33-46 ms, returning within 1 ms of the
    last rank's end), and runs 8-18 stamped it with the time it was asked, 35-46 ms before any
    watcher could know. (/proc/PID/stat's 'Z' is no such mark: the leader thread is a zombie
    while the thread that closes the device still runs, 3 ms after the kill in run12.)"""
    limit = ctx.suite.baseline.get(0, 0) + 64
    fds = [os.pidfd_open(pid) for pid in pids]
    try:
        with Nvml() as nv:
            t0 = time.perf_counter()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            marks = {}

            def done():
                if 'free' not in marks:
                    asked = time.perf_counter() - t0
                    if nv.used_bytes(0) // MIB <= limit:
                        marks['free'] = round(time.perf_counter() - t0, 3)
                        marks['free_asked'] = round(asked, 3)
                if 'exited' not in marks and all(select.select([fd], [], [], 0)[0] for fd in fds):
                    marks['exited'] = round(time.perf_counter() - t0, 3)
                return 'free' in marks and 'exited' in marks

            wait_for(done, timeout, 0.002)
            return marks.get('free'), marks.get('exited'), marks.get('free_asked')
    finally:
        for fd in fds:
            os.close(fd)


PF_EXITING = 0x00000004   # /proc/PID/task/TID/stat flags: set as the thread enters do_exit()


def _all_threads_exiting(pid):
    """Whether every thread of PID has PF_EXITING; None when it cannot be read (gone)."""
    try:
        tids = os.listdir('/proc/%d/task' % pid)
    except OSError:
        return None
    for tid in tids:
        try:
            with open('/proc/%d/task/%s/stat' % (pid, tid)) as handle:
                flags = int(handle.read().rsplit(')', 1)[1].split()[6])
        except (OSError, IndexError, ValueError):
            continue   # the thread ended between the listing and the read
        if not flags & PF_EXITING:
            return False
    return True


def _release_timeline(ctx, key, pids, timeout=30):
    """One more blind SIGKILL of fresh ranks, watched closely (never a floor: the watching costs
    the loop its 2 ms): for each rank, when NVML stopped listing it, when its listed memory read
    0, when every one of its threads was exiting (PF_EXITING), when it ended (pidfd); and when
    GPU 0's memory read back, both when that read was asked and when it answered. Seconds after
    the kill, each stamped when its answer was in hand, recorded: whether anything tells that a
    rank has let go of its memory before it has ended. (run15, run16: every thread is exiting
    1-2 ms after the kill; NVML lists most ranks, with their memory, until they end. Those runs
    stamped every mark with the time the loop's first read was asked, and found the memory back
    0-31 ms before the last end; run19's probe of the Ladder timed each read: the read that
    answers free blocks 33-46 ms while the driver tears the last context down, and answers
    within 1 ms of the last rank's end. gpu_reclaim therefore waits for its holders' end.)"""
    limit = ctx.suite.baseline.get(0, 0) + 64
    fds = dict((pid, os.pidfd_open(pid)) for pid in pids)
    marks = dict((pid, {}) for pid in pids)
    back = []
    try:
        with Nvml() as nv:
            t0 = time.perf_counter()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)

            def now():
                return round(time.perf_counter() - t0, 4)

            def done():
                asked = now()
                used = nv.used_bytes(0)
                if not back and used // MIB <= limit:
                    back.append((asked, now()))
                listed = nv.procs(0)
                seen = now()
                for pid in pids:
                    mark = marks[pid]
                    if 'ended' in mark:
                        continue
                    if select.select([fds[pid]], [], [], 0)[0]:
                        mark['ended'] = now()
                        continue
                    if 'unlisted' not in mark and pid not in listed:
                        mark['unlisted'] = seen
                    if 'mib_0' not in mark and not listed.get(pid):
                        mark['mib_0'] = seen
                    if 'exiting' not in mark and _all_threads_exiting(pid):
                        mark['exiting'] = now()
                return back and all('ended' in m for m in marks.values())

            wait_for(done, timeout, 0.001)
    finally:
        for fd in fds.values():
            os.close(fd)
    ctx.num('release_timeline_%s' % key,
            {'memory_back_asked_s': back[0][0] if back else None, 'memory_back_s': back[0][1] if back else None,
             'ranks': [marks[pid] for pid in pids]})
    ended = [m.get('ended') for m in marks.values()]
    for what in ('unlisted', 'mib_0', 'exiting'):
        ahead = [m['ended'] - m[what] for m in marks.values() if what in m and 'ended' in m]
        ctx.num('release_timeline_%s_%s_ahead_of_end_ms' % (key, what),
                [round(a * 1000, 1) for a in sorted(ahead)])
    if back and all(e is not None for e in ended):
        ctx.num('release_timeline_%s_last_end_after_memory_back_ms' % key, round((max(ended) - back[0][1]) * 1000, 1))
        ctx.num('release_timeline_%s_last_end_after_memory_back_asked_ms' % key,
                round((max(ended) - back[0][0]) * 1000, 1))


# Blind and gpu_reclaim alternate (blind first, then gpu_reclaim first), each on fresh ranks: the
# driver's teardown time varies from one set of ranks to the next (run8, 8 x 12 GiB: ranks gone
# 0.31-0.72 s after SIGKILL), so one of each compares two draws of that spread; 3 reps left
# 8 x 12 GiB's ratio anywhere in 1.04-1.22 (runs 11-18), so 5.
S12_REPS = 5


def _survey_profile(ctx, key, pids):
    """Where gpu_reclaim's first survey spends its time on these live ranks, measured in this
    runner with the collection's own code (never signalling; recorded, never asserted): a GPU read
    with its own NVML session and in a held one, each rank's /proc reads, and a cProfile of one
    survey, written to s12-profile.txt beside the report. The ranks are this runner's children, so
    the survey leaves them out of its holders (its classification is cheaper here than in the
    module); the reads are the same."""
    import cProfile   # pylint: disable=import-outside-toplevel
    import io   # pylint: disable=import-outside-toplevel
    import pstats   # pylint: disable=import-outside-toplevel
    import sys   # pylint: disable=import-outside-toplevel
    coll = os.path.join(ctx.suite.work, 'collections')
    if coll not in sys.path:
        sys.path.insert(0, coll)
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_flow as flow  # noqa
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe  # noqa

    def best_ms(fn, times=3):
        spent = []
        for _unused in range(times):
            began = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - began)
        return round(min(spent) * 1000, 2)

    surveyor = flow.Surveyor(gpus=['0'])
    backend = surveyor.backend
    found = {'read_gpus_own_session_ms': best_ms(lambda: backend.read_gpus(10))}
    backend.hold_session()
    backend.read_gpus(10)
    found['read_gpus_held_session_ms'] = best_ms(lambda: backend.read_gpus(10))
    backend.end_session(10)
    nodes = backend.node_paths()
    parts = {'fds_ms': 0.0, 'maps_ms': 0.0, 'details_ms': 0.0, 'fds': 0, 'maps_kib': 0}
    for pid in pids:
        base = '/proc/%d' % pid
        began = time.perf_counter()
        observe._device_fds(base, pid, nodes)   # pylint: disable=protected-access
        parts['fds_ms'] += time.perf_counter() - began
        began = time.perf_counter()
        with open(base + '/maps', 'rb') as handle:
            parts['maps_kib'] += len(handle.read()) // 1024
        parts['maps_ms'] += time.perf_counter() - began
        began = time.perf_counter()
        observe.read_process(pid)
        parts['details_ms'] += time.perf_counter() - began
        parts['fds'] += len(os.listdir(base + '/fd'))
    found.update((k, round(v * 1000, 2) if k.endswith('_ms') else v) for k, v in parts.items())
    from concurrent.futures import ThreadPoolExecutor   # pylint: disable=import-outside-toplevel

    def maps_in_threads():
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda pid: observe._read_entry('/proc/%d' % pid, pid, 'maps'), pids))  # noqa
    found['maps_8_threads_ms'] = best_ms(maps_in_threads, 1)
    found['survey_own_session_ms'] = best_ms(lambda: surveyor.survey(full=False))
    backend.hold_session()
    surveyor.survey(full=False)
    found['survey_held_session_ms'] = best_ms(lambda: surveyor.survey(full=False))
    backend.end_session(10)
    profile = cProfile.Profile()
    profile.enable()
    surveyor.survey(full=False)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats('cumulative').print_stats(40)
    with open(os.path.join(ctx.suite.out, 's12-profile.txt'), 'a') as handle:
        handle.write('=== %s: %d live ranks, one survey(full=False) in the runner (own NVML session)\n%s\n%s\n'
                     % (key, len(pids), found, text.getvalue()))
    found['check_mode_first_signal_ms'] = _check_mode_profile(ctx, key, len(pids), flow)
    ctx.num('survey_profile_%s' % key, found)


def _check_mode_profile(ctx, key, count, flow):
    """gpu_reclaim's own path to its first signal, profiled: the Ladder in check mode (it records
    the signals it would send, sends none) in a forked child of this runner, where the ranks are
    no children of the surveying process (as for the module, whose ancestor this runner is).
    Returns the at_s of the first SIGTERM it would send, in ms; its cProfile goes to
    s12-profile.txt."""
    import cProfile   # pylint: disable=import-outside-toplevel
    import io   # pylint: disable=import-outside-toplevel
    import json   # pylint: disable=import-outside-toplevel
    import pstats   # pylint: disable=import-outside-toplevel
    path = os.path.join(ctx.suite.work, 's12-check-%s.json' % key)
    child = os.fork()
    if child == 0:
        status = 1
        try:
            ladder = flow.Ladder(flow.Surveyor(gpus=['0']), term_timeout=10, match=[ctx.suite.run_id],
                                 check_mode=True)
            profile = cProfile.Profile()
            profile.enable()
            result = ladder.run()
            profile.disable()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats('cumulative').print_stats(50)
            terms = [a['at_s'] for a in result['actions'] if a['step'] == 'sigterm']
            with open(path, 'w') as handle:
                json.dump({'first_ms': round(min(terms) * 1000, 1) if terms else None,
                           'would_signal': len(terms), 'profile': text.getvalue()}, handle)
            status = 0
        finally:
            os._exit(status)   # pylint: disable=protected-access
    os.waitpid(child, 0)
    try:
        with open(path) as handle:
            got = json.load(handle)
    except (IOError, OSError, ValueError):
        return None
    with open(os.path.join(ctx.suite.out, 's12-profile.txt'), 'a') as handle:
        handle.write('=== %s: gpu_reclaim\'s Ladder in check mode on the %d live ranks (a child of the runner): '
                     'first SIGTERM it would send at %s ms, %d would be sent\n%s\n'
                     % (key, count, got['first_ms'], got['would_signal'], got['profile']))
    return got['first_ms']


def _blind_once(ctx, count, mib, key, rep):
    pids = _start_ranks(ctx, count, mib, 's12b%d-%d' % (count, rep))
    blind, exited, asked = _blind_kill_to_free(ctx, pids)
    ctx.check('%s: a blind SIGKILL of all frees GPU 0 (rep %d)' % (key, rep), blind is not None)
    gone, _unused = wait_for(lambda: not [p for p in pids if alive(p)], 10)
    ctx.check('%s: every blind-killed rank is gone (rep %d)' % (key, rep), gone)
    return blind, exited, asked


def _reclaim_once(ctx, count, mib, key, rep):
    """gpu_reclaim on fresh ranks: (elapsed_s, first signal at_s, last holder gone at_s)."""
    pids = _start_ranks(ctx, count, mib, 's12r%d-%d' % (count, rep))
    if rep == 0:
        _survey_profile(ctx, key, pids)
    call, res = ctx.ansible('gpu_reclaim', _reclaim_args(ctx, [0], term_timeout=10))
    acts = res.get('actions') or []
    signals = [a for a in acts if a.get('step') in ('sigterm', 'sigkill')]
    release = [a for a in acts if a.get('step') == 'wait_release']
    first = min(a['at_s'] for a in signals) if signals else None
    # The holders are gone when the last one exited (a SIGKILLed context's process exits once
    # the driver has torn its context down); a wait_release step, if any, ends later.
    gone_at = [a['at_s'] + a['took_s'] for a in signals if a.get('took_s') is not None]
    gone_at += [a['at_s'] + (a.get('waited_s') or 0.0) for a in release]
    freed_at = round(max(gone_at), 3) if gone_at else None
    ctx.num('reclaim_steps_%s_rep%d' % (key, rep), sorted(set(a.get('step') for a in acts)))
    ctx.check('%s: gpu_reclaim reports free (rep %d)' % (key, rep), res.get('free') is True and not res.get('failed'),
              res.get('msg'))
    killed = set(a.get('pid') for a in signals if a.get('step') == 'sigkill' and a.get('changed'))
    ctx.check('%s: every rank got SIGKILL (SigIgn holds SIGTERM: no grace waited) (rep %d)' % (key, rep),
              killed == set(pids), sorted(set(pids) - killed))
    ctx.check('%s: no wait of term_timeout: the SIGKILLs came with the SIGTERMs (rep %d)' % (key, rep),
              not [a for a in acts if a.get('step') == 'wait' and (a.get('waited_s') or 0) >= 10], acts)
    _verify_free_after(ctx, [0], pids, time.monotonic())
    return res.get('elapsed_s'), first, freed_at


def _mean(values):
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 3) if values else None


def s12_many_ranks(ctx):
    """Many ranks on one GPU, all ignoring SIGTERM: the driver tears their contexts down one after
    another, so the floor is a blind SIGKILL of all of them at once, measured here in the same run,
    S12_REPS times each, alternating with gpu_reclaim on the same shape. The floor: from the kill
    until NVML has answered that GPU 0 reads back at its baseline (when the answer came, not when
    it was asked: that read blocks while the driver tears the last context down, run19), in an
    NVML session opened before it, polled every 2 ms. gpu_reclaim's times come from its action
    log, from the ladder's start (module import and Ansible's start-up left out, as bench/run
    reclaim counts the Ladder's own time): its first
    signal, the last holder gone (a signal's at_s + took_s), and elapsed_s (verified free: its own
    NVML read, in the session it holds for the run). Ratios to the floor are recorded, never
    asserted. The shapes are sized from GPU 0's free memory (rank_shapes); one that cannot fit is
    left out and the scenario ends skipped, naming it."""
    with Nvml() as nv:
        free_mib = nv.gpu(0)['free_mib']
    shapes, left_out = rank_shapes(free_mib)
    ctx.num('gpu0_free_mib_at_start', free_mib)
    ctx.num('shapes', ['%dx%d' % shape for shape in shapes])
    for count, mib in shapes:
        key = '%dx%d' % (count, mib)
        blinds, runs = [], []
        for rep in range(S12_REPS):
            order = (True, False) if rep % 2 == 0 else (False, True)
            for blind_first in order:
                if blind_first:
                    blinds.append(_blind_once(ctx, count, mib, key, rep))
                else:
                    runs.append(_reclaim_once(ctx, count, mib, key, rep))
        _release_timeline(ctx, key, _start_ranks(ctx, count, mib, 's12t%d' % count))
        elapsed = [r[0] for r in runs]
        firsts = [r[1] for r in runs]
        gones = [r[2] for r in runs]
        exits = [b[1] for b in blinds]
        ctx.num('blind_free_read_asked_s_%s_reps' % key, [b[2] for b in blinds])
        blinds = [b[0] for b in blinds]
        ctx.num('blind_sigkill_to_free_s_%s_reps' % key, blinds)
        ctx.num('blind_sigkill_to_exited_s_%s_reps' % key, exits)
        ctx.num('reclaim_elapsed_s_%s_reps' % key, elapsed)
        ctx.num('reclaim_first_signal_at_s_%s_reps' % key, firsts)
        ctx.num('reclaim_holders_gone_at_s_%s_reps' % key, gones)
        blind, took = _mean(blinds), _mean(elapsed)
        ctx.num('blind_sigkill_to_free_s_%s' % key, blind)
        ctx.num('reclaim_first_signal_at_s_%s' % key, _mean(firsts))
        ctx.num('reclaim_holders_gone_at_s_%s' % key, _mean(gones))
        ctx.num('reclaim_elapsed_s_%s' % key, took)
        if blind and took:
            ctx.num('reclaim_elapsed_vs_blind_floor_%s' % key, round(took / blind, 3))
        kill_to_gone = [g - f for f, g in zip(firsts, gones) if f is not None and g is not None]
        if blind and kill_to_gone:
            ctx.num('reclaim_kill_to_gone_vs_blind_floor_%s' % key, round(_mean(kill_to_gone) / blind, 3))
        # gpu_reclaim reports free only once its holders have ended; the NVML floor answers free
        # within a ms or two of the last rank's end (run19), and the blind kill's own end is
        # recorded beside it as the like-for-like floor for the kill-to-gone.
        exited = _mean(exits)
        ctx.num('blind_sigkill_to_exited_s_%s' % key, exited)
        if exited and kill_to_gone:
            ctx.num('reclaim_kill_to_gone_vs_blind_exited_%s' % key, round(_mean(kill_to_gone) / exited, 3))
    if left_out:
        raise Skip('cannot fit on GPU 0: %s' % '; '.join(left_out))


# --- 13, 14 ----------------------------------------------------------------------------------------------

# The restarted worker's weights, on top of importing torch and creating its context (about 4 s in
# all on the H200 of FIELD_NOTES): it re-titles itself first, then takes the GPU seconds later.
RESPAWN_LOAD_S = 1.0
RESPAWN_DELAY_S = 0.3         # the loop's `sleep`, as measured (FIELD_NOTES, H200 third round)


def _descendants(pid):
    """{pid: ppid} of every live descendant of pid (from /proc/PID/task/*/children)."""
    found, queue = {}, [pid]
    while queue:
        parent = queue.pop(0)
        try:
            tids = os.listdir('/proc/%d/task' % parent)
        except OSError:
            continue
        for tid in tids:
            try:
                with open('/proc/%d/task/%s/children' % (parent, tid)) as handle:
                    kids = [int(c) for c in handle.read().split()]
            except (IOError, OSError, ValueError):
                continue
            for kid in kids:
                if kid not in found:
                    found[kid] = parent
                    queue.append(kid)
    return found


def _exe(pid):
    try:
        return os.path.realpath('/proc/%d/exe' % pid)
    except OSError:
        return None


def _start_loop(ctx, label, depth):
    """A bash loop outside systemd that restarts, RESPAWN_DELAY_S after it ends, the worker (depth
    1: the loop is the holder's parent) or a bash launcher that runs the worker and exits with it
    (depth 2: the loop is its grandparent). The worker imports torch, re-titles itself
    `sglang::scheduler_TP0 <run id>`, waits RESPAWN_LOAD_S, takes 1024 MiB on GPU 0 and writes the
    ready file, which the loop removes before each start. The loop gives up by itself after the
    suite's budget. Returns (popen, ready path, log path) as Suite.start does."""
    suite = ctx.suite
    suite.counter += 1
    ready = os.path.join(suite.work, 'ready-%02d-%s.json' % (suite.counter, label))
    log = os.path.join(suite.work, 'log-%02d-%s.txt' % (suite.counter, label))
    life = max(30.0, suite.left() + 30.0)
    worker = [suite.python, WORKLOAD, 'hold', '--ready', ready, '--max-life', '%.0f' % life,
              '--backend', suite.backend, '--marker', suite.run_id, '--gpu', '0:1024',
              '--title', 'sglang::scheduler_TP0 %s %s' % (suite.run_id, label), '--comm', 'sglang::scheduler_TP0',
              '--import-first', '--load-s', str(RESPAWN_LOAD_S)]
    command = ' '.join(shlex.quote(a) for a in worker)
    if depth == 2:
        command = 'bash -c %s' % shlex.quote('%s; exit $?' % command)
    script = ('end=$((SECONDS + %d)); while [ $SECONDS -lt $end ]; do rm -f %s; %s; sleep %s; done'
              % (life, shlex.quote(ready), command, RESPAWN_DELAY_S))
    with open(log, 'w') as handle:
        proc = subprocess.Popen(['bash', '-c', script], stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=suite.env(), cwd=suite.work)
    suite.popens.append(proc)
    return proc, ready, log


def _respawn_loop(ctx, depth):
    """A loop restarting a worker that imports torch, re-titles itself and takes CUDA again seconds
    later: gpu_reclaim must not report free while the loop lives, and ends it (match covers it)."""
    suite = ctx.suite
    label = 's13' if depth == 1 else 's14'
    started = _start_loop(ctx, label, depth)
    loop, ready_path = started[0].pid, started[1]
    first = suite.wait_ready(started)
    ctx.num('loop_pid', loop)
    ctx.num('first_worker', dict((k, first.get(k)) for k in ('pid', 'ppid', 'comm', 'cmdline')))
    ctx.num('torch_import_s', (first.get('runtime') or {}).get('import_s'))
    ctx.check('the worker re-titled itself', (first.get('comm') or '').startswith('sglang::'),
              first.get('comm'), hard=False)
    ancestry = [first['ppid']] if depth == 1 else [first['ppid'], (proc_identity(first['ppid']) or ('', None))[1]]
    ctx.check('the loop is the worker\'s %s' % ('parent' if depth == 1 else 'grandparent'),
              ancestry[-1] == loop, ancestry)

    # The shape without the module: how soon the loop has a new process of the worker's program,
    # and how soon that one holds the GPU again.
    program = _exe(first['pid'])
    t0 = time.monotonic()
    os.kill(first['pid'], signal.SIGKILL)
    new, waited = wait_for(lambda: [p for p in _descendants(loop) if p != first['pid'] and _exe(p) == program],
                           30, 0.005)
    ctx.num('respawn_new_process_of_the_program_s', waited if new else None)
    wait_for(lambda: not os.path.exists(ready_path), 30, 0.01)
    second = suite.wait_ready(started, timeout=120)
    ctx.num('respawn_holds_gpu_again_s', round(time.monotonic() - t0, 3))
    ctx.check('the restarted worker takes the GPU only seconds after it exists (the old 1 s window missed it)',
              time.monotonic() - t0 - waited > 1.0, round(time.monotonic() - t0, 3), hard=False)
    ctx.num('second_worker', dict((k, second.get(k)) for k in ('pid', 'ppid', 'comm')))

    started_at = time.monotonic()
    call, res = ctx.ansible('gpu_reclaim', _reclaim_args(ctx, [0]))
    ctx.num('reclaim_module_elapsed_s', res.get('elapsed_s'))
    ctx.num('reclaim_msg', res.get('msg'))
    ctx.num('actions', [dict((k, a.get(k)) for k in ('at_s', 'step', 'pid', 'pids', 'result'))
                        for a in res.get('actions') or []])
    loop_alive = alive(loop)
    ctx.check('gpu_reclaim does not report free while the loop lives', not (res.get('free') and loop_alive),
              {'free': res.get('free'), 'loop_alive': loop_alive})
    respawn = [a for a in res.get('actions') or [] if a.get('step') == 'respawn' and a.get('pid') == loop]
    ctx.check('the loop is recognised as the respawner (by ancestry and program, not by title)',
              bool(respawn) and respawn[0].get('code') == 'respawner_target',
              [a.get('result') for a in respawn])
    ctx.check('the loop was signalled', any(p == loop and r == 'sent' for s, p, r in _actions(res)
                                            if s in ('sigterm', 'sigkill')), _actions(res))
    ctx.check('gpu_reclaim reports free', res.get('free') is True and not res.get('failed'), res.get('msg'),
              hard=_baseline_free(ctx, [0]))
    gone, _unused = wait_for(lambda: (suite.reap(), not alive(loop))[1], 10)
    ctx.check('the loop is gone', gone)
    left, _unused = wait_for(lambda: (suite.reap(), not suite.ours())[1], 10)
    ctx.check('nothing of the loop is left (no restarted worker escaped, loading)', left, suite.ours())
    _verify_free_after(ctx, [0], [second['pid']], started_at)


def s13_respawn_parent(ctx):
    _respawn_loop(ctx, 1)


def s14_respawn_grandparent(ctx):
    _respawn_loop(ctx, 2)


# name, title, function, time limit (s), needs ansible, needs GPUs
# --- 15 ---------------------------------------------------------------------------------------------------

def _timed(fn):
    """(answer, ms): the answer, or {'error': NVML's words, 'value': its code}."""
    started = time.monotonic()
    try:
        answer = fn()
    except pynvml.NVMLError as exc:
        answer = {'error': str(exc), 'value': exc.value}
    return answer, round((time.monotonic() - started) * 1000.0, 3)


def _health_reads(index):
    """What the driver answers for GPU `index`'s health, each read timed, in one open session."""
    reads = {}
    with Nvml() as nv:
        handle = nv.handles[index]
        reads['remapped_rows'] = _timed(lambda: list(pynvml.nvmlDeviceGetRemappedRows(handle)))
        reads['ecc_volatile_uncorrected'] = _timed(lambda: pynvml.nvmlDeviceGetTotalEccErrors(
            handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC))
        reads['retired_pages_pending'] = _timed(lambda: pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))

        def recovery():
            value = pynvml.nvmlDeviceGetFieldValues(handle, [230])[0]   # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
            return {'nvml_return': value.nvmlReturn, 'value_type': value.valueType, 'value': value.value.uiVal}
        reads['recovery_action'] = _timed(recovery)

        def xid_events():
            events = pynvml.nvmlEventSetCreate()
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
                try:
                    data = pynvml.nvmlEventSetWait_v2(events, 50)
                    return {'event': int(data.eventData)}
                except pynvml.NVMLError as exc:
                    return {'wait': str(exc), 'value': exc.value}
            finally:
                pynvml.nvmlEventSetFree(events)
        reads['xid_event_wait_50ms'] = _timed(xid_events)
    return reads


def s15_gpu_health(ctx):
    """Issue 30 item 6: the health reads on the real card, and gpu_holders' verdict on them."""
    suite = ctx.suite
    index = suite.test_gpus[0]
    reads = _health_reads(index)
    ctx.num('reads', dict((name, {'answer': answer, 'ms': ms}) for name, (answer, ms) in reads.items()))
    remapped = reads['remapped_rows'][0]
    ctx.check('remapped rows answer, none pending and none failed',
              isinstance(remapped, list) and remapped[2] == 0 and remapped[3] == 0, remapped)
    ecc = reads['ecc_volatile_uncorrected'][0]
    ctx.check('no volatile uncorrectable ECC error', ecc == 0, ecc)
    retired = reads['retired_pages_pending'][0]
    ctx.check('retired pages pending: a value (0) or Not Supported (Ampere and later)',
              retired == 0 or (isinstance(retired, dict) and retired.get('value') == pynvml.NVML_ERROR_NOT_SUPPORTED),
              retired)
    recovery = reads['recovery_action'][0]
    ctx.check('recovery action field 230 answers 0 (none)',
              isinstance(recovery, dict) and recovery.get('nvml_return') == 0 and recovery.get('value') == 0, recovery)
    xid = reads['xid_event_wait_50ms'][0]
    ctx.check('registering for critical Xid events works and a 50 ms wait times out',
              isinstance(xid, dict) and xid.get('value') == pynvml.NVML_ERROR_TIMEOUT, xid)

    call, res = ctx.ansible('gpu_holders', {'gpus': [str(index)], 'handles': False, 'health': True})
    ctx.num('gpu_holders_ansible_wall_s', call['wall_s'])
    ctx.check('gpu_holders with health succeeded', call['rc'] == 0 and not res.get('failed'), res.get('msg'))
    rows = dict((r['index'], r) for r in res.get('gpus') or [])
    health = (rows.get(index) or {}).get('health') or {}
    facts = health.get('facts') or {}
    ctx.num('module_health', health)
    ctx.num('module_took_ms', facts.get('took_ms'))
    # The module reads Xids from `journalctl -k`. A machine without systemd's journal (the device
    # machine is a container whose PID 1 is no init) has none: there the module must say so as the
    # one read it could not make (`unread`, naming journalctl), never call the GPU healthy or faulty.
    journal = shutil.which('journalctl')
    ctx.num('xid_source', journal or 'none: journalctl is not on PATH on this machine')
    unread = facts.get('unread') or {}
    if journal:
        ctx.check('gpu_holders reads GPU %d healthy' % index, health.get('code') == 'healthy', health.get('message'))
    else:
        ctx.check('without a journal, gpu_holders reads GPU %d healthy but for the Xid read, which it names'
                  % index, health.get('code') == 'unread' and not facts.get('problems') and list(unread) == ['xid']
                  and 'journalctl' in (unread['xid'].get('text') or ''), health.get('message'))
    ctx.check('its facts are what the driver answered directly',
              isinstance(remapped, list) and facts.get('remapped_rows') == dict(zip(
                  ('correctable', 'uncorrectable', 'pending', 'failed'), remapped))
              and facts.get('ecc_volatile_uncorrected') == ecc and facts.get('recovery_action') == 0,
              {'module': facts, 'direct': reads})
    if journal:
        ctx.check('the kernel log was read for Xids (journalctl -k)', 'xid' not in unread, unread)


SCENARIOS = [
    ('s1', 'NVML facts: a torch holder is listed with its memory; SIGKILL releases it', s1_nvml_facts,
     90, False, 1),
    ('s2', 'gpu_holders vs nvidia-smi: same GPUs, same memory, torch holder with its evidence',
     s2_holders_vs_smi, 90, True, 1),
    ('s3', 'seed incident: parent SIGKILLed, spawned TP children orphaned, SIGTERM ignored; gpu_reclaim frees',
     s3_seed_incident, 150, True, 1),
    ('s4', 'forked child after the context: NVML charges the dead parent; gpu_reclaim frees',
     s4_forked_child, 90, True, 1),
    ('s5', 'reset in check mode: a plan, nothing signalled, nothing reset', s5_reset_check_mode, 75, True, 1),
    ('s6', 'protected infrastructure (nv-hostengine) keeps its context; the others go', s6_protected,
     90, True, 1),
    ('s7', 'reclaiming GPU 1 spares a process of GPU 0 that has GPU 1 open and mapped', s7_other_gpu_untouched,
     90, True, 2),
    ('s8', 'NCCL peer memory: rank 0 dies, rank 1 keeps memory on GPU 0 charged to nobody; explained, peers: true '
     'frees it', s8_nccl_peer_memory, 150, True, 2),
    ('s9', 'a SIGSTOPped holder gets SIGCONT with SIGTERM and exits on it (term_timeout 10 not waited out)',
     s9_stopped_holder, 90, True, 1),
    ('s10', 'PID 1 of its own PID namespace (unshare --pid --fork), no runtime: not a shield, freed',
     s10_container_init, 90, True, 1),
    ('s11', 'default targeting: gpu_reclaim with no match and no gpus frees the run\'s holders, signals nothing else',
     s11_default_targets, 90, True, 1),
    ('s12', 'many ranks ignoring SIGTERM on one GPU (24 x 1 GiB, 8 x up to 12 GiB): gpu_reclaim beside a blind '
     'SIGKILL of all, the driver\'s floor', s12_many_ranks, 330, True, 1),
    ('s13', 'a bash loop restarts a torch worker that re-titles itself and takes CUDA seconds later; gpu_reclaim '
     'ends the loop, never free while it lives', s13_respawn_parent, 150, True, 1),
    ('s14', 'the same loop one level up: it restarts a launcher whose child is the worker', s14_respawn_grandparent,
     150, True, 1),
    ('s15', 'GPU health: remapped rows, volatile uncorrectable ECC, retired pages, recovery action 230, Xid '
     'events, each read timed; gpu_holders reads it healthy', s15_gpu_health, 60, True, 1),
]

__all__ = ['SCENARIOS', 'StepError']
