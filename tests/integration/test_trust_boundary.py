"""The trust boundary, on a lab node with a real unprivileged user: what alice controls (the
names of the cgroups in her delegated subtree, her process titles, a PID namespace she makes)
never chooses what root stops and never shields her GPU holder.

alice (uid 1000) is made in the node with useradd and `loginctl enable-linger`, so her user
manager (user@1000.service, Delegate=yes) runs and owns her subtree in both hierarchies a
lab node has (name=systemd and the v2 one: the nodes run systemd's hybrid layout). Her
holder is a real `fakegpu hold` started by her own manager (`systemd-run --user --scope`,
through its private socket, as her) and moved by her, with her own rights, into a directory
she made. gpu_reclaim then runs as root over SSH, as the fleet runs it.
"""

import shlex

import pytest

from . import scenarios as sc

FQCN = "gpuops.reclaim.gpu_reclaim"
FAST = {"term_timeout": 1.5, "release_timeout": 5, "nvml_timeout": 5}
ALICE, ALICE_UID = "alice", 1000
# A command run as alice, with what her systemctl needs to find her manager's private socket.
AS_ALICE = ("setpriv --reuid=%d --regid=%d --init-groups env HOME=/home/%s XDG_RUNTIME_DIR=/run/user/%d"
            % (ALICE_UID, ALICE_UID, ALICE, ALICE_UID))
SUBTREE = "user.slice/user-%d.slice/user@%d.service" % (ALICE_UID, ALICE_UID)
HIERARCHIES = ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified")
READY = sc.READY_DIR + "/alice"
SCOPE = "gpuops-a-"
CID = "9408f0bbe98e121b565cc3d4090a128d9894b03676992794f62c58c6a037b74b"
POD_UID = "74c13223_5a00_11e9_b385_42010a80018d"
GLOB = set("*?[]")


def reclaim(lab, node, check_mode=False, **args):
    result = lab.module(node, FQCN, dict(FAST, **args), check_mode=check_mode)
    assert not result.get("failed"), result.get("msg", result)
    return result


def steps(result, step):
    return [a for a in result["actions"] if a["step"] == step]


def as_alice(lab, node, cmd, check=True):
    return lab.exec(node, "%s sh -c %s" % (AS_ALICE, shlex.quote(cmd)), check=check)


def hierarchies(lab, node):
    """The cgroup hierarchies of the node that systemd delegates to alice (mounted ones)."""
    out = lab.exec(node, "for h in %s; do [ -d $h/%s ] && echo $h; done; true"
                   % (" ".join(HIERARCHIES), SUBTREE)).stdout.split()
    return out


@pytest.fixture
def alice(lab, node):
    """alice with a running user manager and a delegated subtree she can write, the stand-in
    GPUs usable by every user (as a real driver's are); her scopes and directories removed
    after the test."""
    lab.exec(node, "id -u %s >/dev/null 2>&1 || useradd -m -u %d %s; "
                   "systemctl reset-failed user@%d.service user-runtime-dir@%d.service >/dev/null 2>&1; "
                   "loginctl enable-linger %s" % (ALICE, ALICE_UID, ALICE, ALICE_UID, ALICE_UID, ALICE))
    try:
        sc.wait_until(lab, node, "systemctl is-active -q user@%d.service && [ -S /run/user/%d/systemd/private ]"
                      % (ALICE_UID, ALICE_UID), "alice's user manager running")
    except AssertionError as failed:
        said = lab.exec(node, "systemctl status --no-pager -n 20 user@%d.service user-runtime-dir@%d.service; "
                              "loginctl show-user %d; true" % (ALICE_UID, ALICE_UID, ALICE_UID), check=False)
        raise AssertionError("%s\n%s%s" % (failed, said.stdout, said.stderr))
    state = as_alice(lab, node, "systemctl --user is-system-running", check=False).stdout.strip()
    assert state in ("running", "degraded"), "alice's manager answers %r" % state
    found = hierarchies(lab, node)
    assert found, "no delegated subtree of alice in %s" % (HIERARCHIES,)
    for top in found:
        owner = lab.exec(node, "stat -c %%u %s/%s" % (top, SUBTREE)).stdout.strip()
        assert owner == str(ALICE_UID), "%s/%s is not alice's (owner %s)" % (top, SUBTREE, owner)
    # A real driver lets every user make a context; the stand-in keeps its bookkeeping here.
    lab.exec(node, "chmod 1777 /var/lib/fakegpu/alloc /var/lib/fakegpu/dead; mkdir -p %s; "
                   "chown %s %s" % (READY, ALICE, READY))
    made = []
    yield {"hierarchies": found, "made": made}
    as_alice(lab, node, "for s in $(systemctl --user list-units --all --plain --no-legend '%s*' "
                        "| awk '{print $1}'); do systemctl --user kill -s KILL \"$s\"; "
                        "systemctl --user stop \"$s\"; done; true" % SCOPE, check=False)
    as_alice(lab, node, "systemctl --user reset-failed >/dev/null 2>&1; true", check=False)
    for path in reversed(made):
        # A holder left where alice moved it (the module failed to end it) is no scope's.
        quoted = shlex.quote(path + "/cgroup.procs")
        lab.exec(node, "[ -f %s ] && for p in $(cat %s); do kill -9 $p; done; true" % (quoted, quoted))
        sc.wait_until(lab, node, "rmdir %s 2>/dev/null || [ ! -d %s ]" % (shlex.quote(path), shlex.quote(path)),
                      "alice's cgroup %s removed" % path)


def alice_holds(lab, node, name, gpu, mib, title=None, wrap=""):
    """alice's `fakegpu hold` in a scope of her own manager; returns (PID, start time) as the
    node's root sees it."""
    title = title or "gpuops-a-%s" % name
    ready = "%s/%s.json" % (READY, name)
    lab.exec(node, "rm -f %s" % ready)
    hold = "fakegpu hold --gpu %d:%d --title %s --ready-file %s" % (gpu, mib, shlex.quote(title), ready)
    lab.exec(node, "setsid -f %s systemd-run --user --scope --quiet --collect --unit=%s%s -- %s %s "
                   ">/dev/null 2>&1 </dev/null" % (AS_ALICE, SCOPE, name, wrap, hold))
    sc.wait_until(lab, node, "[ -s %s ]" % ready, "alice's holder %s ready" % name)
    if wrap:
        # In its own PID namespace the record holds the inner PID 1: find it from outside.
        pid = int(lab.exec(node, "pgrep -u %s -x %s" % (ALICE, shlex.quote(title[:15]))).stdout.split()[0])
    else:
        pid = sc.read_json(lab, node, ready)["pid"]
    return pid, sc.identity(lab, node, pid)[0]


def alice_moves(lab, node, env, pid, *components):
    """alice makes app.slice/<components...> in her subtree, in each delegated hierarchy, and
    moves her process there, with her own rights."""
    for top in env["hierarchies"]:
        path = "%s/%s/app.slice" % (top, SUBTREE)
        for part in components:
            path = "%s/%s" % (path, part)
            if path not in env["made"]:
                env["made"].append(path)
        as_alice(lab, node, "mkdir -p %s && echo %d > %s/cgroup.procs"
                 % (shlex.quote(path), pid, shlex.quote(path)))
    text = lab.exec(node, "cat /proc/%d/cgroup" % pid).stdout
    assert "/" + "/".join(components) in text, text
    return text


def assert_freed(lab, node, result, gpu, pid, start):
    holder = [h for h in result["holders"] if h["pid"] == pid]
    assert holder and holder[0]["protected"] is False, holder
    assert not sc.alive(lab, node, pid, start), "alice's holder PID %d survived" % pid
    assert result["free"] is True, result.get("msg")
    assert sc.gpu_used_mib(lab, node, gpu) == 0


def test_alice_cannot_make_root_stop_a_system_unit_by_naming_her_cgroup(lab, node, alice):
    lab.exec(node, "systemctl stop victim.service 2>/dev/null; systemctl reset-failed victim.service "
                   "2>/dev/null; systemd-run --quiet --unit=victim -- sleep infinity")
    try:
        main = lab.exec(node, "systemctl show -p MainPID --value victim.service").stdout.strip()
        pid, start = alice_holds(lab, node, "victim", 6, 700)
        alice_moves(lab, node, alice, pid, "victim.service")

        result = reclaim(lab, node, gpus=["6"])

        assert lab.exec(node, "systemctl is-active victim.service", check=False).stdout.strip() == "active"
        assert lab.exec(node, "systemctl show -p MainPID --value victim.service").stdout.strip() == main
        assert not [a for a in steps(result, "stop_unit") if a["target"] == "victim.service"], result["actions"]
        holder = [h for h in result["holders"] if h["pid"] == pid][0]
        assert holder["unit"] is None and holder["owner"]["kind"] == "user"
        assert (holder["owner"]["controlled_by"], holder["owner"]["uid"]) == ("user", ALICE_UID)
        # Her manager has no victim.service owning that cgroup: nothing to stop through it either.
        assert steps(result, "stop_user_unit") == []
        assert_freed(lab, node, result, 6, pid, start)
    finally:
        lab.exec(node, "systemctl stop victim.service; systemctl reset-failed victim.service 2>/dev/null; true")


def test_a_glob_named_cgroup_never_reaches_systemctl(lab, node, alice):
    pid, start = alice_holds(lab, node, "glob", 5, 600)
    alice_moves(lab, node, alice, pid, "*.service")

    planned = reclaim(lab, node, check_mode=True, gpus=["5"])

    assert not [a for a in planned["actions"] if GLOB & set(str(a.get("target")) + str(a.get("unit")))], \
        planned["actions"]
    assert steps(planned, "stop_unit") == [] and steps(planned, "stop_user_unit") == []
    assert [a["pid"] for a in steps(planned, "sigterm")] == [pid]

    result = reclaim(lab, node, gpus=["5"])

    assert not [a for a in result["actions"] if GLOB & set(str(a.get("target")) + str(a.get("unit")))]
    assert_freed(lab, node, result, 5, pid, start)


def test_a_docker_scope_name_in_her_subtree_plans_no_docker_stop(lab, node, alice):
    pid, start = alice_holds(lab, node, "docker", 4, 600)
    alice_moves(lab, node, alice, pid, "docker-%s.scope" % CID)

    planned = reclaim(lab, node, check_mode=True, gpus=["4"])

    assert steps(planned, "stop_container") == [], planned["actions"]
    holder = [h for h in planned["holders"] if h["pid"] == pid][0]
    assert holder["owner"]["kind"] == "user" and holder["owner"]["id"] is None

    result = reclaim(lab, node, gpus=["4"])

    assert steps(result, "stop_container") == []
    assert_freed(lab, node, result, 4, pid, start)


def test_a_pod_slice_name_in_her_subtree_shields_nothing(lab, node, alice):
    pid, start = alice_holds(lab, node, "pod", 3, 600)
    alice_moves(lab, node, alice, pid, "kubepods.slice", "kubepods-besteffort.slice",
                "kubepods-besteffort-pod%s.slice" % POD_UID)

    result = reclaim(lab, node, gpus=["3"])

    assert_freed(lab, node, result, 3, pid, start)
    assert [a["pid"] for a in steps(result, "sigterm")] == [pid]


def test_titling_her_holder_sshd_shields_nothing(lab, node, alice):
    pid, start = alice_holds(lab, node, "sshd", 2, 600, title="sshd")
    assert lab.exec(node, "cat /proc/%d/comm" % pid).stdout.strip() == "sshd"
    assert lab.exec(node, "tr '\\0' ' ' </proc/%d/cmdline" % pid).stdout.split()[0] == "sshd"

    result = reclaim(lab, node, gpus=["2"])

    assert_freed(lab, node, result, 2, pid, start)


def test_her_own_pid_namespace_init_shields_nothing(lab, node, alice):
    pid, start = alice_holds(lab, node, "userns", 1, 600, wrap="unshare -Urpf --mount-proc")
    status = lab.exec(node, "grep -E '^(NSpid|Uid)' /proc/%d/status" % pid).stdout
    assert status.split("NSpid:")[1].split()[-1] == "1", status      # PID 1 of its namespace
    assert status.split("Uid:")[1].split()[0] == str(ALICE_UID), status

    result = reclaim(lab, node, gpus=["1"])

    holder = [h for h in result["holders"] if h["pid"] == pid][0]
    assert holder["other_pid_namespace"] is True
    assert_freed(lab, node, result, 1, pid, start)


def test_her_own_restarting_service_is_stopped_through_her_manager(lab, node, alice):
    # A real unit of alice's manager with Restart=always: killing it brings it back, so it is
    # stopped, as her, through her own manager; never through the system manager.
    ready = "%s/svc.json" % READY
    lab.exec(node, "rm -f %s" % ready)
    as_alice(lab, node, "systemd-run --user --quiet --unit=%ssvc -p Restart=always -p RestartSec=100ms -- "
                        "/usr/bin/env fakegpu hold --gpu 7:800 --ready-file %s" % (SCOPE, ready))
    sc.wait_until(lab, node, "[ -s %s ]" % ready, "alice's service ready")
    pid = sc.read_json(lab, node, ready)["pid"]
    start = sc.identity(lab, node, pid)[0]

    result = reclaim(lab, node, gpus=["7"])

    stops = steps(result, "stop_user_unit")
    assert [(a["target"], a["uid"], a["changed"]) for a in stops] == [("%ssvc.service" % SCOPE, ALICE_UID, True)]
    assert steps(result, "stop_unit") == []
    assert as_alice(lab, node, "systemctl --user is-active %ssvc.service" % SCOPE,
                    check=False).stdout.strip() in ("inactive", "failed")
    assert result["free"] is True, result.get("msg")
    assert sc.gpu_used_mib(lab, node, 7) == 0
    assert not sc.alive(lab, node, pid, start)
