"""Changing what /proc/PID/comm and /proc/PID/cmdline show, as setproctitle does."""
import ctypes
import ctypes.util

PR_SET_NAME = 15
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def set_comm(name):
    """comm holds at most 15 bytes; longer names are cut like the kernel does."""
    _libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def _arg_area():
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is stat field 3; arg_start/arg_end are fields 48 and 49.
    return int(fields[45]), int(fields[46])


def set_cmdline(title):
    """Overwrites the argv block in place (Python keeps its own copy of argv).

    The block ends in a non-NUL byte, which makes the kernel read it as a single string
    up to the first NUL, so /proc/PID/cmdline is exactly `title`."""
    start, end = _arg_area()
    size = end - start
    data = title.encode()[: max(size - 2, 0)] + b"\0"
    data = data + b" " * (size - len(data))
    ctypes.memmove(start, data, size)


def set_title(title, comm=None):
    set_cmdline(title)
    set_comm(comm or title)
