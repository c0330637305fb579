"""One private lab per pytest-xdist worker (issue 31: the plain lab's tests over several node sets).

Worker gw0 keeps the caller's lab (LAB_STATE, LAB_RUN, LAB_ADDR_BASE and the second lab
LAB2_*, tests/lab/README.md). Worker gwK (K >= 1) gets a lab of its own: LAB_STATE and LAB_RUN
with "-wK" appended and the K-th base of LAB_WORKER_ADDR_BASES (space-separated), or by
default LAB_ADDR_BASE + 165 + 20 (K - 1): 175, 195, 215 for CI's base 10, clear of the bases
make test derives below 75 (base + 20, + 30, + 40, + 50). Its second lab is at its base + 10
(each lab here boots at most 2 nodes, the second lab 1), "2" appended to its paths. A worker
whose lab would not fit in 127.0.0.0/8 (the lab's last base, 254 - MAX_NODES) fails the run
naming the variable that sets it, before any node boots.

conftest.py applies this before any test module reads its lab's environment.
"""


# tests/lab/lib/gpuops_lab/paths.py: a base from 1 to 254 - MAX_NODES (20).
LAST_BASE = 234
SECOND_LAB_OFFSET = 10


class WorkerLabError(Exception):
    """The worker's lab cannot be derived; the message names the lever."""


def worker_index(worker_id):
    """gw3 -> 3; None outside xdist (no PYTEST_XDIST_WORKER)."""
    if not worker_id:
        return None
    if not worker_id.startswith("gw") or not worker_id[2:].isdigit():
        raise WorkerLabError(f"PYTEST_XDIST_WORKER is '{worker_id}', expected gwN")
    return int(worker_id[2:])


def worker_base(environ, index):
    """The LAB_ADDR_BASE of worker gw<index> (index >= 1)."""
    listed = environ.get("LAB_WORKER_ADDR_BASES", "").split()
    if listed:
        if index > len(listed):
            raise WorkerLabError(f"LAB_WORKER_ADDR_BASES '{environ['LAB_WORKER_ADDR_BASES']}' names "
                                 f"{len(listed)} bases, worker gw{index} needs {index}: add one or run fewer workers (-n)")
        raw = listed[index - 1]
        if not raw.isdigit():
            raise WorkerLabError(f"LAB_WORKER_ADDR_BASES: '{raw}' is not a whole number")
        base = int(raw)
    else:
        caller = environ.get("LAB_ADDR_BASE", "10")
        if not caller.isdigit():
            raise WorkerLabError(f"LAB_ADDR_BASE must be a whole number, got '{caller}'")
        base = int(caller) + 165 + 20 * (index - 1)
    if not 1 <= base <= LAST_BASE - SECOND_LAB_OFFSET:
        raise WorkerLabError(f"worker gw{index}'s lab would have base {base}, outside 1..{LAST_BASE - SECOND_LAB_OFFSET}: "
                             "set LAB_WORKER_ADDR_BASES (one base per worker after the first, 20 apart, "
                             "clear of every other lab's) or run fewer workers (-n)")
    return base


def worker_env(environ):
    """The variables to set for this process's worker ({} for gw0 or outside xdist)."""
    index = worker_index(environ.get("PYTEST_XDIST_WORKER"))
    if not index:
        return {}
    base = worker_base(environ, index)
    state = "%s-w%d" % (environ.get("LAB_STATE", "/var/lib/gpuops-lab"), index)
    run = "%s-w%d" % (environ.get("LAB_RUN", "/run/gpuops-lab"), index)
    return {"LAB_STATE": state, "LAB_RUN": run, "LAB_ADDR_BASE": str(base),
            "LAB2_STATE": state + "2", "LAB2_RUN": run + "2", "LAB2_ADDR_BASE": str(base + SECOND_LAB_OFFSET)}
