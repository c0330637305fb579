"""Who listens on HOST:PORT? Prints JSON:
{"port", "host", "listening", "owners": [{pid, start_time, uid, name, cmdline, unit, cgroup, in_unit,
 in_container}], "unit", "unit_cgroup", "container"}.

usage: port_owner.py PORT [HOST [UNIT]] [--container RUNTIME ID]

Read-only, stdlib only, so it runs on any managed host (no ss/lsof needed):
LISTEN sockets come from /proc/net/tcp{,6}, their owners from /proc/*/fd,
the owning systemd unit from /proc/PID/cgroup.

A cgroup name says what a process is only where root made it (issue 22): inside a user's
delegated subtree (user@UID.service) the user names every directory, `sglang.service`
included, so such a process's `unit` is that user@UID.service, never a name below it.
With UNIT, `in_unit` says whether the process is in that unit's own control group (or below
it) as systemd reports it (ControlGroup): the only proof that a listener is the unit's server
and not a squatter that bound the port while the server was loading.

With --container RUNTIME ID (docker: the ID the unit's own `docker run --cidfile` wrote), the
same proof for a server whose processes sit in the runtime's cgroup, outside the unit that
wraps `docker run` (system.slice/docker-<id>.scope, or /docker/<id> with cgroupfs): the runtime
gives the container's init PID (`inspect`, State.Pid) and its /proc/PID/cgroup is the
container's; `in_container` says the listener is in that cgroup or below it. The runtime
confirms it, never a name a user could choose. "container" reports {id, pid, cgroup} or
{error}.
"""
import json
import os
import re
import subprocess
import sys

WILD = ("0.0.0.0", "::", "")


def v4(hexaddr):
    # /proc/net/tcp keeps IPv4 addresses as little-endian hex
    return ".".join(str(int(hexaddr[i:i + 2], 16)) for i in (6, 4, 2, 0))


def clashes(hexaddr, host):
    """A listener clashes unless both sides name different specific addresses."""
    if len(hexaddr) == 8:
        addr = v4(hexaddr)
    else:
        addr = "::" if set(hexaddr) == {"0"} else "v6:" + hexaddr
    return host in WILD or addr in WILD or addr == host


# systemd runs the unified hierarchy when cgroup2 is mounted at /sys/fs/cgroup itself (its
# cgroup.controllers is there). The kernel still lists a name=systemd line when the machine
# around this one mounts a hybrid layout (a node booted with its own cgroup v2 tree under
# systemd-nspawn on a hybrid host reads 'N:name=systemd:/' for every process), so that line
# says where systemd keeps a process only on a hybrid host.
UNIFIED = os.path.exists("/sys/fs/cgroup/cgroup.controllers")


def systemd_path(text, unified=None):
    """The cgroup path systemd keeps a process in: the v2 line on a unified host, else the
    name=systemd line (hybrid), else the v2 one."""
    paths = dict((parts[1], parts[2]) for parts in (line.split(":", 2) for line in text.splitlines())
                 if len(parts) == 3)
    if UNIFIED if unified is None else unified:
        return paths.get("", paths.get("name=systemd"))
    return paths.get("name=systemd", paths.get(""))


def unit_of(path):
    """The innermost unit of a cgroup path that root named: never one inside user@UID.service."""
    names = [part for part in (path or "").split("/") if part]
    for i, part in enumerate(names):
        if re.match(r"^user@[0-9]+\.service$", part):
            return part
    units = [part for part in names if re.match(r"^.+\.(service|scope)$", part)]
    return units[-1] if units else None


def unit_cgroup(name):
    if not name:
        return None
    out = subprocess.run(["systemctl", "show", "-p", "ControlGroup", "--value", "--", name],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30, check=False)
    return out.stdout.decode().strip() or None


def in_unit(path, group):
    """The cgroup path is the unit's control group or below it."""
    return bool(group and path and (path == group or path.startswith(group.rstrip("/") + "/")))


def listeners(port, host):
    """The inodes of LISTEN sockets on PORT that clash with HOST."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    # 0A = LISTEN
                    addr, lport = local.rsplit(":", 1)
                    if state == "0A" and int(lport, 16) == port and clashes(addr, host):
                        inodes.add("socket:[%s]" % inode)
        except OSError:
            pass
    return inodes


def container_cgroup(runtime, cid):
    """The cgroup of a running container's init, as its runtime and the kernel report it."""
    fmt = "{{.Id}} {{.State.Running}} {{.State.Pid}}"
    try:
        out = subprocess.run([runtime, "container", "inspect", "--format", fmt, cid], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"id": cid, "error": "%s container inspect: %s" % (runtime, exc)}
    words = out.stdout.decode().split()
    if out.returncode != 0 or len(words) != 3 or words[1] != "true" or not words[2].isdigit() or words[2] == "0":
        return {"id": cid, "error": "%s container inspect %s: %s" % (
            runtime, cid, (out.stderr.decode().strip() or out.stdout.decode().strip() or "not running")[:300])}
    try:
        with open("/proc/%s/cgroup" % words[2]) as f:
            path = systemd_path(f.read())
    except OSError as exc:
        return {"id": words[0], "pid": int(words[2]), "error": "init PID %s: %s" % (words[2], exc)}
    return {"id": words[0], "pid": int(words[2]), "cgroup": path}


def owners_of(inodes, group, ctr_group=None):
    owners = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
            if not any(os.readlink("/proc/%s/fd/%s" % (pid, fd)) in inodes for fd in fds):
                continue
            with open("/proc/%s/comm" % pid) as f:
                name = f.read().strip()
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmdline = f.read().rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
            with open("/proc/%s/stat" % pid) as f:
                # field 22 (start time in clock ticks), counted after the ")" that ends comm
                start_time = int(f.read().rsplit(")", 1)[1].split()[19])
            with open("/proc/%s/cgroup" % pid) as f:
                path = systemd_path(f.read())
            uid = os.stat("/proc/%s" % pid).st_uid
            owners.append({"pid": int(pid), "start_time": start_time, "uid": uid, "name": name,
                           "cmdline": cmdline or name, "unit": unit_of(path), "cgroup": path,
                           "in_unit": in_unit(path, group), "in_container": in_unit(path, ctr_group)})
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return owners


def main(argv):
    container = None
    if "--container" in argv:
        at = argv.index("--container")
        container = argv[at + 1:at + 3]
        argv = argv[:at] + argv[at + 3:]
    port = int(argv[1])
    host = argv[2] if len(argv) > 2 else "0.0.0.0"
    unit = argv[3] if len(argv) > 3 else None
    inodes = listeners(port, host)
    group = unit_cgroup(unit)
    ctr = container_cgroup(*container) if container else None
    owners = owners_of(inodes, group, (ctr or {}).get("cgroup")) if inodes else []
    print(json.dumps({"port": port, "host": host, "listening": bool(inodes), "owners": owners,
                      "unit": unit, "unit_cgroup": group, "container": ctr}))


if __name__ == "__main__":
    main(sys.argv)
