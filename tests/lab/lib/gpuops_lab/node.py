"""One lab node's life: overlay tree, systemd-nspawn boot, readiness, shutdown, cleanup."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time

from . import payload, paths, proc, ssh


# Where a node with docker sees the lab's base tree (read-only), to import images from.
BASE_IN_NODE = "/opt/gpuops-lab-base"
# Where it has a directory on the controller's disk (not an overlayfs) for docker and LXC.
DISK_IN_NODE = "/var/lib/gpuops-lab-disk"


class LabError(Exception):
    """A failure the user must see as one clear line (exit status 1)."""


def load_records():
    """Records of nodes this lab started, sorted by index."""
    records = []
    if os.path.isdir(paths.RECORDS_DIR):
        for entry in os.listdir(paths.RECORDS_DIR):
            if entry.endswith(".json"):
                with open(os.path.join(paths.RECORDS_DIR, entry)) as f:
                    records.append(json.load(f))
    return sorted(records, key=lambda r: r["index"])


def is_running(record):
    return proc.alive(record.get("leader_pid")) and proc.start_time(record["leader_pid"]) == record.get("leader_start")


def _save_record(record):
    os.makedirs(paths.RECORDS_DIR, exist_ok=True)
    tmp = paths.record_path(record["name"]) + ".new"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, paths.record_path(record["name"]))


def prepare(index, gpus):
    """Mount a fresh overlay over the cached base and fill in this node's files."""
    name = paths.node_name(index)
    top = paths.node_dir(name)
    if proc.mounts_under(top):
        raise LabError(f"{top} still has mounts from an earlier run; run 'lab down' first")
    shutil.rmtree(top, ignore_errors=True)
    upper, work, root = (os.path.join(top, d) for d in ("upper", "work", "root"))
    for d in (upper, work, root):
        os.makedirs(d)
    # The base is a link that build-base moves to a new tree on a rebuild: mount the tree
    # itself, so the mount names the tree it uses and build-base keeps that tree while it is.
    lower = os.path.realpath(paths.BASE)
    if paths.LAYER:
        lower = f"{paths.LAYER[0]}:{lower}"
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}", root],
        check=True,
    )
    ip = paths.node_ip(index)
    payload.write_identity(root, name, ip, gpus)
    installed = payload.install_tools(root)
    if paths.LAYER:
        installed.extend(paths.LAYER[2])
    return {"name": name, "index": index, "ip": ip, "gpus": gpus, "root": root, "tools": installed}


def node_cgroups(name):
    """The node's own cgroup in each hierarchy systemd uses, below the lab command's.

    With --keep-unit, nspawn puts the container in <its own cgroup>/payload: nodes started
    from one cgroup would all share one tree (/payload/system.slice/ssh.service held every
    node's sshd), and one node's systemd, stopping, would remove the cgroup of a unit another
    node was starting (that unit fails with 219/CGROUP). Each node starts nspawn in a cgroup
    named after its machine instead."""
    machine = paths.machine_name(name)
    return [os.path.join(mount, path.lstrip("/"), machine) for mount, path in proc.systemd_cgroups()]


def _enter_cgroups(dirs):
    """For preexec_fn: move the new process (nspawn, before it execs) into dirs."""
    def enter():
        for path in dirs:
            fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
    return enter


def remove_cgroups(dirs):
    """Remove a stopped node's cgroups, deepest first (what its systemd left); raise LabError
    naming one that still holds processes."""
    for top in dirs:
        if paths.node_from_machine(os.path.basename(top)) is None:
            continue   # never anything but a cgroup named after one of this lab's nodes
        # Bottom-up, top last: a cgroup directory can be removed once its children are.
        for path, _subdirs, _files in os.walk(top, topdown=False):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise LabError(f"cannot remove the node's cgroup {path}: {e.strerror} (processes left in it?)") from None


def boot(record):
    """Start systemd-nspawn in the background, in the node's own cgroups, and record its
    container's PID 1."""
    log_path = os.path.join(paths.node_dir(record["name"]), "console.log")
    cgroups = node_cgroups(record["name"])
    remove_cgroups(cgroups)   # a previous boot's, if a stop was cut short
    for path in cgroups:
        os.makedirs(path)
    record["cgroups"] = cgroups
    argv = [
        "systemd-nspawn", "--boot", "--quiet",
        f"--machine={paths.machine_name(record['name'])}", f"--directory={record['root']}",
        # machined is not running on the controller (PID 1 is not systemd): the lab
        # tracks its nodes itself.
        "--register=no", "--keep-unit",
        "--console=read-only", "--link-journal=no", "--timezone=off", "--resolv-conf=off",
        "--kill-signal=SIGRTMIN+4",
    ]
    env = dict(os.environ)
    if paths.LAYER_TOOLS.intersection(record["tools"]):
        # On the controller's hybrid cgroup layout nspawn gives a node read-only v1
        # controllers, where no container runtime can make a container's cgroup; a v2 tree
        # of its own (without controllers) is enough for podman and docker.
        env["SYSTEMD_NSPAWN_UNIFIED_HIERARCHY"] = "1"
        # runc guards a container's devices with a cgroup eBPF program: nspawn's seccomp
        # filter refuses bpf(2) unless allowed.
        argv.append("--system-call-filter=bpf")
    if "docker" in record["tools"]:
        # The base tree, read-only, for images made offline in the node (`docker import`):
        # the tree the node's overlay already keeps mounted, so build-base keeps it too.
        argv.append(f"--bind-ro={os.path.realpath(paths.BASE)}:{BASE_IN_NODE}")
        # A directory on the controller's own file system, beside the node's layer, for
        # docker's data (daemon.json's data-root) and LXC guests' trees: overlay mounts work
        # there (the node's / is an overlayfs, which cannot be an overlay's upper layer; docker
        # would need vfs, which copies the whole image for every container: 27 s for the
        # base tree here).
        disk = os.path.join(paths.node_dir(record["name"]), "disk")
        os.makedirs(disk, exist_ok=True)
        argv.append(f"--bind={disk}:{DISK_IN_NODE}")
        # dockerd brings the loopback up in the network namespace of every sandbox, the
        # host's too (--network host): without CAP_NET_ADMIN each `docker run` fails with
        # "failed to create default sandbox: operation not permitted". daemon.json keeps it
        # off the controller's network otherwise (no bridge, iptables, forwarding).
        argv.append("--capability=CAP_NET_ADMIN")
        # runc joins a new session keyring for each container (docker has no setting for
        # runc's --no-new-keyring, podman's keyring = false): nspawn's filter refuses keyctl
        # and add_key unless allowed ("unable to join session keyring").
        argv.append("--system-call-filter=keyctl add_key request_key")
    with open(log_path, "ab") as log:
        try:
            nspawn = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                      env=env, preexec_fn=_enter_cgroups(cgroups))
        except subprocess.SubprocessError as e:
            remove_cgroups(cgroups)
            raise LabError(f"{record['name']}: cannot start systemd-nspawn in its cgroups {', '.join(cgroups)}: {e}") from None
    record.update(nspawn_pid=nspawn.pid, log=log_path)
    leader = _wait_for_leader(nspawn, log_path)
    record.update(leader_pid=leader, leader_start=proc.start_time(leader),
                  pid_ns=proc.namespace(leader, "pid"), mnt_ns=proc.namespace(leader, "mnt"),
                  started=time.time())
    _save_record(record)


def _wait_for_leader(nspawn, log_path, timeout=30):
    own_ns = proc.namespace(os.getpid(), "pid")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if nspawn.poll() is not None:
            raise LabError(f"systemd-nspawn exited with {nspawn.returncode} before the node booted:\n{_tail(log_path)}")
        for child in proc.children(nspawn.pid):
            ns = proc.namespace(child, "pid")
            if ns and ns != own_ns and proc.cmdline(child)[:1] != ["systemd-nspawn"]:
                return child
        time.sleep(0.05)
    raise LabError(f"systemd-nspawn (pid {nspawn.pid}) started no container within {timeout} s:\n{_tail(log_path)}")


def _tail(path, lines=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _port_open(ip, port=22):
    try:
        with socket.create_connection((ip, port), timeout=1):
            return True
    except OSError:
        return False


def wait_ready(record, timeout=120):
    """Return once the node answers SSH and, with the stand-in installed, has its devices."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_running(record):
            raise LabError(f"{record['name']} stopped while booting:\n{_tail(record['log'])}")
        if _port_open(record["ip"]) and ssh.answers(record["ip"]):
            break
        time.sleep(0.2)
    else:
        raise LabError(f"{record['name']} did not answer SSH on {record['ip']}:22 within {timeout} s:\n{_tail(record['log'])}")
    if "fakegpu" in record["tools"]:
        check = subprocess.run(
            ssh.ssh_argv(record["ip"], "test -f /dev/nvidiactl && test -f /dev/nvidia0 || "
                         "{ journalctl -b -u fakegpu-devices.service --no-pager | tail -20; exit 1; }"),
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, check=False,
        )
        if check.returncode != 0:
            raise LabError(f"{record['name']}: fakegpu setup made no /dev/nvidia* files:\n{check.stdout}{check.stderr}")


def refresh_tools(record):
    record["tools"] = payload.install_tools(record["root"]) + [t for t in record["tools"] if t in paths.LAYER_TOOLS]
    _save_record(record)


def _wait_gone(pids, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(proc.alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return not any(proc.alive(p) for p in pids)


def _kill(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop(record, timeout=30):
    """Power the node off, then remove every trace: processes, mounts, files, record."""
    name = record["name"]
    leader, nspawn = record.get("leader_pid"), record.get("nspawn_pid")
    leader_ok = is_running(record)
    nspawn_ok = proc.alive(nspawn) and f"--machine={paths.machine_name(name)}" in proc.cmdline(nspawn)
    if leader_ok:
        # systemd's own "power off" signal: a clean shutdown stops every unit.
        _kill(leader, signal.SIGRTMIN + 4)
        if not _wait_gone([leader], timeout):
            # PID 1 of a PID namespace dying takes every process of the namespace with it.
            _kill(leader, signal.SIGKILL)
            _wait_gone([leader], 10)
    if nspawn_ok and not _wait_gone([nspawn], 10):
        _kill(nspawn, signal.SIGKILL)
        _wait_gone([nspawn], 5)
    if record.get("pid_ns"):
        stragglers = proc.pids_in_namespace("pid", record["pid_ns"])
        for pid in stragglers:
            _kill(pid, signal.SIGKILL)
        if stragglers and not _wait_gone(stragglers, 10):
            raise LabError(f"{name}: processes {stragglers} survived SIGKILL (D state?); left the record in place")
    top = paths.node_dir(name)
    for point in proc.mounts_under(top):
        result = subprocess.run(["umount", point], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise LabError(f"{name}: cannot unmount {point}: {result.stderr.strip()}")
    if proc.mounts_under(top):
        raise LabError(f"{name}: mounts remain under {top}")
    shutil.rmtree(top, ignore_errors=True)
    # A record from before nodes had cgroups of their own, or an orphan's, has none listed.
    remove_cgroups(record.get("cgroups") or node_cgroups(name))
    # nspawn's own runtime leftovers on the controller.
    machine = paths.machine_name(name)
    for leftover in (f"/run/systemd/nspawn/propagate/{machine}", f"/run/systemd/nspawn/unix-export/{machine}"):
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        os.unlink(paths.record_path(name))
    except FileNotFoundError:
        pass
