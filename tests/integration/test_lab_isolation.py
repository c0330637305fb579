"""Private labs beside each other, and what `lab up` refuses before booting anything.

The second lab of the two-labs test uses LAB2_STATE / LAB2_RUN / LAB2_ADDR_BASE, by default
this session's LAB_STATE and LAB_RUN with "2" appended and LAB_ADDR_BASE + 20, so that
it never shares a path or an address with the session's lab.
"""

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from .conftest import LAB, REPO

sys.path.insert(0, os.path.join(REPO, "tests", "lab", "lib"))

from gpuops_lab import preflight  # noqa: E402  pylint: disable=wrong-import-position

STATE = os.environ.get("LAB_STATE", "/var/lib/gpuops-lab")
RUN = os.environ.get("LAB_RUN", "/run/gpuops-lab")
ADDR_BASE = int(os.environ.get("LAB_ADDR_BASE", "10"))
LAB2 = {
    "LAB_STATE": os.environ.get("LAB2_STATE", STATE + "2"),
    "LAB_RUN": os.environ.get("LAB2_RUN", RUN + "2"),
    "LAB_ADDR_BASE": os.environ.get("LAB2_ADDR_BASE", str(ADDR_BASE + 20)),
}
# `lab up` waits up to 120 s for a node's SSH: a refusal must come long before that.
REFUSAL_TIMEOUT = 60


def run_lab(*args, env=None, timeout=600):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([LAB, *args], env=full_env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout, check=False)


def status(env=None):
    """`lab status` as {node: (address, state)}."""
    rows = {}
    for line in run_lab("status", env=env).stdout.splitlines():
        cols = line.split("\t")
        if len(cols) >= 4:
            rows[cols[0]] = (cols[1], cols[3])
    return rows


def leaders(run_dir):
    found = {}
    records = os.path.join(run_dir, "nodes")
    for entry in sorted(os.listdir(records)) if os.path.isdir(records) else []:
        if entry.endswith(".json"):
            with open(os.path.join(records, entry)) as f:
                found[entry] = f.read()
    return found


def systemd_cgroups(run_dir):
    """{node: (the cgroups of its PID 1 in the hierarchies systemd uses, the node's cgroup
    directories on the controller)} from the lab's records."""
    found = {}
    for text in leaders(run_dir).values():
        record = json.loads(text)
        with open(f"/proc/{record['leader_pid']}/cgroup") as f:
            lines = [line.strip() for line in f if ":name=systemd:" in line or line.startswith("0::")]
        found[record["name"]] = (lines, record.get("cgroups", []))
    return found


def test_two_labs_up_at_once_and_one_down_leaves_the_other_answering(lab):
    first = status()
    assert first and all(row[1] == "answers" for row in first.values()), first
    first_records = leaders(RUN)
    try:
        up = run_lab("up", "1", env=LAB2)
        assert up.returncode == 0, up.stderr
        second = status(LAB2)
        assert second == {"node1": (f"127.0.0.{int(LAB2['LAB_ADDR_BASE']) + 1}", "answers")}
        # Booting the second lab touched nothing of the first.
        assert leaders(RUN) == first_records
        assert status() == first
        # Every node's systemd has a cgroup tree of its own, named after its machine: a shared
        # one (every nspawn of the controller put its node in /payload) let one node's systemd
        # remove the cgroup of a unit another node was starting.
        first_cgroups, second_cgroups = systemd_cgroups(RUN), systemd_cgroups(LAB2["LAB_RUN"])
        every = [(ADDR_BASE, name, lines, dirs) for name, (lines, dirs) in first_cgroups.items()]
        every += [(int(LAB2["LAB_ADDR_BASE"]), name, lines, dirs) for name, (lines, dirs) in second_cgroups.items()]
        for base, name, lines, dirs in every:
            assert lines and all(f"/gpuops{base}-{name}/payload/" in line for line in lines), (name, lines)
            assert dirs and all(os.path.isdir(d) and d.endswith(f"/gpuops{base}-{name}") for d in dirs), (name, dirs)
        all_lines = [line for _base, _name, lines, _dirs in every for line in lines]
        assert len(all_lines) == len(set(all_lines)), all_lines

        down = run_lab("down", env=LAB2)
        assert down.returncode == 0, down.stderr
        assert "stopped node1" in down.stderr
        assert status(LAB2) == {}
        assert os.listdir(os.path.join(LAB2["LAB_STATE"], "nodes")) == []
        assert not [d for _lines, dirs in second_cgroups.values() for d in dirs if os.path.exists(d)]
        assert systemd_cgroups(RUN) == first_cgroups
        # The first lab's nodes are the same processes as before and still answer SSH.
        assert leaders(RUN) == first_records
        assert status() == first
        for node in lab.nodes:
            assert lab.exec(node, "systemctl is-system-running --wait").stdout.strip() == "running"
    finally:
        run_lab("down", env=LAB2)


def _in_own_network(script, env):
    """Run a bash script in a new network namespace (loopback up): a listener there takes
    port 22 from nothing outside the test."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("needs unshare and ip (util-linux, iproute2: make host-deps)")
    return subprocess.run(["unshare", "--net", "bash", "-euc", "ip link set lo up\n" + script],
                          env=dict(os.environ, **env), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=REFUSAL_TIMEOUT, check=False)


LISTEN_THEN_UP = r"""
python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 22)); s.listen(); open(sys.argv[2], "w").write("ready"); time.sleep(600)
' "$LISTEN_ON" "$LAB_RUN.ready" &
listener=$!
for _ in $(seq 100); do [ -s "$LAB_RUN.ready" ] && break; sleep 0.05; done
echo "listener pid $listener"
rc=0; "$LAB_CLI" up 1 || rc=$?
kill "$listener"
exit $rc
"""


@pytest.mark.parametrize("listen_on, says", [
    ("0.0.0.0", r"pid (\d+) \(.*python3 -c .*\) listens on 0\.0\.0\.0:22.*ListenAddress"),
    ("node1", r"127\.0\.0\.\d+:22 is already taken by pid (\d+) .*LAB_ADDR_BASE"),
])
def test_up_refuses_a_port_22_taken_from_its_nodes_naming_the_listener(listen_on, says):
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    with tempfile.TemporaryDirectory(prefix="gpuops-lab-refusal-") as tmp:
        env = {"LAB_STATE": os.path.join(tmp, "state"), "LAB_RUN": os.path.join(tmp, "run"),
               "LAB_ADDR_BASE": str(ADDR_BASE), "LAB_CLI": LAB,
               "LISTEN_ON": f"127.0.0.{ADDR_BASE + 1}" if listen_on == "node1" else listen_on}
        result = _in_own_network(LISTEN_THEN_UP, env)
        assert result.returncode == 1, result.stdout + result.stderr
        match = re.search(says, result.stderr)
        assert match, result.stderr
        assert f"listener pid {match.group(1)}" in result.stdout
        assert "nothing was started" in result.stderr
        assert not os.path.exists(os.path.join(tmp, "state", "nodes"))


def test_inotify_count_sees_each_instance_this_process_opens():
    if os.geteuid() != 0:
        pytest.skip("counts root's instances; run as root")
    libc = ctypes.CDLL(None, use_errno=True)
    before = preflight.inotify_in_use(0).get(os.getpid(), 0)
    fds = [libc.inotify_init1(os.O_CLOEXEC) for attempt in range(3)]
    try:
        assert all(fd >= 0 for fd in fds), ctypes.get_errno()
        assert preflight.inotify_in_use(0).get(os.getpid(), 0) == before + 3
    finally:
        for fd in fds:
            os.close(fd)
    assert preflight.inotify_in_use(0).get(os.getpid(), 0) == before


def test_inotify_shortfall_refuses_only_what_does_not_fit_and_names_the_lever():
    per = preflight.INOTIFY_PER_NODE
    assert preflight.inotify_shortfall(limit=128, used=128 - 2 * per, nodes=2) is None
    message = preflight.inotify_shortfall(limit=128, used=100, nodes=3)
    assert "100 of its 128 inotify instances" in message
    assert f"{3 * per} more" in message
    assert "sysctl -w fs.inotify.max_user_instances=" in message
    assert "nothing was started" in message


def test_a_boot_failure_from_inotify_exhaustion_is_explained():
    console = "Failed to create inotify object: Too many open files\nFailed to allocate manager object"
    assert "fs.inotify.max_user_instances" in preflight.inotify_hint(console)
    assert preflight.inotify_hint("Welcome to Debian GNU/Linux 12") == ""


def test_no_test_demo_or_scenario_hard_codes_a_lab_address():
    """Lab addresses depend on LAB_ADDR_BASE: they come from the lab (inventory, records).
    The lab itself (tests/lab) is where they are made; documentation may show examples."""
    pattern = re.compile(r"127\.0\.0\.(?!1\b|0/)\d+|127\.0\.0\.\$\(\(")
    offenders = []
    for top in ("tests", "extensions", "playbooks", "Makefile"):
        for root, dirs, files in os.walk(os.path.join(REPO, top)) if top != "Makefile" else [(REPO, [], ["Makefile"])]:
            dirs[:] = [d for d in dirs if d not in ("build", "reports", "__pycache__", "output")
                       and os.path.join(root, d) != os.path.join(REPO, "tests", "lab")]
            for name in files:
                path = os.path.join(root, name)
                if path == os.path.abspath(__file__) or name.endswith(".md"):
                    continue
                try:
                    with open(path, encoding="utf-8") as f:
                        text = f.read()
                except (UnicodeDecodeError, OSError):
                    continue
                offenders += [f"{os.path.relpath(path, REPO)}: {m.group(0)}" for m in pattern.finditer(text)]
    assert offenders == []
