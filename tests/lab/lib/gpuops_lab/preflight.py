"""What `lab up` checks on the controller before it boots a node.

Two shared limits of the controller stop a node from ever answering, and without these
checks `up` would wait its whole SSH timeout and then print a console log that does not
say why: every lab's nodes run as root on one kernel, so they draw on root's inotify
instances (fs.inotify.max_user_instances, 128 by default), and they share the controller's
network, so a listener on 0.0.0.0:22 (a host sshd) or on a node's own address (another lab
whose LAB_ADDR_BASE overlaps) takes the port the node's sshd needs.
"""

import os

from . import paths, proc
from .node import LabError

# Measured on a booted node with one SSH session: its root processes hold 10 inotify
# instances (systemd 5, root's user manager 3, systemd-logind 1, agetty 1). The margin
# covers a second SSH session's user manager.
INOTIFY_PER_NODE = 10
INOTIFY_LIMIT_FILE = "/proc/sys/fs/inotify/max_user_instances"
SSH_PORT = 22
_TCP_LISTEN = "0A"


def _euid(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[2])
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None
    return None


def _fd_targets(pid):
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return
    for name in names:
        try:
            yield os.readlink(f"{base}/{name}")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue


def inotify_in_use(uid=0):
    """{pid: inotify instances} over the processes whose effective uid is uid (the kernel
    charges an instance to the uid that created it)."""
    held = {}
    for pid in proc.all_pids():
        if _euid(pid) != uid:
            continue
        count = sum(1 for target in _fd_targets(pid) if target == "anon_inode:inotify")
        if count:
            held[pid] = count
    return held


def inotify_limit():
    with open(INOTIFY_LIMIT_FILE) as f:
        return int(f.read().strip())


def inotify_shortfall(limit, used, nodes, per_node=INOTIFY_PER_NODE):
    """The sentence explaining why `nodes` more nodes cannot boot, or None when they fit."""
    needed = nodes * per_node
    if used + needed <= limit:
        return None
    return (f"root already holds {used} of its {limit} inotify instances (fs.inotify.max_user_instances) "
            f"and {nodes} node(s) need about {needed} more ({per_node} each: systemd, logind, agetty): "
            f"their systemd would fail to start. Raise the limit, e.g. "
            f"'sysctl -w fs.inotify.max_user_instances={max(1024, 2 * (used + needed))}' "
            f"(and a file in /etc/sysctl.d/ to keep it), or bring other labs down; nothing was started")


def _holders_summary(held, top=5):
    by_name = {}
    for pid, count in held.items():
        name = (proc.cmdline(pid)[:1] or ["?"])[0].rsplit("/", 1)[-1]
        by_name[name] = by_name.get(name, 0) + count
    ranked = sorted(by_name.items(), key=lambda item: -item[1])[:top]
    return ", ".join(f"{name} {count}" for name, count in ranked)


def check_inotify(nodes):
    held = inotify_in_use(0)
    message = inotify_shortfall(inotify_limit(), sum(held.values()), nodes)
    if message:
        raise LabError(f"{message}. Largest holders: {_holders_summary(held)}")


def inotify_hint(console_text):
    """An explanation to add to a failed boot's console log when it shows inotify exhaustion."""
    lowered = console_text.lower()
    if "inotify" not in lowered and "too many open files" not in lowered:
        return ""
    held = sum(inotify_in_use(0).values())
    return (f"\n(root holds {held} of its {inotify_limit()} inotify instances: raise "
            f"fs.inotify.max_user_instances, or bring other labs down)")


def _hex_ipv4(text):
    """'0100007F' (little-endian hex from /proc/net/tcp) -> '127.0.0.1'."""
    return ".".join(str(int(text[i:i + 2], 16)) for i in (6, 4, 2, 0))


def tcp_listeners(port):
    """[(address, socket inode)] of IPv4 sockets listening on port, in this network namespace."""
    found = []
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == _TCP_LISTEN and int(hex_port, 16) == port:
                found.append((_hex_ipv4(address), fields[9]))
    return found


def _socket_owner(inode):
    wanted = f"socket:[{inode}]"
    for pid in proc.all_pids():
        if any(target == wanted for target in _fd_targets(pid)):
            command = " ".join(" ".join(proc.cmdline(pid)).split())
            return f"pid {pid} ({command[:60] or '?'})"
    return "a process this lab cannot see"


def ssh_port_conflicts(listeners, node_ips):
    """Pure: [(address, inode, why)] for each listener that takes a node's port 22."""
    conflicts = []
    for address, inode in listeners:
        if address == "0.0.0.0":
            conflicts.append((address, inode, "wildcard"))
        elif address in node_ips:
            conflicts.append((address, inode, "taken"))
    return conflicts


def check_ssh_ports(node_ips):
    conflicts = ssh_port_conflicts(tcp_listeners(SSH_PORT), set(node_ips))
    for address, inode, why in conflicts:
        owner = _socket_owner(inode)
        if why == "wildcard":
            raise LabError(
                f"{owner} listens on 0.0.0.0:{SSH_PORT}, every address of this controller, so no lab node's "
                f"sshd can take its own {node_ips[0]}:{SSH_PORT}. Make the controller's sshd listen on its "
                f"real addresses only ('ListenAddress ADDRESS' in /etc/ssh/sshd_config, then reload it), "
                f"or stop it; nothing was started")
        raise LabError(
            f"{address}:{SSH_PORT} is already taken by {owner}: another lab on this controller uses "
            f"addresses that overlap this one's (LAB_ADDR_BASE={paths.ADDR_BASE}). Give each lab a "
            f"LAB_ADDR_BASE at least {paths.MAX_NODES} apart, or bring that lab down; nothing was started")
