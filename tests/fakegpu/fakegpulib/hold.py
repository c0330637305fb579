"""`fakegpu hold`: a process that holds GPU memory like an inference worker does."""
import json
import os
import signal
import subprocess
import sys
import time

from . import config, proctitle
from .errors import UsageError
from .gpumem import Context
from .nvml import Nvml, NvmlError

LOAD_UNTIL_MAX_S = 3600    # --load-until's bound, as --load-s's
FAKEGPU = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "fakegpu")


def parse_spec(text, option, with_title=False):
    """'IDX:MIB' (or 'IDX:MIB:TITLE' for --child) -> (idx, mib, title)."""
    parts = text.split(":", 2 if with_title else 1)
    try:
        idx, mib = int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        form = "IDX:MIB[:TITLE]" if with_title else "IDX:MIB"
        raise UsageError("%s %r: expected %s with integer IDX and MIB" % (option, text, form))
    if mib <= 0:
        raise UsageError("%s %r: MIB must be > 0" % (option, text))
    title = parts[2] if with_title and len(parts) > 2 else None
    if title is not None and not title:
        raise UsageError("%s %r: TITLE is empty" % (option, text))
    return idx, mib, title


def start_time(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def visible_pid():
    """Our PID as /proc (of the namespace that mounted it) names us: in an
    `unshare --pid --fork` without --mount-proc this is the outer PID."""
    return int(os.readlink("/proc/self"))


def free_mib(index):
    with Nvml() as nvml:
        return nvml.gpu(index)["memory_free_mib"]


def check_fits(specs):
    """Refuses, like cudaMalloc's out-of-memory, what does not fit in free memory now."""
    wanted = {}
    for idx, mib, _unused in specs:
        wanted[idx] = wanted.get(idx, 0) + mib
    try:
        for idx, mib in sorted(wanted.items()):
            free = free_mib(idx)
            if mib > free:
                raise UsageError("out of memory on GPU %d: asked %d MiB, %d MiB free"
                                 % (idx, mib, free))
    except (OSError, NvmlError) as exc:
        raise UsageError("cannot read GPU memory through the stand-in NVML: %s" % exc)


def validate(args):
    cfg = config.load()
    own = [parse_spec(s, "--gpu") for s in args.gpu]
    kids = [parse_spec(s, "--child", with_title=True) for s in args.child]
    peers = [parse_spec(s, "--peer") for s in args.peer]
    if peers and not own:
        raise UsageError("hold: --peer needs a context of our own on another GPU (--gpu IDX:MIB)")
    if not own and not kids:
        raise UsageError("hold: give at least one --gpu IDX:MIB or --child IDX:MIB")
    for idx, _unused, _unused in own + kids + peers:
        config.gpu_by_index(cfg, idx)
    for idx, _unused, _unused in peers:
        if idx in [i for i, _m, _t in own]:
            raise UsageError("--peer %d: peer memory lives on another GPU than our own contexts (--gpu)"
                             % idx)
    for opt, val in (("--title", args.title), ("--exec-name", args.exec_name)):
        if val is not None and (not val or "\0" in val or "\n" in val):
            raise UsageError("%s %r: must be a non-empty single line" % (opt, val))
    for opt, val in (("--import-s", args.import_s), ("--load-s", args.load_s)):
        if not 0 <= val <= 3600:
            raise UsageError("%s %r: must be 0 to 3600 seconds" % (opt, val))
    if args.load_until is not None and not os.path.isabs(args.load_until):
        raise UsageError("--load-until %r: must be an absolute path" % args.load_until)
    if not loads_first(args):
        check_fits(own + kids + peers)
    return cfg, own, kids, peers


def loads_first(args):
    """Whether the memory is mapped only after a load (--load-s, --load-until): what must fit is
    checked then, not at the start."""
    return bool(args.load_s) or args.load_until is not None


def spawn_child(idx, mib, title, args):
    """A worker on its own GPU that outlives our SIGKILL (re-parented, as SGLang's are)."""
    r, w = os.pipe()
    cmd = [sys.executable, FAKEGPU, "hold", "--gpu", "%d:%d" % (idx, mib), "--notify-fd", str(w)]
    if title or args.title:
        cmd += ["--title", title or args.title]
    if args.ignore_term:
        cmd.append("--ignore-term")
    proc = subprocess.Popen(cmd, pass_fds=(w,), stdin=subprocess.DEVNULL)
    os.close(w)
    return proc, r


def wait_child_ready(proc, r):
    with os.fdopen(r) as f:
        line = f.readline()
    if not line.startswith("ready"):
        code = proc.wait()
        raise UsageError("child on --child failed (exit %s) before holding its memory" % code)


def write_ready(path, record):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.rename(tmp, path)


def sleep_forever():
    while True:
        signal.pause()


def run(args):
    cfg, own, kids, peers = validate(args)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.import_s:
        # SGLang's scheduler sets its title only once torch and the engine are imported.
        time.sleep(args.import_s)
    if args.title:
        proctitle.set_title(args.title, comm=args.exec_name)
    elif args.exec_name:
        proctitle.set_comm(args.exec_name)
    if args.load_s:
        # A real server re-titles itself first, then needs seconds (weights: minutes) before it
        # takes the GPU again (FIELD_NOTES, H200 third round): the memory comes last.
        time.sleep(args.load_s)
    if args.load_until is not None:
        deadline = time.monotonic() + LOAD_UNTIL_MAX_S
        while not os.path.exists(args.load_until) and time.monotonic() < deadline:
            time.sleep(0.05)
    if loads_first(args):
        check_fits(own + kids + peers)
    contexts = [Context(idx, config.gpu_by_index(cfg, idx)["minor"], mib) for idx, mib, _unused in own]
    contexts += [Context(idx, config.gpu_by_index(cfg, idx)["minor"], mib, peer=True)
                 for idx, mib, _unused in peers]
    children = [spawn_child(idx, mib, title, args) for idx, mib, title in kids]
    for proc, r in children:
        wait_child_ready(proc, r)
    forked = []
    if args.fork_inherit:
        pid = os.fork()
        if pid == 0:
            # Never allocates; only keeps the inherited descriptors and mappings.
            sleep_forever()
        forked.append(pid)
    if args.notify_fd is not None:
        os.write(args.notify_fd, b"ready\n")
        os.close(args.notify_fd)
    if args.ready_file:
        spawned = [p.pid for p, _unused in children]
        write_ready(args.ready_file, {
            "pid": visible_pid(),
            "ns_pid": os.getpid(),
            "start_time": start_time(visible_pid()),
            "children": spawned + forked,
            "spawned": spawned,
            "forked": forked,
            "processes": [{"pid": p, "start_time": start_time(p)} for p in spawned + forked],
            # Peer memory is marked; ordinary contexts keep the record they always had.
            "allocations": [dict({"gpu": c.index, "minor": c.minor, "mib": c.mib},
                                 **({"peer": True} if c.peer else {})) for c in contexts],
            "time": time.time(),
        })
    _keep = (contexts, children)    # noqa: F841 - the memory lives as long as these do
    sleep_forever()
