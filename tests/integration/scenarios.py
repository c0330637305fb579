"""Wedged-GPU scenarios started inside a lab node, for the gpu_holders / gpu_reclaim tests.

Every process a scenario starts runs in its own transient systemd scope
(`gpuops-t-<name>.scope`), so that `cleanup()` can end all of it, however it was re-parented,
by stopping the scopes. A scope is not a service: the modules never stop it themselves, so
the tests see the signal ladder, not a unit stop (units are tested through `start_unit`).

Waits poll a condition inside the node with an upper bound; they never sleep a guessed time.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile

READY_DIR = "/run/gpuops-t"
SCOPE_PREFIX = "gpuops-t-"
UNIT = "gpuhog"          # the Restart=always service of the unit scenarios
WAIT_S = 30              # upper bound for a scenario to get ready (never reached when healthy)

_NAME_RE = re.compile(r"^[a-z0-9-]+$")


def _check_name(name):
    if not _NAME_RE.match(name):
        raise ValueError("scenario name %r: use a-z, 0-9 and -" % name)


def ready_path(name):
    return "%s/%s.json" % (READY_DIR, name)


def wait_until(lab, node, shell_condition, what, timeout=WAIT_S):
    """Poll `shell_condition` in the node until it holds; fail naming `what` after `timeout`."""
    script = (
        "for i in $(seq %d); do if %s; then exit 0; fi; sleep 0.05; done; exit 1"
        % (int(timeout * 20), shell_condition))
    result = lab.exec(node, script, check=False, timeout=timeout + 30)
    if result.returncode != 0:
        raise AssertionError("%s: not reached within %ss on %s (%s)\n%s%s"
                             % (what, timeout, node, shell_condition, result.stdout, result.stderr))


def read_json(lab, node, path):
    return json.loads(lab.exec(node, "cat %s" % shlex.quote(path)).stdout)


def start_in_scope(lab, node, name, argv_shell):
    """Run a shell command line detached in scope gpuops-t-<name>; returns nothing."""
    _check_name(name)
    lab.exec(node, "mkdir -p %s && setsid -f systemd-run --quiet --scope --collect --unit=%s%s -- "
                   "%s >/dev/null 2>&1 </dev/null"
             % (READY_DIR, SCOPE_PREFIX, name, argv_shell))


def hold(lab, node, name, *hold_args, wrap=None):
    """`fakegpu hold ARGS --ready-file ...` in its own scope; returns the ready record.

    The record has pid, start_time, spawned (--child PIDs), forked (--fork-inherit PIDs),
    processes ([{pid, start_time}] of those) and allocations. `wrap` is a command prefix
    (e.g. "unshare --pid --fork") run around fakegpu.
    """
    path = ready_path(name)
    lab.exec(node, "rm -f %s" % path)
    cmd = "fakegpu hold %s --ready-file %s" % (" ".join(shlex.quote(a) for a in hold_args), path)
    if wrap:
        cmd = "%s %s" % (wrap, cmd)
    start_in_scope(lab, node, name, cmd)
    wait_until(lab, node, "[ -s %s ]" % path, "fakegpu hold %s ready" % name)
    return read_json(lab, node, path)


def python_in_scope(lab, node, name, code):
    """Run `python3 -c CODE` detached in scope gpuops-t-<name>."""
    start_in_scope(lab, node, name, "python3 -c %s" % shlex.quote(code))


def start_fd_opener(lab, node, name, device):
    """A process (scope gpuops-t-<name>) that only opens `device` read-only and sleeps: a
    monitor's or a handle's shape. Returns nothing; read its PID with fd_opener_pid."""
    python_in_scope(lab, node, name, (
        "import os, time\n"
        "f = os.open(%r, os.O_RDONLY)\n"
        "open('/run/gpuops-t/%s.pid', 'w').write(str(os.getpid()))\n"
        "time.sleep(300)\n") % (device, name))


def fd_opener_pid(lab, node, *names):
    """Wait until every named opener wrote its PID; return the PIDs in that order."""
    paths = ["/run/gpuops-t/%s.pid" % name for name in names]
    wait_until(lab, node, " && ".join("[ -s %s ]" % p for p in paths), "fd opener(s) %s" % ", ".join(names))
    return [int(lab.exec(node, "cat %s" % p).stdout) for p in paths]


def start_unit(lab, node, *hold_args, restart="always", unit=UNIT):
    """A holder run as service `unit` with Restart=`restart`; returns the ready record."""
    path = ready_path(unit)
    lab.exec(node, "mkdir -p %s && rm -f %s" % (READY_DIR, path))
    lab.exec(node, "systemd-run --quiet --unit=%s -p Restart=%s -p RestartSec=100ms -- "
                   "/usr/bin/env fakegpu hold %s --ready-file %s"
             % (unit, restart, " ".join(shlex.quote(a) for a in hold_args), path))
    wait_until(lab, node, "[ -s %s ]" % path, "unit %s ready" % unit)
    return read_json(lab, node, path)


def identity(lab, node, pid):
    """(start_time, state letter) of a PID in the node, or None when it does not exist."""
    out = lab.exec(node, "cat /proc/%d/stat 2>/dev/null || true" % pid).stdout
    if not out.strip():
        return None
    fields = out.rsplit(")", 1)[1].split()
    return int(fields[19]), fields[0]


def alive(lab, node, pid, start_time):
    """The very process (PID and start time) still exists and is not a zombie."""
    found = identity(lab, node, pid)
    return found is not None and found[0] == start_time and found[1] != "Z"


def kill9_and_wait_reaped(lab, node, pid):
    """SIGKILL one PID and wait until its /proc entry is gone (its reaper collected it)."""
    lab.exec(node, "kill -9 %d" % pid)
    wait_until(lab, node, "[ ! -e /proc/%d ]" % pid, "PID %d reaped after SIGKILL" % pid)


def gpu_used_mib(lab, node, index):
    status = json.loads(lab.exec(node, "fakegpu status").stdout)
    return [g for g in status["gpus"] if g["index"] == index][0]["memory_used_mib"]


def unit_state(lab, node, unit=UNIT):
    return lab.exec(node, "systemctl is-active %s.service || true" % unit).stdout.strip()


def cleanup(lab, node):
    """End every scenario (scopes, the unit, knobs) and give the node idle stand-in GPUs."""
    lab.exec(node, "fakegpu hang --off >/dev/null 2>&1 || true; "
                   "systemctl stop %s.service >/dev/null 2>&1 || true; "
                   "systemctl reset-failed %s.service >/dev/null 2>&1 || true; "
                   "for s in $(systemctl list-units --all --plain --no-legend '%s*' | awk '{print $1}'); do "
                   "systemctl kill -s KILL \"$s\" >/dev/null 2>&1; systemctl stop \"$s\" >/dev/null 2>&1; done; "
                   "rm -rf %s; true" % (UNIT, UNIT, SCOPE_PREFIX, READY_DIR), timeout=120)
    lab.reset_gpus(node)


# Code run in the node with `python3 -c`: a context made like `fakegpu hold` makes it, then
# something odd done with it. The stand-in's library lives beside the fakegpu command.
_CONTEXT = r"""
import ctypes, os, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.realpath('/usr/local/bin/fakegpu')))
from fakegpulib import config
from fakegpulib.gpumem import Context
cfg = config.load()
ctx = Context({gpu}, config.gpu_by_index(cfg, {gpu})["minor"], {mib})
"""

# A process in uninterruptible sleep: the parent of a vfork() waits in the kernel (state D)
# until the child execs or exits, and this child does neither.
VFORK_D_STATE = _CONTEXT + r"""
libc = ctypes.CDLL(None, use_errno=True)
with open('{ready}', 'w') as f:
    f.write(str(os.getpid()))
if libc.vfork() == 0:
    while True:
        libc.pause()
"""

# pytorch#1223: the main thread exits (exit(2), not exit_group(2)) while another thread lives:
# the PID is a zombie in /proc (no fds, no maps readable) but the thread group still holds
# the context.
ZOMBIE_LEADER = _CONTEXT + r"""
threading.Thread(target=lambda: time.sleep(100000)).start()
with open('{ready}', 'w') as f:
    f.write(str(os.getpid()))
ctypes.CDLL(None).syscall(60, 0)   # SYS_exit on x86_64: this thread only
"""

# A parent that never reaps: its child held a context and exited, and is now a zombie.
UNREAPED_CHILD = _CONTEXT.replace("ctx = ", "pass  # ") + r"""
pid = os.fork()
if pid == 0:
    ctx = Context({gpu}, config.gpu_by_index(cfg, {gpu})["minor"], {mib})
    os._exit(0)
with open('{ready}', 'w') as f:
    f.write('%d %d' % (os.getpid(), pid))
while True:
    time.sleep(1000)
"""


def _python_scenario(lab, node, name, template, gpu, mib, state_check, what):
    ready = ready_path(name)
    python_in_scope(lab, node, name, template.format(gpu=gpu, mib=mib, ready=ready))
    wait_until(lab, node, "[ -s %s ] && %s" % (ready, state_check.format(ready=ready)), what)
    return [int(pid) for pid in lab.exec(node, "cat %s" % ready).stdout.split()]


# --- a real tracer --------------------------------------------------------------------------

STRACE_DIR = "/opt/gpuops-t-strace"     # in the node: bin/strace and the libraries it links


def install_strace(lab, node):
    """Copy the controller's strace (Debian's package, as installed) into the node; returns the
    node's strace command, or raises LookupError saying why it cannot.

    The lab's base tree (tests/lab/build-base) has no tracer, and adding a package there rebuilds
    the tree that every lab on the controller shares. The controller runs the same Debian release
    as the nodes (bookworm), so its strace runs there with the libraries it links (libunwind,
    which the base tree lacks) beside it: everything `ldd` resolves but the C library and loader,
    which the node has.
    """
    strace = shutil.which("strace")
    if not strace:
        raise LookupError("strace is not installed on the controller (apt-get install strace) to copy into the node")
    linked = subprocess.run(["ldd", strace], capture_output=True, text=True, check=True).stdout
    libs = [m.group(2) for m in re.finditer(r"^\s*(\S+) => (/\S+)", linked, re.M)
            if not m.group(1).startswith(("libc.so", "ld-linux"))]
    with tempfile.TemporaryDirectory(prefix="strace-") as tmp:
        archive = os.path.join(tmp, "strace.tar.gz")
        with tarfile.open(archive, "w:gz", dereference=True) as tar:
            tar.add(strace, arcname="bin/strace")
            for lib in libs:
                tar.add(lib, arcname="lib/" + os.path.basename(lib))
        lab.exec(node, "mkdir -p %s" % STRACE_DIR)
        result = lab.module(node, "ansible.builtin.unarchive", {"src": archive, "dest": STRACE_DIR})
        if result.get("failed"):
            raise AssertionError("copying strace into %s failed: %s" % (node, result.get("msg")))
    command = "env LD_LIBRARY_PATH=%s/lib %s/bin/strace" % (STRACE_DIR, STRACE_DIR)
    check = lab.exec(node, "%s -V" % command, check=False)
    if check.returncode != 0:
        raise LookupError("the controller's strace does not run in %s: %s" % (node, check.stderr.strip()))
    return command


def start_traced_stop(lab, node, gpu, mib):
    """A holder under a real strace, kept in tracing stop (state t): the tracer is SIGSTOPped,
    then a signal (SIGWINCH, ignored untraced) stops the tracee at its delivery until a tracer
    that never comes resumes it. Returns (holder record, strace PID)."""
    command = install_strace(lab, node)
    path = ready_path("traced")
    lab.exec(node, "rm -f %s" % path)
    start_in_scope(lab, node, "traced", "%s -o /dev/null -- fakegpu hold --gpu %d:%d --ready-file %s"
                   % (command, gpu, mib, path))
    wait_until(lab, node, "[ -s %s ]" % path, "traced holder ready")
    rec = read_json(lab, node, path)
    tracer = int(lab.exec(node, "awk '/^TracerPid:/ {print $2}' /proc/%d/status" % rec["pid"]).stdout)
    assert tracer, "the holder under strace has no tracer"
    lab.exec(node, "kill -STOP %d" % tracer)
    wait_until(lab, node, "grep -q '^State:[[:space:]]*T' /proc/%d/status" % tracer, "strace stopped")
    lab.exec(node, "kill -WINCH %d" % rec["pid"])
    wait_until(lab, node, "grep -q '^State:[[:space:]]*t' /proc/%d/status" % rec["pid"], "holder in tracing stop")
    return rec, tracer


def start_d_state(lab, node, gpu, mib):
    """A holder of `mib` on `gpu` in state D (a vfork parent); returns its PID."""
    return _python_scenario(lab, node, "vfork", VFORK_D_STATE, gpu, mib,
                            "grep -q ') D ' /proc/$(cat {ready})/stat", "vfork parent in D state")[0]


def start_zombie_leader(lab, node, gpu, mib):
    """A holder whose main thread exited while another thread keeps the context; its PID."""
    return _python_scenario(lab, node, "zleader", ZOMBIE_LEADER, gpu, mib,
                            "grep -q ') Z ' /proc/$(cat {ready})/stat", "main thread exited")[0]


def start_unreaped_child(lab, node, gpu, mib):
    """A parent that never reaps a child that held a context; returns (parent, zombie)."""
    return tuple(_python_scenario(lab, node, "unreaped", UNREAPED_CHILD, gpu, mib,
                                  "grep -q ') Z ' /proc/$(cut -d' ' -f2 {ready})/stat",
                                  "unreaped child is a zombie"))


# Runs a command as a process born with a chosen PID: clone3() with set_tid, as CRIU restores
# processes (root of the node's PID namespace may; the kernel refuses a PID in use). It gives a
# test the PID reuse a busy host brings after hours, at once.
WITH_PID = r"""
import ctypes, os, struct, sys
want, argv = int(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
tid = (ctypes.c_int * 1)(want)
# struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal (SIGCHLD), stack,
# stack_size, tls, set_tid, set_tid_size, cgroup
args = struct.pack('11Q', 0, 0, 0, 0, 17, 0, 0, 0, ctypes.addressof(tid), 1, 0)
pid = libc.syscall(435, ctypes.create_string_buffer(args, len(args)), len(args))
if pid == 0:
    os.execvp(argv[0], argv)
if pid < 0:
    raise SystemExit('clone3 with PID %d: %s' % (want, os.strerror(ctypes.get_errno())))
"""


def hold_with_pid(lab, node, name, pid, *hold_args):
    """`fakegpu hold ARGS` as a process with PID `pid` (a dead one's, reused); returns the ready
    record."""
    lab.exec(node, "mkdir -p %s && cat > %s/with-pid.py <<'EOF'\n%sEOF" % (READY_DIR, READY_DIR, WITH_PID))
    return hold(lab, node, name, *hold_args, wrap="python3 %s/with-pid.py %d" % (READY_DIR, pid))
