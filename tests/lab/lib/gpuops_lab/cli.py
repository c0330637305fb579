"""Argument checking and the five commands. Every bad argument is refused before anything changes."""

import fcntl
import os
import shutil
import subprocess
import sys
import time

from . import inventory, node, paths, payload, preflight, proc, ssh
from .node import LabError


class UsageError(Exception):
    """A bad command line (exit status 2); nothing was changed."""


def _positive_int(text, what, limit):
    try:
        value = int(text, 10)
    except ValueError:
        raise UsageError(f"{what} must be a whole number from 1 to {limit}, got '{text}'") from None
    if not 1 <= value <= limit:
        raise UsageError(f"{what} must be from 1 to {limit}, got '{text}'")
    return value


def _parse_up(args):
    count, gpus = None, paths.DEFAULT_GPUS
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--gpus" or arg.startswith("--gpus="):
            if "=" in arg:
                value = arg.split("=", 1)[1]
            elif rest:
                value = rest.pop(0)
            else:
                raise UsageError("--gpus needs a value, e.g. --gpus 8")
            gpus = _positive_int(value, "--gpus", paths.MAX_GPUS)
        elif arg.startswith("-") and not arg.lstrip("-").isdigit():
            raise UsageError(f"unknown option '{arg}' for 'up' (only --gpus K)")
        elif count is None:
            count = _positive_int(arg, "node count N", paths.MAX_NODES)
        else:
            raise UsageError(f"unexpected argument '{arg}' for 'up' (usage: lab up N [--gpus K])")
    if count is None:
        raise UsageError("'up' needs the node count N (usage: lab up N [--gpus K])")
    return count, gpus


def _need_root(command):
    if os.geteuid() != 0:
        raise LabError(f"'lab {command}' must run as root (it mounts and boots containers)")


class _Lock:
    """One up/down at a time: concurrent runs would race on the same nodes."""

    def __enter__(self):
        os.makedirs(paths.RUN, exist_ok=True)
        self.file = open(paths.LOCK, "w")
        fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.file.close()


def _say(message):
    print(f"lab: {message}", file=sys.stderr, flush=True)


def cmd_up(args):
    count, gpus = _parse_up(args)
    _need_root("up")
    if not shutil.which("systemd-nspawn"):
        raise LabError("systemd-nspawn not found: run 'make host-deps' (or tests/lab/host-deps)")
    with _Lock():
        started = time.monotonic()
        records = node.load_records()
        wanted = [paths.node_name(i) for i in range(1, count + 1)]
        if ([r["name"] for r in records] == wanted and all(r["gpus"] == gpus for r in records)
                and all(paths.LAYER_TOOLS.intersection(r["tools"]) == set(paths.LAYER[2] if paths.LAYER else [])
                        for r in records)
                and all(r.get("cgroups") for r in records)   # booted before nodes had cgroups of their own
                and all(node.is_running(r) and ssh.answers(r["ip"]) for r in records)):
            for record in records:
                node.refresh_tools(record)
            _say(f"{count} node(s) already up; stand-in tools refreshed")
            print(inventory.write(records))
            return 0
        if records or _orphans():
            _say("stopping the nodes that are up, to start the requested set")
            _down_all()
        # Limits shared with every other lab and the controller itself: refuse now, with the
        # cause, rather than wait for nodes that can never answer.
        preflight.check_ssh_ports([paths.node_ip(i) for i in range(1, count + 1)])
        preflight.check_inotify(count)
        subprocess.run([os.path.join(paths.LAB_DIR, "build-base")], check=True)
        if paths.LAYER:
            subprocess.run([os.path.join(paths.LAB_DIR, paths.LAYER[1])], check=True)
        missing = payload.missing_tools()
        if missing:
            _say("stand-in GPU driver not ready, nodes come up without it; missing: " + ", ".join(missing)
                 + " (run 'make -C tests/fakegpu')")
        ssh.ensure_key()
        records = []
        try:
            for index in range(1, count + 1):
                record = node.prepare(index, gpus)
                records.append(record)
                node.boot(record)
            for record in records:
                node.wait_ready(record)
        except LabError as e:
            _say("start failed; removing what was started")
            _down_all()
            raise LabError(f"{e}{preflight.inotify_hint(str(e))}") from None
        except BaseException:
            _say("start failed; removing what was started")
            _down_all()
            raise
        _say(f"{count} node(s) up with {gpus} GPU(s) each in {time.monotonic() - started:.1f} s")
        print(inventory.write(records))
    return 0


def _orphans():
    """Node directories, mounts or nspawn processes the records do not know about."""
    known = {r["name"] for r in node.load_records()}
    found = set()
    if os.path.isdir(paths.NODES_DIR):
        found.update(d for d in os.listdir(paths.NODES_DIR) if paths.NODE_NAME.match(d))
    for pid in proc.all_pids():
        argv = proc.cmdline(pid)
        if argv[:1] == ["systemd-nspawn"] and any(a.startswith(f"--directory={paths.NODES_DIR}/") for a in argv):
            found.update(paths.node_from_machine(a.split("=", 1)[1]) for a in argv if a.startswith("--machine="))
    found.discard(None)
    return sorted(found - known)


def _down_all():
    failures = []
    records = node.load_records()
    orphans = [{"name": name} for name in _orphans()]
    for orphan in orphans:
        # Without a record, find the container by the nspawn process that names it.
        for pid in proc.all_pids():
            argv = proc.cmdline(pid)
            # Machine names carry the lab's address base, and the directory is this lab's:
            # another lab's node of the same name is never matched.
            if (argv[:1] == ["systemd-nspawn"] and f"--machine={paths.machine_name(orphan['name'])}" in argv
                    and f"--directory={paths.node_dir(orphan['name'])}/root" in argv):
                orphan["nspawn_pid"] = pid
                for child in proc.children(pid):
                    orphan.update(leader_pid=child, leader_start=proc.start_time(child),
                                  pid_ns=proc.namespace(child, "pid"))
    for record in records + orphans:
        try:
            node.stop(record)
        except LabError as e:
            failures.append(str(e))
    inventory.write(node.load_records())
    if failures:
        raise LabError("; ".join(failures))


def cmd_down(args):
    if args:
        raise UsageError(f"'down' takes no arguments, got '{args[0]}'")
    _need_root("down")
    with _Lock():
        names = [r["name"] for r in node.load_records()] + _orphans()
        _down_all()
    _say(f"stopped {', '.join(names)}" if names else "no nodes were up")
    return 0


def cmd_status(args):
    if args:
        raise UsageError(f"'status' takes no arguments, got '{args[0]}'")
    records = node.load_records()
    if not records:
        print("no lab nodes are up")
        return 0
    for r in records:
        if not node.is_running(r):
            state = "stopped"
        elif ssh.answers(r["ip"], timeout=5):
            state = "answers"
        else:
            state = "running, no SSH"
        print(f"{r['name']}\t{r['ip']}\t{r['gpus']} GPUs\t{state}\ttools: {','.join(r['tools']) or 'none'}")
    return 0


def cmd_inventory(args):
    if args:
        raise UsageError(f"'inventory' takes no arguments, got '{args[0]}'")
    records = [r for r in node.load_records() if node.is_running(r)]
    if not records:
        raise LabError("no lab nodes are up: run 'lab up N' first")
    print(inventory.write(records))
    return 0


def cmd_exec(args):
    if not args:
        raise UsageError("'exec' needs a node and a command (usage: lab exec NODE CMD...)")
    name, command = args[0], args[1:]
    records = {r["name"]: r for r in node.load_records()}
    if name not in records:
        up = ", ".join(records) or "none"
        raise UsageError(f"no such node '{name}' (up: {up})")
    if not command:
        raise UsageError(f"'exec {name}' needs a command to run")
    record = records[name]
    if not node.is_running(record):
        raise LabError(f"node '{name}' is not running")
    ssh.ensure_key()
    # stdin passes through, so 'lab exec node1 "cat > f" < f' works.
    return subprocess.run(ssh.ssh_argv(record["ip"], ssh.remote_command(command)), check=False).returncode


COMMANDS = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "inventory": cmd_inventory, "exec": cmd_exec}


def main(argv, usage):
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage.strip())
        return 0 if argv else 2
    command = COMMANDS.get(argv[0])
    try:
        if command is None:
            raise UsageError(f"unknown command '{argv[0]}' (commands: {', '.join(COMMANDS)})")
        return command(argv[1:])
    except UsageError as e:
        print(f"lab: error: {e}", file=sys.stderr)
        return 2
    except LabError as e:
        print(f"lab: error: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        print(f"lab: error: {' '.join(map(str, e.cmd))} failed with status {e.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
