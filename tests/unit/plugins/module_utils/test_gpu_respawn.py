"""gpu_respawn's rules: which ancestors are watched, what counts as bringing a holder back, and
to which watched ancestor it counts; driven through a written process table."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_respawn as respawn
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_observe import Identity, ProcError, ProcessGone

from .holders import make_holder


def program(name, forked=False, inode=None):
    return respawn.Program('/usr/bin/' + name, 2049, inode if inode is not None else sum(map(ord, name)), forked)


class Table(object):
    """A process table the Watch reads: pid -> [ppid, start time, program, protected]."""

    own_ancestors = frozenset([900, 901])

    def __init__(self, rows):
        self.rows = dict((pid, list(row)) for pid, row in rows.items())
        self.reads = 0

    def identity(self, pid):
        return Identity(self.rows[pid][1], 'sleeping') if pid in self.rows else None

    @staticmethod
    def init_respawns():
        return False     # PID 1 is a systemd manager, as gpu_flow.Surveyor.init_respawns reads it

    def peek(self, pid):
        self.reads += 1
        if pid not in self.rows:
            raise ProcessGone(pid, 'stat')
        ppid, start, prog, _protected = self.rows[pid]
        return respawn.Link(pid, ppid, start, prog, None)

    def link(self, pid):
        return self.peek(pid)._replace(protected=self.rows[pid][3])

    def descendants(self, pid):
        found, queue = {}, [pid]
        while queue:
            parent = queue.pop(0)
            for child in sorted(p for p, row in self.rows.items() if row[0] == parent):
                found[child] = parent
                queue.append(child)
        return found


def target(pid, table):
    return make_holder(pid=pid, ppid=table.rows[pid][0], start_time=table.rows[pid][1])


def watch(table, *pids):
    w = respawn.Watch(table, lambda: 0.0, ProcError)
    w.add([target(pid, table) for pid in pids])
    return w


def test_same_program_is_the_same_file_and_the_same_exec_state():
    py = program('python3')
    assert respawn.same_program(py, program('python3'))
    assert not respawn.same_program(py, program('python3', forked=True)), 'a fork before its exec'
    assert not respawn.same_program(py, program('bash'))
    assert not respawn.same_program(py, None) and not respawn.same_program(None, None)
    upgraded = respawn.Program('/usr/bin/python3 (deleted)', 2049, 1, False)
    assert respawn.same_program(upgraded, py), 'a program replaced on disk since is the same path'


@pytest.mark.parametrize('link,why', [
    (respawn.Link(1, 0, 1, program('systemd'), False), respawn.INIT),
    (respawn.Link(900, 1, 5, program('sshd'), False), respawn.OWN_TREE),
    (respawn.Link(300, 1, 5, respawn.Program('/usr/lib/systemd/systemd', 1, 2, False), False),
     respawn.SYSTEMD_MANAGER),
    (respawn.Link(301, 1, 5, program('sshd'), True), respawn.PROTECTED),
    (respawn.Link(302, 1, 5, program('bash'), False), None),
    (respawn.Link(303, 1, 5, None, False), None),
])
def test_the_walk_stops_at_init_the_own_tree_a_systemd_manager_and_a_protected_process(link, why):
    assert respawn.boundary(link, Table.own_ancestors) == why


def test_a_user_program_named_systemd_is_no_systemd_manager():
    assert respawn.boundary(respawn.Link(304, 1, 5, respawn.Program('/home/u/systemd', 1, 3, False), False),
                            Table.own_ancestors) is None


def test_every_live_ancestor_below_the_first_boundary_is_watched_but_not_the_ended_ones():
    table = Table({70: [1, 70, program('sshd'), True], 60: [70, 60, program('bash'), False],
                   50: [60, 50, program('bash'), False], 40: [50, 40, program('launcher'), False],
                   10: [40, 10, program('python3'), False]})
    w = watch(table, 10, 40)
    assert w.watched() == [50, 60], 'the launcher is ended too; sshd is protected: the walk stops there'
    assert w.entries[50].depth == 1 and w.entries[60].depth == 2
    assert sorted(w.entries[60].below) == [10, 40, 50]


def test_ranks_under_one_launcher_read_each_ancestor_once():
    # 24 ranks of one launcher (a bash under sshd): the launcher and the bash are each read once
    # for all of them, and watched as they were when read per rank.
    rows = {70: [1, 70, program('sshd'), True], 60: [70, 60, program('bash'), False],
            40: [60, 40, program('launcher'), False]}
    rows.update((100 + i, [40, 100 + i, program('python3'), False]) for i in range(24))
    table = Table(rows)
    linked = []
    real_link = table.link
    table.link = lambda pid: linked.append(pid) or real_link(pid)
    w = watch(table, *range(100, 124))
    assert sorted(linked) == [40, 60, 70], linked
    assert w.watched() == [40, 60]
    assert sorted(w.entries[40].ended) == list(range(100, 124)) and w.entries[40].depth == 1
    assert w.entries[60].depth == 2


def test_a_guests_init_that_is_no_systemd_is_watched_and_nothing_above_it():
    """A loop as a guest's init (seen from the host, its PID is no 1): watched, and the walk ends
    there, so the guest's monitor above it is not."""
    table = Table({30: [1, 30, program('lxc-start'), False],
                   31: [30, 31, program('sh'), respawn.NAMESPACE_INIT],
                   10: [31, 10, program('python3'), False]})
    w = watch(table, 10)
    assert w.watched() == [31]
    del table.rows[10]
    table.rows[11] = [31, 111, program('python3'), False]
    assert w.poll() == {31: [11]}
    assert respawn.boundary(respawn.Link(31, 30, 31, program('sh'), respawn.NAMESPACE_INIT), Table.own_ancestors) is None
    systemd_init = respawn.Link(32, 30, 32, respawn.Program('/lib/systemd/systemd', 1, 2, False), respawn.NAMESPACE_INIT)
    assert respawn.boundary(systemd_init, Table.own_ancestors) == respawn.SYSTEMD_MANAGER, \
        'a guest whose init is systemd restarts its units: never watched (the seeds pay nothing)'


class LoopInitTable(Table):
    """A guest or container seen from inside, whose PID 1 is a loop (no systemd manager)."""

    def __init__(self, rows, loop=True):
        super(LoopInitTable, self).__init__(rows)
        self.loop = loop
        self.asked = 0

    def init_respawns(self):
        self.asked += 1
        return self.loop


def test_pid_1_that_is_no_systemd_is_watched_at_any_depth_and_asked_once():
    table = LoopInitTable({1: [0, 1, program('sh'), True], 40: [1, 40, program('launcher'), False],
                           10: [40, 10, program('python3'), False], 11: [1, 11, program('python3'), False]})
    w = watch(table, 10, 11)
    assert w.watched() == [1, 40] and table.asked == 1
    assert sorted(w.entries[1].ended) == [10, 11]
    del table.rows[11]
    table.rows[12] = [1, 112, program('python3'), False]      # the loop starts the server again
    assert w.poll() == {1: [12]}


def test_an_orphan_of_a_systemd_pid_1_is_not_read():
    table = LoopInitTable({10: [1, 10, program('python3'), False]}, loop=False)
    w = watch(table, 10)
    assert w.watched() == [] and table.reads == 0 and table.asked == 1


def test_an_orphan_of_pid_1_or_a_child_of_the_module_is_not_even_read():
    table = Table({10: [1, 10, program('python3'), False], 11: [901, 11, program('python3'), False]})
    w = watch(table, 10, 11)
    assert w.watched() == [] and table.reads == 0


def test_a_new_process_counts_for_its_nearest_watched_ancestor_and_only_with_evidence():
    table = Table({50: [1, 50, program('bash'), False], 40: [50, 40, program('launcher'), False],
                   10: [40, 10, program('python3'), False], 20: [50, 20, program('sleep'), False]})
    w = watch(table, 10)
    assert w.watched() == [40, 50]
    del table.rows[10]                                        # the ended worker is gone
    table.rows[11] = [40, 111, program('python3'), False]      # the live launcher starts another
    table.rows[21] = [50, 121, program('sleep'), False]        # the loop runs `sleep` again
    table.rows[22] = [50, 122, program('bash', forked=True), False]   # a fork of the loop, before exec
    assert w.poll() == {40: [11]}, 'nearest: the launcher, not the loop above it'


def test_the_loop_above_a_launcher_that_died_is_the_respawner_of_the_new_launcher():
    table = Table({50: [1, 50, program('bash'), False], 40: [50, 40, program('bash'), False],
                   10: [40, 10, program('python3'), False]})
    w = watch(table, 10)
    del table.rows[10]
    assert w.poll() == {}, 'the launcher lives and started nothing'
    del table.rows[40]
    table.rows[41] = [50, 141, program('bash'), False]       # a new launcher: bash, exec'd
    assert w.poll() == {50: [41]}
    assert w.new_descendants(w.entries[50]) == [41]


def test_a_program_of_a_process_still_alive_is_no_evidence_and_a_reused_pid_is_new():
    table = Table({60: [1, 60, program('bash'), False], 61: [60, 61, program('bash'), False],
                   10: [61, 10, program('python3'), False]})
    w = watch(table, 10)
    table.rows[62] = [60, 162, program('bash'), False]       # another shell; the login shell 61 lives
    assert w.poll() == {}
    del table.rows[10]
    table.rows[62] = [60, 162, program('python3'), False]
    assert w.poll() == {60: [62]}
    w = watch(Table({60: [1, 60, program('bash'), False], 10: [60, 10, program('python3'), False],
                     12: [60, 12, program('python3'), False]}), 10)
    del w.reader.rows[10]
    assert w.poll() == {}, 'PID 12 was there before the watch'
    w.reader.rows[12][1] = 512                              # PID 12 reused by a new process
    assert w.poll() == {60: [12]}


def test_a_new_holder_of_a_context_counts_whatever_it_runs():
    table = Table({50: [1, 50, program('bash'), False], 10: [50, 10, program('python3'), False]})
    w = watch(table, 10)
    table.rows[13] = [50, 113, program('other'), False]
    assert w.poll() == {} and w.poll(holder_pids={13}) == {50: [13]}


def test_the_watch_drops_an_ancestor_that_exited_or_whose_pid_was_reused():
    table = Table({50: [1, 50, program('bash'), False], 51: [1, 51, program('bash'), False],
                   10: [50, 10, program('python3'), False], 11: [51, 11, program('python3'), False]})
    w = watch(table, 10, 11)
    assert w.watched() == [50, 51]
    del table.rows[50]
    table.rows[51][1] = 999
    assert w.watched() == [] and w.poll() == {}


def test_kinship_in_words():
    assert [respawn.kinship(d) for d in (1, 2, 3)] == ['parent', 'grandparent', 'ancestor 3 levels up']
