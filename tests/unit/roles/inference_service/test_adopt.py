"""roles/inference_service/files/adopt.py's identity rules (issue 22 item 5): a start time for
every root or nothing is adopted; only numbers on its command line; a scope member that is
no pinned process (or a child of one) stops the stop. The move and stop through systemd run
in the lab (tests/integration/test_security.py, Molecule's adopt scenario)."""

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "inference_service", "files",
                      "adopt.py")


def load():
    spec = importlib.util.spec_from_file_location("adopt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


adopt = load()


def run(*args):
    proc = subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True, text=True, timeout=30,
                          check=True)
    return json.loads(proc.stdout)


def test_a_root_without_a_start_time_is_refused_naming_it_and_nothing_is_adopted():
    child = subprocess.Popen(["sleep", "60"])
    try:
        start = adopt.stat_of(child.pid)[1]
        out = run("sglang-adopted", "5", "%d:%d" % (child.pid, start), "%d:none" % os.getpid(), "4242:")
        assert out["error"].startswith("no start time was recorded for PID %d, 4242 when it was found" % os.getpid())
        assert "nothing was adopted or stopped" in out["error"]
        assert out["scope"] is None and out["procs"] == [] and not out["stopped"]
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("word", ["x:1", "-1:5", "1 2:3", "", "12;rm -rf /:3"])
def test_anything_but_pid_colon_number_is_refused(word):
    out = run("s", "5", word)
    assert out["error"].startswith("adopt.py: bad root %r: expected PID:START_TIME" % word), out["error"]
    assert out["scope"] is None


def test_parse_roots():
    assert adopt.parse_roots(["12:345", "13:none", "14:"]) == [(12, 345), (13, None), (14, None)]


def test_a_scope_member_that_is_no_live_pinned_process_nor_its_child_is_a_stranger():
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '60']); "
                               "time.sleep(60)"])
    other = subprocess.Popen(["sleep", "60"])
    kid = None
    try:
        deadline = time.monotonic() + 10
        while not adopt.children_map().get(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        (kid,) = adopt.children_map()[parent.pid]
        fd_parent, fd_dead = os.pidfd_open(parent.pid), os.pidfd_open(other.pid)
        other.kill()
        other.wait()                # pinned, then ended: its number may now be anyone's
        pinned = {parent.pid: (0, fd_parent), other.pid: (0, fd_dead)}
        assert adopt.strangers([parent.pid, kid], pinned) == []
        assert adopt.strangers([parent.pid, kid, os.getpid()], pinned) == [os.getpid()]
        assert adopt.strangers([other.pid], pinned) == [other.pid]
        os.close(fd_parent)
        os.close(fd_dead)
    finally:
        if kid:
            os.kill(kid, 9)
        for proc in (parent, other):
            proc.kill()
            proc.wait()
