"""GPU holder workloads for the real-GPU suite (tests/gpu/run): processes that hold real GPU
memory through torch, the way inference servers do.

    workload.py hold   --ready FILE --gpu 0:1024 [--gpu 1:512] [--title T] [--comm NAME]
                       [--ignore-term] [--fork-child] [--import-first] [--load-s S] [--max-life S]
    workload.py server --ready FILE --tp N --child-mib M [--parent-mib M] [--title T] [--max-life S]
    workload.py nccl-rank --ready FILE --rank R --world N --init-file F --mib M [--title T] [--max-life S]

`hold` allocates MiB on each GPU and sleeps. `--fork-child` forks after the context exists; the
child never calls CUDA (it only inherits the device fds and mappings). `--comm` renames the
process (prctl PR_SET_NAME), `--title` rewrites /proc/PID/cmdline (as setproctitle does), so the
modules' `match` and `protect` rules see the names a real host shows. `--import-first` imports
torch before taking the title, and `--load-s` waits that long after it before the first
allocation: a restarted SGLang scheduler re-titles itself once its imports are done and takes
the GPU only after loading its weights.

`nccl-rank` is one tensor-parallel rank: it joins an NCCL process group (a FileStore, so no
rank hosts a TCP store the others depend on), holds --mib on GPU R, all_reduces once, writes
FILE, then keeps all_reducing every 0.2 s, as the 2x H200 measurement did (FIELD_NOTES: after
rank 0 was SIGKILLed, rank 1 kept 291 MiB of peer memory on GPU 0 that NVML charged to no
process). When torch has no NCCL, FILE says so (`skip`) and the rank exits. With --backend fake
a rank > 0 maps --mib of stand-in peer memory on GPU 0 instead.

`server` is a stand-in inference server: the parent spawns (multiprocessing, spawn start method,
as SGLang and vLLM do) one child per GPU, each titled `sglang::scheduler_TP<rank> ...`, each
holding --child-mib on its GPU; the parent holds --parent-mib on GPU 0.

Both write FILE (JSON, atomically) once every allocation is visible to the driver, and exit by
themselves after --max-life seconds whatever happens: a safety net so that nothing this suite
starts can outlive it. The suite ends them with signals long before that.

--backend fake uses the project's stand-in driver (tests/fakegpu, FAKEGPU_ROOT) instead of torch,
only to exercise the suite's plumbing on a machine without a GPU.
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import signal
import sys
import time

MIB = 1 << 20
PR_SET_NAME = 15
HERE = os.path.dirname(os.path.abspath(__file__))


# --- process names ------------------------------------------------------------------------------

def _libc():
    return ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)


def set_comm(name):
    """/proc/PID/comm (15 bytes at most) of the calling thread; call from the main thread."""
    _libc().prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def set_cmdline(title):
    """Overwrite the argv block in place so /proc/PID/cmdline reads `title` (setproctitle's trick).

    The block is padded with spaces and so ends in a non-NUL byte; the kernel then reads it as
    one string up to the first NUL. Python keeps its own copy of argv, so nothing breaks.
    """
    with open('/proc/self/stat') as handle:
        fields = handle.read().rsplit(')', 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (stat fields 48, 49)
    size = end - start
    if size < 2:
        return
    data = title.encode()[:size - 2] + b'\0'
    data += b' ' * (size - len(data))
    ctypes.memmove(start, data, size)


def name_myself(title=None, comm=None):
    if title:
        try:
            set_cmdline(title)
        except Exception as exc:  # a name is a nicety for the match rule, never fatal here
            sys.stderr.write('set_cmdline failed: %s\n' % exc)
    if comm:
        set_comm(comm)


# --- memory ---------------------------------------------------------------------------------------

class TorchBackend(object):
    def __init__(self):
        started = time.monotonic()
        import torch  # pylint: disable=import-outside-toplevel
        self.torch = torch
        self.import_s = round(time.monotonic() - started, 3)
        self.keep = []

    def alloc(self, gpu, mib):
        torch = self.torch
        started = time.monotonic()
        device = torch.device('cuda', gpu)
        tensor = torch.empty(mib * MIB, dtype=torch.uint8, device=device)
        tensor.fill_(1)                 # touch it: the memory is really in use
        torch.cuda.synchronize(device)
        self.keep.append(tensor)
        return round(time.monotonic() - started, 3)

    def info(self):
        torch = self.torch
        return {'torch': torch.__version__, 'cuda': torch.version.cuda,
                'device_count': torch.cuda.device_count(), 'import_s': self.import_s}


class FakeBackend(object):
    """The project's stand-in driver: memory = a mapping of $FAKEGPU_ROOT/dev/nvidiaN."""

    def __init__(self):
        sys.path.insert(0, os.path.join(HERE, '..', 'fakegpu'))
        from fakegpulib import gpumem  # pylint: disable=import-outside-toplevel
        self.gpumem = gpumem
        self.keep = []

    def alloc(self, gpu, mib, peer=False):
        started = time.monotonic()
        self.keep.append(self.gpumem.Context(gpu, gpu, mib, peer=peer))
        return round(time.monotonic() - started, 3)

    def info(self):
        return {'backend': 'fake'}


def backend(name):
    return FakeBackend() if name == 'fake' else TorchBackend()


# --- helpers ---------------------------------------------------------------------------------------

def write_ready(path, data):
    tmp = path + '.tmp-%d' % os.getpid()
    with open(tmp, 'w') as handle:
        json.dump(data, handle)
    os.rename(tmp, path)


def sleep_until(deadline):
    """Sleep until the deadline (monotonic), then leave without any cleanup handlers."""
    while time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    os._exit(0)


def parse_gpu(text):
    gpu, mib = text.split(':')
    return int(gpu), int(mib)


def identity():
    """Who we are as the runner sees us. Under `unshare --pid --fork` (no --mount-proc) getpid()
    is 1, the PID in our own namespace, while /proc is still the runner's: /proc/self names
    the PID the runner and the modules see. With --mount-proc it names the namespace PID too,
    and the runner finds the host PID itself."""
    with open('/proc/self/comm') as handle:
        comm = handle.read().strip()
    with open('/proc/self/cmdline', 'rb') as handle:
        cmdline = handle.read().replace(b'\0', b' ').decode('utf-8', 'replace').strip()
    pid = int(os.readlink('/proc/self'))
    with open('/proc/self/stat') as handle:
        ppid = int(handle.read().rsplit(')', 1)[1].split()[1])
    return {'pid': pid, 'ns_pid': os.getpid(), 'ppid': ppid, 'comm': comm, 'cmdline': cmdline}


# --- hold ------------------------------------------------------------------------------------------

def cmd_hold(args):
    deadline = time.monotonic() + args.max_life
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.import_first:
        mem = backend(args.backend)
        name_myself(args.title, args.comm)
    else:
        name_myself(args.title, args.comm)
        mem = backend(args.backend)
    if args.load_s:
        time.sleep(args.load_s)      # the weights: the GPU is taken only after them
    allocs = {}
    for gpu, mib in (parse_gpu(g) for g in args.gpu):
        allocs[str(gpu)] = {'mib': mib, 'alloc_s': mem.alloc(gpu, mib)}
    if args.comm:
        set_comm(args.comm)         # again, in case a library renamed the main thread
    forked = []
    if args.fork_child:
        pid = os.fork()
        if pid == 0:
            # The child never touches CUDA: it only holds what it inherited (fds, mappings).
            try:
                name_myself((args.title or 'holder') + ' forked-child')
            finally:
                sleep_until(deadline)
        forked.append(pid)
    ready = identity()
    ready.update({'allocs': allocs, 'forked': forked, 'ignore_term': args.ignore_term,
                  'runtime': mem.info()})
    write_ready(args.ready, ready)
    sleep_until(deadline)


# --- server ----------------------------------------------------------------------------------------

def server_child(rank, gpu, mib, title, ready_path, backend_name, max_life):
    deadline = time.monotonic() + max_life
    name_myself(title, 'sglang::scheduler_TP%d' % rank)
    mem = backend(backend_name)
    alloc_s = mem.alloc(gpu, mib)
    ready = identity()
    ready.update({'rank': rank, 'gpu': gpu, 'mib': mib, 'alloc_s': alloc_s, 'runtime': mem.info()})
    write_ready(ready_path, ready)
    sleep_until(deadline)


def cmd_server(args):
    import multiprocessing  # pylint: disable=import-outside-toplevel
    deadline = time.monotonic() + args.max_life
    name_myself(args.title)
    ctx = multiprocessing.get_context('spawn')
    children = []
    base = args.ready + '.child'
    for rank in range(args.tp):
        path = '%s%d' % (base, rank)
        title = 'sglang::scheduler_TP%d %s' % (rank, args.marker)
        proc = ctx.Process(target=server_child, name='scheduler_TP%d' % rank,
                           args=(rank, rank, args.child_mib, title, path, args.backend,
                                 args.max_life))
        proc.start()
        children.append((proc, path))
    mem = backend(args.backend)
    parent_alloc = {}
    if args.parent_mib:
        parent_alloc = {'0': {'mib': args.parent_mib, 'alloc_s': mem.alloc(0, args.parent_mib)}}
    ready_children = []
    for proc, path in children:
        while not os.path.exists(path):
            if not proc.is_alive():
                sys.stderr.write('child %s exited with %s before it was ready\n'
                                 % (proc.name, proc.exitcode))
                os._exit(3)
            if time.monotonic() > deadline:
                os._exit(4)
            time.sleep(0.05)
        with open(path) as handle:
            ready_children.append(json.load(handle))
    ready = identity()
    ready.update({'allocs': parent_alloc, 'children': ready_children, 'runtime': mem.info()})
    write_ready(args.ready, ready)
    sleep_until(deadline)


# --- nccl-rank ---------------------------------------------------------------------------------------

def cmd_nccl_rank(args):
    deadline = time.monotonic() + args.max_life
    # Once a peer is dead, an all_reduce never returns: the safety net must not depend on it.
    import threading  # pylint: disable=import-outside-toplevel
    net = threading.Timer(args.max_life, os._exit, (0,))
    net.daemon = True
    net.start()
    name_myself(args.title, 'sglang::scheduler_TP%d' % args.rank)
    ready = identity()
    ready.update({'rank': args.rank, 'gpu': args.rank, 'mib': args.mib})
    if args.backend == 'fake':
        mem = backend('fake')
        ready['alloc_s'] = mem.alloc(args.rank, args.mib)
        if args.rank > 0:
            mem.alloc(0, 291, peer=True)
        ready['runtime'] = mem.info()
        write_ready(args.ready, ready)
        sleep_until(deadline)
    mem = backend('torch')
    torch = mem.torch
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    if not (dist.is_available() and dist.is_nccl_available()):
        ready['skip'] = 'torch %s has no NCCL backend' % torch.__version__
        write_ready(args.ready, ready)
        os._exit(0)
    import datetime  # pylint: disable=import-outside-toplevel
    torch.cuda.set_device(args.rank)
    ready['alloc_s'] = mem.alloc(args.rank, args.mib)
    started = time.monotonic()
    dist.init_process_group('nccl', init_method='file://' + args.init_file, rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=600))
    vector = torch.ones(64 * MIB // 4, dtype=torch.float32, device='cuda')
    dist.all_reduce(vector)
    torch.cuda.synchronize()
    ready['nccl_setup_s'] = round(time.monotonic() - started, 3)
    version = torch.cuda.nccl.version()
    ready['nccl_version'] = '.'.join(str(x) for x in version) if isinstance(version, tuple) else str(version)
    ready['runtime'] = mem.info()
    ready['first_all_reduce_sum'] = float(vector[0].item())
    write_ready(args.ready, ready)
    while time.monotonic() < deadline:
        dist.all_reduce(vector)
        torch.cuda.synchronize()
        time.sleep(0.2)
    os._exit(0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    sub = parser.add_subparsers(dest='cmd', required=True)
    for name in ('hold', 'server', 'nccl-rank'):
        p = sub.add_parser(name)
        p.add_argument('--ready', required=True)
        p.add_argument('--title')
        p.add_argument('--max-life', type=float, default=420.0)
        p.add_argument('--backend', choices=('torch', 'fake'), default='torch')
        p.add_argument('--marker', default='')
    hold = sub.choices['hold']
    hold.add_argument('--gpu', action='append', default=[], help='INDEX:MIB, repeatable')
    hold.add_argument('--comm')
    hold.add_argument('--ignore-term', action='store_true')
    hold.add_argument('--fork-child', action='store_true')
    hold.add_argument('--import-first', action='store_true',
                      help='import torch before taking --title/--comm (as SGLang does)')
    hold.add_argument('--load-s', type=float, default=0.0, help='wait this long before allocating')
    server = sub.choices['server']
    server.add_argument('--tp', type=int, default=1)
    server.add_argument('--child-mib', type=int, default=2048)
    server.add_argument('--parent-mib', type=int, default=1024)
    rank = sub.choices['nccl-rank']
    rank.add_argument('--rank', type=int, required=True)
    rank.add_argument('--world', type=int, default=2)
    rank.add_argument('--init-file', required=True, help='FileStore path, the same for every rank')
    rank.add_argument('--mib', type=int, default=2048)
    args = parser.parse_args(argv)
    if args.cmd == 'hold':
        cmd_hold(args)
    elif args.cmd == 'server':
        cmd_server(args)
    else:
        cmd_nccl_rank(args)


if __name__ == '__main__':
    main()
