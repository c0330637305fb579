"""roles/reclaim_timer on a lab node: the timer fires, the playbook runs on the node itself
(ansible-playbook against localhost with a local connection, as ansible-pull runs it) and
frees a wedged host; a run that finds the host lock taken changes nothing, says so and leaves
the unit failed (a monitor sees it) while the timer keeps firing; an unprivileged user, alice,
holding the old lock path in /run/lock cannot make runs skip (issue 22).

The node gets ansible-core from this controller's venv (same Debian 12 Python) and the
collection as it is in this checkout, under /usr/share/ansible/collections.
"""

import glob
import json
import os
import shlex
import subprocess
import tarfile
import tempfile
import time

import pytest

from . import scenarios as sc
from .conftest import REPO, VENV_BIN, ansible_env

ANSIBLE_LIB = "/opt/gpuops-test-ansible"
NODE_BIN = ANSIBLE_LIB + "/bin"
COLLECTION = "/usr/share/ansible/collections/ansible_collections/gpuops/reclaim"
LOCK = "/run/gpuops/reclaim-run.lock"
OLD_LOCK = "/run/lock/gpuops-reclaim-run.lock"      # world-writable: before issue 22
SUMMARY = "/var/lib/gpuops-reclaim/last-run.json"
METRICS = "/var/lib/prometheus/node-exporter/gpuops_reclaim.prom"   # reclaim_metrics_dir's default
# Packages ansible-core needs at run time (its Requires-Dist less cryptography, which only
# vault and some connection plugins import).
# ansible-core reads their versions from the *.dist-info metadata.
PACKAGES = ("ansible", "ansible_core-*.dist-info", "jinja2", "jinja2-*.dist-info", "markupsafe",
            "markupsafe-*.dist-info", "yaml", "[Pp]y[Yy][Aa][Mm][Ll]-*.dist-info", "packaging",
            "packaging-*.dist-info", "resolvelib", "resolvelib-*.dist-info")
COLLECTION_PARTS = ("galaxy.yml", "meta", "plugins", "roles", "playbooks")
RUN_BOUND_S = 240        # a timer run on this shared 2-core machine: bound, not expectation


def site_packages():
    found = glob.glob(os.path.join(os.path.dirname(VENV_BIN), "lib", "python3*", "site-packages"))
    assert found, "no site-packages under %s" % os.path.dirname(VENV_BIN)
    return found[0]


def ship(lab, node, members, dest):
    """Copy (path in archive -> local path) to dest on the node through unarchive."""
    with tempfile.TemporaryDirectory(prefix="timer-test-") as tmp:
        archive = os.path.join(tmp, "payload.tar.gz")
        with tarfile.open(archive, "w:gz") as tar:
            for name, path in members:
                tar.add(path, arcname=name, filter=lambda t: None if "__pycache__" in t.name else t)
        lab.exec(node, "mkdir -p %s" % dest)
        result = lab.module(node, "ansible.builtin.unarchive", {"src": archive, "dest": dest})
        assert not result.get("failed"), result


def install_ansible_and_collection(lab, node):
    site = site_packages()
    members = []
    for pattern in PACKAGES:
        paths = glob.glob(os.path.join(site, pattern))
        assert paths, "%s not found in %s" % (pattern, site)
        members += [(os.path.join("lib", os.path.basename(p)), p) for p in paths]
    ship(lab, node, members, ANSIBLE_LIB)
    wrappers = " && ".join(
        "printf '#!/bin/sh\\nPYTHONPATH=%s/lib exec /usr/bin/python3 -m ansible %s \"$@\"\\n' >%s/ansible-%s "
        "&& chmod 755 %s/ansible-%s" % (ANSIBLE_LIB, cli, NODE_BIN, cli, NODE_BIN, cli)
        for cli in ("playbook", "pull"))
    lab.exec(node, "mkdir -p %s && %s" % (NODE_BIN, wrappers))
    ship(lab, node, [(part, os.path.join(REPO, part)) for part in COLLECTION_PARTS], COLLECTION)


def apply_timer(lab, node, **role_vars):
    with tempfile.TemporaryDirectory(prefix="timer-play-") as tmp:
        play = os.path.join(tmp, "play.json")
        with open(play, "w") as f:
            json.dump([{"hosts": node, "gather_facts": False,
                        "roles": [dict({"role": "gpuops.reclaim.reclaim_timer"}, **role_vars)]}], f)
        run = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", lab.inventory, play],
                             env=ansible_env(), capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def wedge(lab, node, name):
    """Two orphaned TP ranks (parent SIGKILLed) and a holder that ignores SIGTERM."""
    server = sc.hold(lab, node, name, "--child", "0:30000:sglang::scheduler_TP0", "--child",
                     "1:30000:sglang::scheduler_TP1", "--title", "python3 -m sglang.launch_server --tp 2")
    sc.kill9_and_wait_reaped(lab, node, server["pid"])
    stuck = sc.hold(lab, node, name + "-term", "--gpu", "2:6000", "--ignore-term", "--title", "run_inference")
    return server["processes"] + [{"pid": stuck["pid"], "start_time": stuck["start_time"]}]


def journal(lab, node, since_cursor=None, until=None, timeout=10):
    """The service's journal since the cursor. With `until`: once that text is in it, or as it
    is after `timeout` s. journald reads the service's output stream apart from PID 1's own
    messages: "Finished gpuops-reclaim.service" can be in the journal before the run's last
    line is, so a run that has just ended is read until its line is there."""
    cmd = "journalctl -u gpuops-reclaim.service --no-pager -o cat"
    if since_cursor:
        cmd += " --after-cursor=%s" % shlex.quote(since_cursor)
    deadline = time.monotonic() + timeout
    while True:
        log = lab.exec(node, cmd).stdout
        if until is None or until in log or time.monotonic() > deadline:
            return log
        time.sleep(0.2)


def cursor(lab, node):
    return lab.exec(node, "journalctl -n 0 --show-cursor --no-pager | sed -n 's/^-- cursor: //p'").stdout.strip()


@pytest.fixture
def timer_node(lab, node):
    install_ansible_and_collection(lab, node)
    yield node
    lab.exec(node, "systemctl disable --now gpuops-reclaim.timer; systemctl stop gpuops-reclaim.service; "
                   "rm -f /etc/systemd/system/gpuops-reclaim.* /usr/local/sbin/gpuops-reclaim-run %s %s; "
                   "systemctl reset-failed gpuops-reclaim.service; systemctl daemon-reload; pkill -f 'flock %s' || true"
                   % (SUMMARY, METRICS, LOCK), check=False)


def test_timer_fires_and_frees_a_wedged_host_and_a_locked_run_changes_nothing(lab, timer_node):
    node = timer_node
    holders = wedge(lab, node, "timer-a")
    sc.start_in_scope(lab, node, "monitor", "sh -c 'exec sleep 600 3</dev/nvidiactl'")
    # start_in_scope returns before the scope's process runs: wait for it rather than guess.
    sc.wait_until(lab, node, "pgrep -xf 'sleep 600' >/dev/null", "the monitor up")
    monitor_pid = lab.exec(node, "pgrep -xf 'sleep 600'").stdout.split()[0]
    # Earlier tests' playbook runs on this node left their metrics: this run must write its own.
    lab.exec(node, "rm -f %s" % METRICS)
    start = cursor(lab, node)

    # Install and let the timer (not a person) start the first run, 3 s after install.
    apply_timer(lab, node, reclaim_timer_ansible_bin=NODE_BIN, reclaim_timer_first_run="3s",
                reclaim_timer_interval="1h", reclaim_timer_randomized_delay="0",
                reclaim_timer_extra_args=["-e", "gpus_free_term_timeout=2"])
    sc.wait_until(lab, node, "[ \"$(systemctl show gpuops-reclaim.service -p ExecMainExitTimestampMonotonic --value)\" "
                             "-gt 0 ] && ! systemctl is-active -q gpuops-reclaim.service",
                  "first timer run finished", timeout=RUN_BOUND_S)
    log = journal(lab, node, start, until="PLAY RECAP")
    result = lab.exec(node, "systemctl show gpuops-reclaim.service -p Result -p ExecMainStatus").stdout
    assert "Result=success" in result and "ExecMainStatus=0" in result, result + log
    assert "PLAY RECAP" in log and "GPUs reclaimed" in log, log
    for index in (0, 1, 2):
        assert sc.gpu_used_mib(lab, node, index) == 0, log
    for proc in holders:
        assert not sc.alive(lab, node, proc["pid"], proc["start_time"]), proc
    assert lab.exec(node, "kill -0 %s" % monitor_pid, check=False).returncode == 0, "the monitor was killed"
    summary = sc.read_json(lab, node, SUMMARY)
    assert summary["hosts"]["localhost"]["status"] == "ok", summary
    assert summary["hosts"]["localhost"]["changed"] is True, summary
    # The timer's run wrote its metrics for node_exporter too (issue 33), with the timer's
    # interval (1h, no randomized delay) for the rule that sees runs stop.
    metrics = dict(line.rsplit(" ", 1) for line in lab.exec(node, "cat %s" % METRICS).stdout.splitlines()
                   if line and not line.startswith("#"))
    assert metrics["gpuops_reclaim_timer_interval_seconds"] == "3600", metrics
    assert metrics["gpuops_reclaim_last_run_success"] == "1", metrics
    assert metrics['gpuops_reclaim_runs_total{result="ok"}'] == "1", metrics
    assert int(metrics['gpuops_reclaim_ended_total{lever="signal"}']) >= 1, metrics
    timer = lab.exec(node, "systemctl is-enabled gpuops-reclaim.timer; systemctl is-active gpuops-reclaim.timer").stdout
    assert timer.split() == ["enabled", "active"], timer

    assert lab.exec(node, "stat -c '%U %a' /run/gpuops").stdout.split() == ["root", "700"]

    # Another root run holds the host lock: a run started now skips and changes nothing, and the
    # unit ends failed (exit 75, not counted as success), which `systemctl --failed` and
    # node_exporter's systemd collector show; the timer still has its next run scheduled.
    held = wedge(lab, node, "timer-b")
    sc.start_in_scope(lab, node, "lock", "flock %s sleep 600" % LOCK)
    sc.wait_until(lab, node, "! flock --nonblock %s true" % LOCK, "lock taken by the test")
    start = cursor(lab, node)
    started = lab.exec(node, "systemctl start gpuops-reclaim.service", check=False, timeout=RUN_BOUND_S)
    assert started.returncode != 0, "a skipped run must not pass for a successful one"
    log = journal(lab, node, start, until="another run holds %s: skipped" % LOCK)
    assert "another run holds %s: skipped" % LOCK in log, log
    assert "PLAY RECAP" not in log, log
    state = lab.exec(node, "systemctl show gpuops-reclaim.service -p Result -p ExecMainStatus").stdout
    assert "Result=exit-code" in state and "ExecMainStatus=75" in state, state
    assert lab.exec(node, "systemctl is-failed gpuops-reclaim.service", check=False).stdout.strip() == "failed"
    assert "gpuops-reclaim.service" in lab.exec(node, "systemctl --failed --no-legend --plain").stdout
    timer = lab.exec(node, "systemctl is-active gpuops-reclaim.timer; "
                           "systemctl show gpuops-reclaim.timer -p NextElapseUSecMonotonic --value").stdout.split()
    assert timer[0] == "active" and timer[1] not in ("0", "infinity", ""), timer
    for proc in held:
        assert sc.alive(lab, node, proc["pid"], proc["start_time"]), "a locked-out run signalled %s" % proc

    # Lock released: the next run converges, and the unit is no longer failed.
    lab.exec(node, "systemctl stop gpuops-t-lock.scope")
    lab.exec(node, "systemctl start gpuops-reclaim.service", timeout=RUN_BOUND_S)
    for proc in held:
        assert not sc.alive(lab, node, proc["pid"], proc["start_time"]), proc
    assert sc.gpu_used_mib(lab, node, 2) == 0
    assert "Result=success" in lab.exec(node, "systemctl show gpuops-reclaim.service -p Result").stdout
    assert lab.exec(node, "systemctl is-failed gpuops-reclaim.service", check=False).stdout.strip() != "failed"


def test_alice_holding_the_old_lock_paths_cannot_make_the_timer_skip(lab, timer_node, alice):
    node = timer_node
    apply_timer(lab, node, reclaim_timer_ansible_bin=NODE_BIN, reclaim_timer_first_run="1h",
                reclaim_timer_interval="1h", reclaim_timer_randomized_delay="0",
                reclaim_timer_extra_args=["-e", "gpus_free_term_timeout=2"])
    held = wedge(lab, node, "timer-c")
    # Both locks' old homes are world-writable: she holds them for ever.
    for path in (OLD_LOCK, "/run/lock/gpuops-gpu-reclaim.lock"):
        alice.exec("setsid -f flock %s sleep 600 </dev/null >/dev/null 2>&1" % path)
        sc.wait_until(lab, node, "ino=$(stat -c %%i %s 2>/dev/null) && grep -q \":$ino \" /proc/locks" % path,
                      "alice holds %s" % path)
    tried = alice.exec("flock -n %s true" % LOCK, check=False)
    assert tried.returncode != 0 and ("Permission denied" in tried.stderr or "No such file" in tried.stderr), tried

    start = cursor(lab, node)
    lab.exec(node, "systemctl start gpuops-reclaim.service", timeout=RUN_BOUND_S)
    log = journal(lab, node, start, until="PLAY RECAP")
    assert "another run holds" not in log, log
    assert "PLAY RECAP" in log and "GPUs reclaimed" in log, log
    assert "Result=success" in lab.exec(node, "systemctl show gpuops-reclaim.service -p Result").stdout
    for proc in held:
        assert not sc.alive(lab, node, proc["pid"], proc["start_time"]), proc
