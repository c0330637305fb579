"""Reading and changing etc/fakegpu/config.json: every change is a locked
read-modify-write followed by an atomic rename, so readers (the C library included)
never see a half-written file and concurrent changes do not lose each other."""
import contextlib
import fcntl
import json
import os

from . import paths
from .errors import UsageError

MAX_GPUS = 64
# Bus ids of an 8-GPU HGX H200 board; further GPUs get made-up ones.
HGX_BUSES = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]


def bus_id_for(index):
    bus = HGX_BUSES[index] if index < len(HGX_BUSES) else 0x40 + index
    return "00000000:%02X:00.0" % bus


def load():
    path = paths.config_path()
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise UsageError("no stand-in GPU config at %s: run `fakegpu setup` first" % path)
    except ValueError as exc:
        raise UsageError("config %s is not valid JSON: %s" % (path, exc))


def write(cfg):
    path = paths.config_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


@contextlib.contextmanager
def locked():
    """Holds the config lock; yields nothing. Use around load() ... write()."""
    lock_dir = os.path.dirname(paths.config_path())
    os.makedirs(lock_dir, exist_ok=True)
    fd = os.open(os.path.join(lock_dir, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def update(change):
    """Applies change(cfg) (which validates and raises UsageError before mutating)."""
    with locked():
        cfg = load()
        change(cfg)
        write(cfg)
        return cfg


def gpu_by_index(cfg, index):
    for gpu in cfg["gpus"]:
        if gpu["index"] == index:
            return gpu
    raise UsageError("GPU index %r does not exist (this host has %d GPUs: 0..%d)"
                     % (index, len(cfg["gpus"]), len(cfg["gpus"]) - 1))
