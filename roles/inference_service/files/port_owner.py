"""Who listens on HOST:PORT? Prints JSON:
{"port", "host", "listening", "owners": [{pid, start_time, name, cmdline, unit}]}.

usage: port_owner.py PORT [HOST]

Read-only, stdlib only, so it runs on any managed host (no ss/lsof needed):
LISTEN sockets come from /proc/net/tcp{,6}, their owners from /proc/*/fd,
the owning systemd unit from /proc/PID/cgroup.
"""
import json
import os
import re
import sys

port = int(sys.argv[1])
host = sys.argv[2] if len(sys.argv) > 2 else "0.0.0.0"
WILD = ("0.0.0.0", "::", "")


def v4(hexaddr):
    # /proc/net/tcp keeps IPv4 addresses as little-endian hex
    return ".".join(str(int(hexaddr[i:i + 2], 16)) for i in (6, 4, 2, 0))


def clashes(hexaddr):
    """A listener clashes unless both sides name different specific addresses."""
    if len(hexaddr) == 8:
        addr = v4(hexaddr)
    else:
        addr = "::" if set(hexaddr) == {"0"} else "v6:" + hexaddr
    return host in WILD or addr in WILD or addr == host


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
                if state == "0A" and int(lport, 16) == port and clashes(addr):
                    inodes.add("socket:[%s]" % inode)
    except OSError:
        pass

owners = []
if inodes:
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
                units = re.findall(r"/([^/]+\.(?:service|scope))(?:/|$)", f.read())
            owners.append({"pid": int(pid), "start_time": start_time, "name": name,
                           "cmdline": cmdline or name, "unit": units[-1] if units else None})
        except OSError:
            continue  # gone meanwhile, or not ours to read

print(json.dumps({"port": port, "host": host, "listening": bool(inodes), "owners": owners}))
