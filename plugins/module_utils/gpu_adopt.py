# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Adopt: end a server started by hand (no unit owns it) the way a unit's stop ends one.

The roots (the launcher on the port, tensor-parallel ranks and orphans on the GPUs, each with
the start time recorded when it was found) and every descendant of them are moved into a new
transient scope unit, and that scope is stopped: systemd sends SIGTERM to every member and
SIGKILL after the stop timeout, exactly as it stops a unit (KillMode=control-group), orphans
included. The ladder's rule comes first (gpu_reclaim's): a process whose SigIgn mask holds
SIGTERM would only wait out the timeout, so it gets SIGKILL at once (measured in make demo:
node2's four SIGTERM-ignoring ranks took 15.37 s through the scope's stop, 0.051 s this way).

Identity (issue 22): (PID, start time), as everywhere in this collection. A root without a
start time refuses the whole adoption. systemd's StartTransientUnit takes numbers, so the move
is verified before anything is stopped: every member of the new scope must be a process
planned here (same PID and start time) or one it forked since; anything else (a number reused
between the look and the move) leaves the scope running, unstopped, and fails naming it. Every
signal goes through gpu_act.send_signal (pidfd, start time re-read).

Only what no owner stops is adopted (gpu_owner, from /proc/PID/cgroup and who named it): a
login session, a transient scope, or no unit. A process of a system service, a container, a
pod, a guest or a cgroup a user named is left to that owner and named; so are PID 0 and 1, a
kernel thread and this module's own tree.

Observation through gpu_observe, the host changed only through the actor (gpu_act.HostActor):
the scope is made by running `scope_argv` (systemd's StartTransientUnit, through busctl), and
stopped the way the unit families stop a unit (gpu_family.stop_unit: `systemctl stop`, then
is-active polled). Making a scope of running processes is adoption's own lever (no
owner family makes one), so its argv is built here. `refusal`, `strangers` and `scope_argv` are
pure, and `sentence` is the one place their codes become text.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import signal
import time

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act, gpu_lever, gpu_observe, gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_family
# gpu_owner reads a cgroup with the families' recognisers, which gpu_families hands it on import.
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_families  # noqa: F401 pylint: disable=unused-import
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say

# Why a process is not adopted (codes; sentences in `sentence`).
NEVER, GONE, REUSED = gpu_lever.ADOPT_NEVER, gpu_lever.ADOPT_GONE, gpu_lever.ADOPT_REUSED
KTHREAD, OWNED = gpu_lever.ADOPT_KTHREAD, gpu_lever.ADOPT_OWNED

# Owners that stop nothing themselves: a hand-started server lives in one of these.
ADOPTABLE = (gpu_owner.SESSION, gpu_owner.SCOPE, gpu_owner.NONE)
# How long systemd may take to report the new scope active, the killed-at-once processes to
# go, and the scope's members to be gone after the stop: polled, each a bound, not a wait.
ACTIVE_S = 10.0
KILLED_S = 2.0
LEFT_S = 5.0
# The cap on what one process's command line adds to the result (a line past 128 KiB is real).
CMDLINE_CHARS = 300


def parse_roots(roots):
    """[(pid, start_time or None)] from the `roots` option, a mapping PID -> start time (keys may
    be text: JSON has no integer keys); ValueError names a bad entry."""
    if not isinstance(roots, dict):
        raise ValueError('roots must map each PID to its start time, got %r' % (roots,))
    parsed = []
    for key, value in roots.items():
        text = str(key).strip()
        if not text.isdigit():
            raise ValueError('roots: %r is not a PID' % (key,))
        if value is None or (isinstance(value, str) and value.strip().lower() in ('', 'none', 'null')):
            start = None
        elif isinstance(value, bool) or not (isinstance(value, int) or str(value).strip().isdigit()):
            raise ValueError('roots: the start time of PID %s is %r, not a number of clock ticks' % (text, value))
        else:
            start = int(value)
        parsed.append((int(text), start))
    return sorted(parsed)


def refusal(pid, start_time, seen, own_tree):
    """Pure: None when the process may be adopted, else a code. `seen` is its ProcState now
    (None when gone) with `owner` its gpu_owner record; `start_time` the one recorded."""
    if pid <= 1 or pid in own_tree:
        return NEVER
    if seen is None or seen.state == 'zombie':
        return GONE      # a zombie holds nothing and is its parent's to reap
    if start_time is not None and seen.start_time != start_time:
        return REUSED
    if seen.kthread:
        return KTHREAD
    if seen.owner.kind not in ADOPTABLE:
        return OWNED
    return None


def strangers(chains, planned):
    """Pure: the members of the scope that are neither a planned process nor a descendant of
    one. `chains` maps each member PID to its ancestry [(pid, start_time)], itself first;
    `planned` is the set of (pid, start_time) moved."""
    return sorted(pid for pid, chain in chains.items() if not any(link in planned for link in chain))


def scope_argv(scope, pids, stop_timeout, description):
    """The command that moves `pids` into a new transient scope unit `scope` (systemd's
    StartTransientUnit, through busctl: systemctl cannot make a scope of running processes), so
    that stopping it ends them the way a unit's stop does: SIGTERM to every member, SIGKILL
    after `stop_timeout` seconds (TimeoutStopUSec). systemd takes numbers here, not pidfds: the
    caller verifies afterwards who the scope holds."""
    return (['busctl', 'call', 'org.freedesktop.systemd1', '/org/freedesktop/systemd1',
             'org.freedesktop.systemd1.Manager', 'StartTransientUnit', 'ssa(sv)a(sa(sv))', scope, 'fail', '3',
             'Description', 's', description,
             'TimeoutStopUSec', 't', '%d' % int(stop_timeout * 1000000),
             'PIDs', 'au', '%d' % len(pids)] + ['%d' % pid for pid in pids] + ['0'])


def sentence(code, pid, owner=None):
    """Why PID is not adopted, in words (gpu_say.not_adopted)."""
    return say.not_adopted(code, pid, owner)


def _chain(pid, proc):
    """[(pid, start_time)] from `pid` up to PID 1 (fewer when one exits meanwhile)."""
    chain, seen = [], set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            stat = gpu_observe.read_stat(pid, proc)
        except gpu_observe.ProcError:
            break
        chain.append((pid, stat.start_time))
        pid = stat.ppid
    return chain


class Adoption(object):
    """One adoption: plan (observe and decide), then run (act and verify) through `actor`."""

    def __init__(self, stem, stop_timeout, roots, actor=None, clock=time.monotonic, proc='/proc'):
        self.stem = stem
        self.stop_timeout = stop_timeout
        self.roots = roots
        self.actor = actor or gpu_act.HostActor(clock=clock)
        self.clock = clock
        self.proc = proc
        self.started = clock()
        self.own_tree = frozenset(gpu_observe.ancestors(os.getpid(), proc))
        self.out = {'scope': None, 'procs': [], 'not_adopted': [], 'not_adopted_codes': [], 'killed_at_once': [],
                    'stopped': False, 'left': [], 'actions': [], 'seconds': None, 'error': None,
                    'error_code': None}
        self.planned = {}     # pid -> start time

    def _at(self):
        return round(self.clock() - self.started, 3)

    def _seen(self, pid):
        try:
            info = gpu_observe.read_process(pid, self.proc)
        except gpu_observe.ProcError:
            return None
        info_owner = gpu_owner.owner_from_cgroup(info.cgroup, info.cgroup_uids)
        return _Seen(info, info_owner)

    def _fail(self, code, **facts):
        self.out['error_code'] = code
        self.out['error'] = say.adopt_error(code, **facts)

    def _skip(self, pid, code, owner=None):
        self.out['not_adopted'].append(say.not_adopted(code, pid, owner))
        self.out['not_adopted_codes'].append({'pid': pid, 'reason_code': code})

    def plan(self):
        """Decide what the scope takes: the roots still the processes recorded, and their
        descendants, each one adoption allows. Changes nothing."""
        unknown = [pid for pid, start in self.roots if start is None]
        if unknown:
            self._fail(gpu_lever.ADOPT_NO_START_TIME, pids=unknown)
            return self.out
        queue = []
        for pid, start in self.roots:
            seen = None if pid <= 1 or pid in self.own_tree else self._seen(pid)
            code = refusal(pid, start, seen, self.own_tree)
            if code:
                self._skip(pid, code, seen and seen.owner)
                continue
            self._take(seen, root=True)
            queue.append(pid)
        for root in queue:
            for child in sorted(gpu_observe.descendants_of(root, self.proc)):
                if child in self.planned:
                    continue
                seen = None if child in self.own_tree else self._seen(child)
                code = refusal(child, None, seen, self.own_tree)
                if code == GONE:
                    continue        # exited since the walk: nothing to adopt
                if code:
                    self._skip(child, code, seen and seen.owner)
                    continue
                self._take(seen, root=False)
        return self.out

    def _take(self, seen, root):
        info = seen.info
        self.planned[info.pid] = info.start_time
        self.out['procs'].append({'pid': info.pid, 'start_time': info.start_time, 'name': info.name,
                                  'cmdline': (info.cmdline or '')[:CMDLINE_CHARS], 'uid': info.uid, 'root': root,
                                  'owner': seen.owner.kind, 'unit': seen.owner.unit})

    def _record(self, what, target, result, changed, at_s, took_s=None, **details):
        self.out['actions'].append(gpu_act.Action(what, target, result, changed, at_s=at_s, took_s=took_s,
                                                  **details).as_result())

    def _alive(self):
        return [pid for pid, start in sorted(self.planned.items()) if gpu_act.is_alive(pid, start)]

    def run(self, check_mode=False):
        """Plan, then (unless `check_mode`) move, verify, end. Returns the result dict."""
        self.plan()
        if self.out['error'] or not self.planned or check_mode:
            self.out['seconds'] = self._at()
            return self.out
        scope = '%s-%d.scope' % (self.stem, int(time.time()))
        self.out['scope'] = scope
        at = self._at()
        result, changed = self.actor.run(scope_argv(scope, sorted(self.planned), self.stop_timeout,
                                                    'adopted by gpuops.reclaim: ' + self.stem),
                                         gpu_family.SYSTEMCTL_TIMEOUT_S)
        if changed:
            result = say.step(gpu_lever.SCOPE_STARTED)
        self._record('start_scope', scope, result, changed, at, round(self._at() - at, 3),
                     pids=sorted(self.planned))
        if not changed:
            self._fail(gpu_lever.ADOPT_SCOPE_REFUSED, scope=scope, result=result)
            return self._finish()
        group = self._control_group(scope)
        odd = self._strangers(group) if group else None
        if odd is None:
            self._fail(gpu_lever.ADOPT_NO_CGROUP, scope=scope)
        elif odd:
            self._fail(gpu_lever.ADOPT_STRANGERS, scope=scope, pids=odd)
        if not self.out['error']:
            self._end(scope)
        return self._finish()

    def _control_group(self, scope):
        facts, _waited = gpu_act.wait_for(lambda: _active(scope), ACTIVE_S, clock=self.clock)
        return facts and facts.control_group

    def _strangers(self, group):
        members = gpu_observe.cgroup_procs(group)
        if members is None:
            return None
        return strangers(dict((pid, _chain(pid, self.proc)) for pid in members),
                         set(self.planned.items()))

    def _end(self, scope):
        """The ladder's SIGKILL at once for SIGTERM-ignoring members, then the scope's stop."""
        for pid, start in sorted(self.planned.items()):
            try:
                ignoring = gpu_observe.read_sigterm_ignored(pid, self.proc)
            except gpu_observe.ProcError:
                continue
            if not ignoring:
                continue
            at = self._at()
            result = gpu_act.send_signal(pid, start, signal.SIGKILL, never=self.own_tree)
            self._record('adopt_sigkill', pid, result, result.code == gpu_act.SENT, at, unit=scope,
                         reason='its SigIgn holds SIGTERM')
            if result.code == gpu_act.SENT:
                self.out['killed_at_once'].append({'pid': pid, 'at_s': at})
        if self.out['killed_at_once']:
            gpu_act.wait_for(lambda: not self._alive(), KILLED_S, clock=self.clock, max_interval=gpu_act.FAST_POLL_S)
            if not self._alive():
                # Every member is gone: systemd collects the empty scope, nothing is left to stop.
                self.out['stopped'] = True
                return
        at = self._at()
        result, _changed = gpu_family.stop_unit(self.actor, gpu_lever.unit_argv(gpu_owner.SYSTEM_MANAGER, 'stop', scope),
                                                gpu_owner.SYSTEM_MANAGER, scope, self.stop_timeout + 30)
        self._record('stop_scope', scope, result, True, at, round(self._at() - at, 3))
        # The stop's code (a gpu_say.Said), never its words. A scope whose last member died
        # meanwhile is gone before the stop: stopped all the same.
        self.out['stopped'] = result.code == gpu_lever.UNIT_STOPPED or not self._alive()
        if not self.out['stopped']:
            self._fail(gpu_lever.ADOPT_STOP_FAILED, scope=scope, result=result)

    def _finish(self):
        if not self.out['error']:
            gpu_act.wait_for(lambda: not self._alive(), LEFT_S, clock=self.clock, max_interval=gpu_act.FAST_POLL_S)
        self.out['left'] = self._alive()
        self.out['seconds'] = self._at()
        return self.out


class _Seen(object):
    """A process as adoption sees it: its ProcState and its owner."""

    __slots__ = ('info', 'owner', 'pid', 'start_time', 'kthread', 'state')

    def __init__(self, info, owner):
        self.info = info
        self.owner = owner
        self.pid = info.pid
        self.start_time = info.start_time
        self.kthread = info.kthread
        self.state = info.state


def _active(scope):
    """The scope's gpu_observe.UnitFacts once systemd reports it active."""
    facts = gpu_observe.unit_restart_policy(scope)
    return facts if facts.active == 'active' and facts.control_group else None
