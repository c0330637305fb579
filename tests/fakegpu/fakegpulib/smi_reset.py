"""Who holds a stand-in GPU, for `nvidia-smi --gpu-reset`: a reset is refused while any
process has the device file open (NVML clients included, as with the real driver) or
any context still holds memory on it."""
import os

from . import paths


def fd_holders(minor):
    """PIDs (other than ours) with dev/nvidia<minor> open. Slow (/proc scan), reset only."""
    target = os.path.realpath(paths.gpu_dev_path(minor))
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        fd_dir = "/proc/%s/fd" % entry
        try:
            for fd in os.listdir(fd_dir):
                try:
                    if os.readlink(os.path.join(fd_dir, fd)) == target:
                        pids.append(int(entry))
                        break
                except OSError:
                    continue
        except OSError:
            continue
    return pids
