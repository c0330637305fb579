"""Creating a context on a stand-in GPU, the way a CUDA process does on a real one.

The process opens dev/nvidia<minor>, nvidiactl and nvidia-uvm, maps `mib` MiB of the GPU
file (so /proc/PID/maps shows it), takes an OFD lock on a unique byte of that file through
the same descriptor, and registers the context under var/lib/fakegpu/alloc/. The lock is
what keeps the memory allocated: it lives while any descriptor sharing that open file
description lives, so a forked child keeps a dead parent's memory, as on a real GPU."""
import ctypes
import ctypes.util
import fcntl
import os
import secrets
import struct

from . import paths

PROT_READ, PROT_WRITE, MAP_SHARED = 1, 2, 1
MADV_DONTFORK = 10
MAP_FAILED = ctypes.c_void_p(-1).value
MIB = 1 << 20

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

# struct flock on x86_64/aarch64: short type, short whence, off_t start, off_t len, pid_t pid.
_FLOCK = "hhqqi4x"


def _map(fd, size, dontfork=False):
    # mmap(2) directly: Python's mmap refuses lengths beyond the (empty) file's size,
    # and an untouched shared mapping costs no memory however large it is.
    addr = _libc.mmap(None, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
    if addr in (None, MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, "mmap of %d bytes failed: %s" % (size, os.strerror(err)))
    if dontfork:
        _libc.madvise(addr, size, MADV_DONTFORK)
    return addr


def _try_lock(fd, offset):
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK,
                    struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
        return True
    except BlockingIOError:
        return False
    except PermissionError:
        return False


def pidns_inode():
    link = os.readlink("/proc/self/ns/pid")     # "pid:[4026531836]"
    return int(link[link.index("[") + 1:-1])


class Context:
    """One allocation; kept referenced for as long as the memory must stay held.

    `peer`: peer memory (NCCL buffers, CUDA IPC) mapped from a process whose context is on
    another GPU: it counts as used on this GPU, and NVML charges it to no process."""

    def __init__(self, index, minor, mib, peer=False):
        self.index, self.minor, self.mib, self.peer = index, minor, mib, peer
        self.ctl_fd = os.open(paths.dev_path("nvidiactl"), os.O_RDWR)
        self.uvm_fd = os.open(paths.dev_path("nvidia-uvm"), os.O_RDWR)
        self.gpu_fd = os.open(paths.gpu_dev_path(minor), os.O_RDWR)
        self.gpu_addr = _map(self.gpu_fd, mib * MIB)
        _map(self.ctl_fd, 4096)
        # A forked child of a real CUDA process does not inherit the uvm mapping.
        _map(self.uvm_fd, 4096, dontfork=True)
        self.offset = self._lock_unique_byte()
        self.nonce = "%d-%s" % (minor, secrets.token_hex(12))
        self._register()

    def _lock_unique_byte(self):
        for _unused in range(1000):
            offset = secrets.randbits(40) + 1
            if _try_lock(self.gpu_fd, offset):
                return offset
        raise OSError("could not take a context lock on %s" % paths.gpu_dev_path(self.minor))

    def _register(self):
        body = "minor=%d\noffset=%d\nmib=%d\npid=%d\npidns=%d\npeer=%d\n" % (
            self.minor, self.offset, self.mib, os.getpid(), pidns_inode(), int(self.peer))
        final = os.path.join(paths.alloc_dir(), self.nonce)
        tmp = os.path.join(paths.alloc_dir(), ".tmp-" + self.nonce)
        with open(tmp, "w") as f:
            f.write(body)
        os.rename(tmp, final)
