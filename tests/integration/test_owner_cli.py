"""An owner's CLI that is missing, hangs or refuses (issue 19 item 6, first bullet), on a
LAB_RUNTIMES=1 node: supervisorctl for a supervisord program, docker's CLI for a docker
container, each holding a GPU with automatic restart on.

The faults are real ones: the binary moved away; the daemon SIGSTOPped, so the CLI blocks on its
socket (supervisord, dockerd: the containers and programs keep running); the daemon's socket
moved away, so the CLI exits with its own error ("unix:///var/run/supervisor.sock no such
file", rc 4; "Cannot connect to the Docker daemon", rc 1). Each is undone in a finally.

Each run must fail within the module's own bound (the CLI is asked with nvml_timeout; the
reason names it), name the CLI and the command to run by hand, and signal nothing: no action
changed the host, and the holder, the other program, the supervisor and the container are the
very processes they were.
"""

import re

import pytest

from . import scenarios as sc
from . import test_docker as dk
from . import test_supervisors as ts

FAST = {"term_timeout": 1.5, "release_timeout": 5, "nvml_timeout": 4}
MOVED = ".gpuops-t-moved"
FAULTS = {
    # fault -> (the reason code, what the reason says)
    "missing": ("cli_missing", r"is not on PATH here"),
    "hanging": ("cli_timeout", r"did not answer within %.1fs" % FAST["nvml_timeout"]),
    "refusing": ("cli_failed", r"failed \(rc=[1-9]"),
}


def fault_script(fault, binary, socket, main_pid):
    """(do, undo) shell lines for a fault of the CLI `binary` talking to `socket` of the daemon
    `main_pid`."""
    if fault == "missing":
        return "mv %s %s%s" % (binary, binary, MOVED), "[ -e %s%s ] && mv %s%s %s; true" % (
            binary, MOVED, binary, MOVED, binary)
    if fault == "hanging":
        return "kill -STOP %d" % main_pid, "kill -CONT %d; true" % main_pid
    return "mv %s %s%s" % (socket, socket, MOVED), "[ -e %s%s ] && mv %s%s %s; true" % (
        socket, MOVED, socket, MOVED, socket)


def left_alone(result, pid):
    """The remaining entry of `pid`; asserts the run failed having changed nothing."""
    assert result.get("failed") is True, result
    assert not [a for a in result["actions"] if a["changed"]], result["actions"]
    entries = [r for r in result["remaining"] if r["pid"] == pid]
    assert entries, result["remaining"]
    return entries[0]


def reclaim_under_fault(lab, node, fault, cli, daemon, gpu, holder, others):
    """Read the identities of `holder` and `others` (PIDs), put `fault` on the CLI `cli`
    ((binary, socket)) of the daemon `daemon`, run gpu_reclaim on `gpu` and undo the fault
    (always). Asserts the run failed having changed nothing, `holder` left with the fault's
    reason code and words. Returns (result, the holder's remaining entry, the identities)."""
    identities = dict((pid, sc.identity(lab, node, pid)[0]) for pid in (holder,) + tuple(others))
    do, undo = fault_script(fault, cli[0], cli[1], daemon)
    try:
        lab.exec(node, do)
        result = lab.module(node, "gpuops.reclaim.gpu_reclaim", dict(FAST, gpus=[gpu]))
    finally:
        lab.exec(node, undo)
    code, said = FAULTS[fault]
    entry = left_alone(result, holder)
    assert entry["reason_code"] == code, entry
    assert re.search(said, entry["reason"]), entry["reason"]
    return result, entry, identities


@pytest.fixture
def supervisord(lab, runtimes_node):
    node, supervisor = runtimes_node, ts.SUPERVISORS["supervisord"]
    ts.reset(lab, node)
    supervisor.start(lab, node, 5, 1200)
    holder = ts.wait_program(lab, node, supervisor, ts.HOLDER)
    ts.wait_held(lab, node, 5, 1200)
    bystander = ts.wait_program(lab, node, supervisor, ts.BYSTANDER)
    yield node, supervisor, holder, bystander
    ts.reset(lab, node)


runtimes_node = ts.runtimes_node


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_supervisorctl_missing_hanging_or_refusing_fails_in_bound_signalling_nothing(lab, supervisord, fault):
    node, supervisor, holder, bystander = supervisord
    _state, main_pid = ts.unit_main_pid(lab, node, supervisor.unit)
    result, entry, identities = reclaim_under_fault(
        lab, node, fault, ("/usr/bin/supervisorctl", "/run/supervisor.sock"), main_pid, "5", holder,
        (bystander, main_pid))
    assert entry["owner"]["kind"] == "supervisor" and entry["owner"]["runtime"] == "supervisord"
    # The CLI, the command to run by hand, and where the program's name is found.
    assert "supervisorctl" in entry["reason"]
    assert "`supervisorctl -c /etc/supervisor/supervisord.conf stop " in result["msg"], result["msg"]
    assert "supervisorctl -c /etc/supervisor/supervisord.conf status" in result["msg"], result["msg"]
    # Nothing signalled: the same processes, the unit active, both programs running as before.
    for pid, start_time in identities.items():
        assert sc.alive(lab, node, pid, start_time), pid
    assert ts.unit_main_pid(lab, node, supervisor.unit) == ("active", main_pid)
    assert supervisor.pid(lab, node, ts.HOLDER) == holder
    assert supervisor.pid(lab, node, ts.BYSTANDER) == bystander


@pytest.fixture(scope="module")
def docker_systemd(lab):
    """The last node with dockerd on the systemd cgroup driver and the lab's image."""
    name = lab.nodes[-1]
    tools = lab.status().get(name, {}).get("tools", [])
    if "docker" not in tools or "fakegpu" not in tools:
        pytest.skip("the lab nodes have no docker or no stand-in driver: run with LAB_RUNTIMES=1 after "
                    "`tests/lab/lab down` (tests/lab/README.md, 'Runtime nodes')")
    dk.set_cgroup_driver(lab, name, "systemd")
    image = lab.exec(name, dk.IMPORT_IMAGE, timeout=300).stdout.strip().splitlines()[-1]
    return name, image


@pytest.fixture
def container(lab, docker_systemd):
    """(node, container id, holder PID): a --restart=always container whose PID 1 holds GPU 2."""
    node, image = docker_systemd
    dk.end_container(lab, node)
    sc.cleanup(lab, node)
    cid = dk.run_container(lab, node, image, 2, 900)
    pid, _start = dk.holder_pid(lab, node, cid)
    yield node, cid, pid
    dk.end_container(lab, node)
    sc.cleanup(lab, node)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_docker_cli_missing_hanging_or_refusing_fails_in_bound_signalling_nothing(lab, container, fault):
    node, cid, holder = container
    dockerd = int(lab.exec(node, "systemctl show -p MainPID --value docker.service").stdout)
    result, entry, identities = reclaim_under_fault(
        lab, node, fault, ("/usr/bin/docker", "/run/docker.sock"), dockerd, "2", holder, (dockerd,))
    assert entry["owner"]["kind"] == "container" and entry["owner"]["id"] == cid
    assert "docker" in entry["reason"]
    assert "`docker stop -t 10 -- %s`" % cid in result["msg"], result["msg"]
    for pid, start_time in identities.items():
        assert sc.alive(lab, node, pid, start_time), pid
    # The container never stopped or restarted: running, no restart, the same init.
    assert dk.container_state(lab, node) == ("running", 0, holder)
