# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Respawns: which ancestors of the processes the ladder ends are watched, and what a new process
under one of them must be to count as that ancestor bringing a holder back.

How real servers come back (FIELD_NOTES, H200, third round): a supervisor loop (`while :; do
python3 worker.py; sleep 0.3; done`) has the new worker 0.3 s after the old one ended, but the
worker takes the GPU again only after about 4 s (with weights, minutes), and re-titles itself
(SGLang: `sglang::scheduler_TP0`) before that. Servers are often restarted one level up: a loop
restarts the launcher, whose scheduler holds the GPU. So a respawn is recognised by ancestry and
program, at any depth, never by a command line or a title (both are the user's to write): a
watched ancestor brought a holder back when a process that was not under it when the watch began
runs the program (the executable's device and inode, and whether it was forked without an exec)
of a process below it that has died since, or holds a GPU context.

Which ancestors are watched: every live one, walking up from each process the ladder ends, up to
but excluding the first that is PID 1, part of this module's own tree, a systemd manager or a
protected process; above such a one nothing is watched. One protected process is watched all the
same, and the walk ends with it: the init of a guest's or container's PID namespace that is no
systemd manager (a loop as a guest's init restarts its server as often as it is killed from the
host: measured in the lab, an LXC guest whose init was `while :; do server; sleep 0.3; done`
read free after one SIGTERM, and the server held the GPU again seconds later). It is never
signalled; the failure names its guest and the command that stops that. So is PID 1 when it is
no systemd manager (the same loop seen from inside the guest, the module run there through `pct
exec`: it read free, and the loop held the GPU again seconds later); with a systemd PID 1 (the
seeds' guests) the orphans of PID 1 are not read, and PID 1 once per run at most. Why those stop the walk: PID 1 and a
systemd manager restart what their units say, and units are stopped through systemd; this
module's tree and infrastructure (sshd, slurmstepd, a container's init) start new processes of
their own for reasons that are not a respawn (sshd forks and execs the user's shell at every
login), and none of them is ever signalled. A process the ladder itself ends is not watched (it
is ending) but the walk goes on above it. A login shell or the session that started a server by
hand is watched but never taken for a respawner unless it starts the ended program again after
it died: running other programs (`sleep`, `ls`, a forked copy of itself before its exec) is no
evidence.

What it costs: nothing for orphans of PID 1 (the seeds' hand-started servers) or processes
whose parent is this module's tree; otherwise polling the watched ancestors' descendants until
one brings a holder back or none is left alive, at most WATCH_S.

No I/O here: Watch reads the host through the reader it is given (gpu_survey.Surveyor), so tests
drive it with a written process table.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say

# After the GPUs read free, how long the live watched ancestors are watched. Measured: the new
# process of a restart loop exists 0.21-0.24 s (lab, `sleep 0.2` loops, bash and Python) and about
# 0.3 s (H200, `sleep 0.3` loop) after the old one ended; it is recognised as soon as it has
# exec'd the program, long before it takes the GPU (about 4 s on the H200). 3 s is ten times
# that, for loaded hosts and loops that wait a second or two; it is spent only while a watched
# ancestor lives.
WATCH_S = 3.0
# How far up the walk goes at most (a cycle or a runaway chain is not followed forever).
MAX_DEPTH = 64
# Where a systemd manager's program lives (root's files: no user can put a program there).
SYSTEMD_MANAGERS = ('/usr/lib/systemd/systemd', '/lib/systemd/systemd')

# Why the walk stops at an ancestor (it and everything above it are not watched).
INIT, OWN_TREE, SYSTEMD_MANAGER, PROTECTED = 'init', 'own-tree', 'systemd-manager', 'protected'
# A Link's `protected` for the init of a guest's or container's PID namespace: watched, never
# signalled, and nothing above it is watched.
NAMESPACE_INIT = 'namespace-init'

# The program a process runs: its executable's path, (device, inode), and whether it was forked
# and has not exec'd since (PF_FORKNOEXEC: a fork of a shell before it execs `sleep` runs the
# shell's program, but is no new program).
Program = collections.namedtuple('Program', 'path dev ino forked')
# One process as the watch needs it; `program` None when it may not be read (another user's
# process, without root), `protected` None when not asked.
Link = collections.namedtuple('Link', 'pid ppid start_time program protected')


def _path(path):
    suffix = ' (deleted)'
    return path[:-len(suffix)] if path.endswith(suffix) else path


def same_program(one, other):
    """Whether two processes run the same program: the same executable file (device and inode;
    or the same path, for a program replaced on disk since), both exec'd or both forks not
    exec'd since."""
    if one is None or other is None or one.forked != other.forked:
        return False
    return (one.dev, one.ino) == (other.dev, other.ino) or _path(one.path) == _path(other.path)


def systemd_manager(program):
    """Whether a program (a Program) is a systemd manager's."""
    return _path(program.path) in SYSTEMD_MANAGERS


def boundary(link, own_tree):
    """Why the walk up from an ended process stops at this ancestor, or None (see the module's
    doc for why each stops it)."""
    if link.pid <= 1:
        return INIT
    if link.pid in own_tree:
        return OWN_TREE
    if link.program is not None and _path(link.program.path) in SYSTEMD_MANAGERS:
        return SYSTEMD_MANAGER
    if link.protected and link.protected != NAMESPACE_INIT:
        return PROTECTED
    return None


def kinship(depth):
    """What a respawner is to the process it brought back, in words (gpu_say.kinship; kept for
    the test that calls it here)."""
    return say.kinship(depth)


class Entry(object):
    """One watched ancestor: what it was when the watch began and what below it was ended."""

    def __init__(self, link, known, since):
        self.pid = link.pid
        self.start_time = link.start_time
        self.known = known            # pid -> start time of its descendants when the watch began
        self.below = {}               # pid -> Link of the processes between it and what was ended
        self.ended = []               # the ended PIDs it is an ancestor of
        self.depth = None             # the fewest levels between it and an ended process
        self.since = since


class Watch(object):
    """The watched ancestors of what the ladder ends. `reader` answers link(pid) (a Link, with
    `protected`), peek(pid) (a Link without), identity(pid) (gpu_observe.Identity or None),
    descendants(pid) ({pid: ppid}, parents first) and own_ancestors; link and peek raise
    gpu_observe.ProcError for a process that is gone or may not be read."""

    def __init__(self, reader, clock, proc_error):
        self.reader = reader
        self.clock = clock
        self.proc_error = proc_error
        self.entries = {}
        self.init_respawns = None

    # --- the watch --------------------------------------------------------------------------

    def add(self, targets):
        """Before `targets` (gpu_holder.Holder records) are ended: watch the live ancestors of each."""
        ending = set(t.pid for t in targets)
        own_tree = self.reader.own_ancestors
        # Each ancestor read once per call, not once per target below it: 24 ranks under one
        # launcher read it 24 times (with gpu_family_supervisor's recognise_all the same: first
        # signal at 34 ms instead of 52, bench/run reclaim --shape ranks).
        links = {}
        for target in targets:
            parent = target.ppid
            if not parent or parent < 1 or parent in own_tree or (parent == 1 and not self._init_respawns()):
                continue   # an orphan of a systemd PID 1 (the seeds) or the module's own child: nothing to read
            try:
                first = self.reader.peek(target.pid)
            except self.proc_error:
                continue
            if first.start_time != target.start_time:
                continue
            chain, pid = [first], first.ppid
            while len(chain) <= MAX_DEPTH and pid > 1 and pid not in own_tree:
                if pid not in links:
                    try:
                        links[pid] = self.reader.link(pid)
                    except self.proc_error:
                        links[pid] = None
                link = links[pid]
                if link is None:
                    break
                if boundary(link, own_tree):
                    break
                if pid not in ending:
                    self._watch(link, chain, target.pid)
                if link.protected == NAMESPACE_INIT:
                    break
                chain.append(link)
                pid = link.ppid
            else:
                if pid == 1 and self._init_respawns():
                    self._watch_init(chain, target.pid)

    def _init_respawns(self):
        """Whether PID 1 is watched: the reader's init_respawns() says it is no systemd manager (a
        loop as the init of the guest or container this runs in). Asked once per Watch."""
        if self.init_respawns is None:
            self.init_respawns = bool(self.reader.init_respawns())
        return self.init_respawns

    def _watch_init(self, chain, ended_pid):
        try:
            self._watch(self.reader.link(1), chain, ended_pid)
        except self.proc_error:
            pass

    def _watch(self, link, chain, ended_pid):
        entry = self.entries.get(link.pid)
        if entry is None or entry.start_time != link.start_time:
            known = {}
            for pid in self.reader.descendants(link.pid):
                identity = self.reader.identity(pid)
                if identity is not None:
                    known[pid] = identity.start_time
            entry = self.entries[link.pid] = Entry(link, known, self.clock())
        entry.below.update((member.pid, member) for member in chain)
        if ended_pid not in entry.ended:
            entry.ended.append(ended_pid)
        entry.depth = min(entry.depth or len(chain), len(chain))

    def _alive(self, pid, start_time):
        identity = self.reader.identity(pid)
        return identity is not None and identity.start_time == start_time and identity.state != 'zombie'

    def watched(self):
        """The watched ancestors still alive (the others are dropped), in PID order."""
        for pid, entry in list(self.entries.items()):
            if not self._alive(pid, entry.start_time):
                del self.entries[pid]
        return sorted(self.entries)

    def pop(self, pid):
        return self.entries.pop(pid)

    # --- evidence ---------------------------------------------------------------------------

    def poll(self, holder_pids=frozenset()):
        """{watched PID: [new PIDs]} for each live watched ancestor that brought a holder back: a
        process under it that was not there when the watch began and runs the program of a
        process below it that has died since, or holds a GPU context (`holder_pids`). A new
        process counts for its nearest live watched ancestor only."""
        live = self.watched()
        parent_of = {}
        for pid in live:
            parent_of.update(self.reader.descendants(pid))
        dead = {}
        found = {}
        for pid in parent_of:
            if pid in self.entries:
                continue
            nearest = parent_of[pid]
            while nearest not in self.entries and nearest in parent_of:
                nearest = parent_of[nearest]
            entry = self.entries.get(nearest)
            if entry is None:
                continue
            try:
                link = self.reader.peek(pid)
            except self.proc_error:
                continue
            if entry.known.get(pid) == link.start_time:
                continue
            if nearest not in dead:
                dead[nearest] = [m.program for m in entry.below.values()
                                 if not self._alive(m.pid, m.start_time)]
            if pid in holder_pids or any(same_program(link.program, p) for p in dead[nearest]):
                found.setdefault(nearest, []).append(pid)
        return found

    def new_descendants(self, entry):
        """The PIDs under a watched ancestor that were not there when its watch began, parents
        before their children."""
        new = []
        for pid in self.reader.descendants(entry.pid):
            identity = self.reader.identity(pid)
            if identity is not None and entry.known.get(pid) != identity.start_time:
                new.append(pid)
        return new


class Comebacks(object):
    """Everything that can bring a holder back, and what the ladder knows of each, in one place
    (gpu_lever's watches):

    - a unit's Restart= (WATCH_UNIT): its lever stops the unit; `units` are the ones stopped;
    - a container's restart policy (WATCH_CONTAINER): its lever stops the container, once a run;
      `containers` are the (runtime, id) stopped;
    - a watched ancestor (WATCH_PARENT): `parents` (Watch) from before the ladder ends targets;
      one that brought a holder back is frozen (`frozen`, let go with SIGCONT if not ended) and it
      and what it started become `next_targets`, or, when its lever is refused, it is named
      (`respawners`);
    - the settle window: once the GPUs read free, `parents` are watched up to WATCH_S;
    - a supervisor's autorestart (WATCH_SUPERVISOR): its lever stops the program through the
      supervisor, and gpu_act watches its status stay down; `supervised` are the programs stopped
      (gpu_supervisor.key), never twice;
    - a guest's own systemd (WATCH_GUEST): `guest_units` ((guest cgroup, unit)) were seen
      restarting what was killed from the host: never signalled again, named instead.
    """

    def __init__(self, reader, clock, proc_error):
        self.units = set()
        self.containers = set()
        self.supervised = set()
        self.parents = Watch(reader, clock, proc_error)
        self.frozen = {}          # (pid, start_time) -> respawner or new process of one it SIGSTOPped (its Holder)
        self.frozen_respawners = set()  # (pid, start_time) of the respawners themselves among them
        self.next_targets = []    # respawners (and their new processes) to end next
        self.respawners = []      # respawning ancestors this run may not end (gpu_holder.Left): the failure names them
        self.guest_units = set()  # (guest cgroup, unit) seen restarting what was killed
        self.guest_pending = set()  # (guest cgroup, unit) of holders killed, not yet watched

    def take_next_targets(self):
        targets, self.next_targets = self.next_targets, []
        return targets
