"""Small /proc readers: liveness, children, namespaces, mounts."""

import os


def _stat_fields(pid):
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    # comm may hold spaces and parentheses; the fields after it start after the last ')'.
    return data[data.rindex(")") + 2:].split()


def alive(pid):
    """True while pid exists and is not a zombie."""
    if not pid:
        return False
    try:
        return _stat_fields(pid)[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return False


def start_time(pid):
    try:
        return int(_stat_fields(pid)[19])
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None


def all_pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def children(pid):
    found = []
    for child in all_pids():
        try:
            if int(_stat_fields(child)[1]) == pid:
                found.append(child)
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            continue
    return found


def namespace(pid, kind):
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def pids_in_namespace(kind, ns):
    """Every live process whose `kind` namespace is `ns` (e.g. 'pid', 'pid:[4026532301]')."""
    return [pid for pid in all_pids() if namespace(pid, kind) == ns and alive(pid)]


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except (FileNotFoundError, ProcessLookupError):
        return []


def _unescape(path):
    # mountinfo escapes space, tab, newline and backslash as octal.
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and path[i + 1:i + 4].isdigit() and len(path[i + 1:i + 4]) == 3:
            out.append(chr(int(path[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def mounts_under(prefix):
    """Mount points of this mount namespace at or below prefix, deepest first."""
    prefix = prefix.rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = _unescape(line.split()[4])
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(set(found), key=len, reverse=True)


def systemd_cgroups():
    """Where this process sits in the cgroup hierarchies a booted container's systemd builds its tree
    in: [(mount point, cgroup path)] for the named v1 hierarchy (name=systemd) and the v2 one,
    each only where it is mounted whole (a mount of a subtree would not line up with the
    paths /proc/PID/cgroup gives)."""
    mounts = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, superopts = fields[sep + 1], fields[sep + 3].split(",")
            if fields[3] != "/":
                continue
            if fstype == "cgroup2":
                mounts.setdefault("", _unescape(fields[4]))
            elif fstype == "cgroup" and "name=systemd" in superopts:
                mounts.setdefault("name=systemd", _unescape(fields[4]))
    found = []
    with open("/proc/self/cgroup") as f:
        for line in f:
            _hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers in mounts:
                found.append((mounts[controllers], path))
    return found
