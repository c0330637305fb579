"""`fakegpu fault` and `fakegpu xid`: what the health reads answer (issue 30 item 6).

`fault` keeps gpus[].faults in config.json (the C library answers from it); `xid` appends a
kernel log line to var/log/fakegpu/kernel.log, the file lab nodes point the Xid reader at
(they cannot write the real kernel ring buffer). Each line is what `journalctl -k -o
short-unix` prints for the driver's own Xid report.
"""
import os
import socket
import time

from . import config, paths
from .errors import UsageError

# fault NAME -> (faults key, whether it takes a value)
FAULTS = {
    "lost": ("lost", False),
    "row-remap-pending": ("remap_pending", False),
    "row-remap-failed": ("remap_failed", False),
    "ecc": ("ecc_volatile_unc", True),
    "retired-pending": ("retired_pending", False),
    "recovery-action": ("recovery_action", True),
    "hang-health": ("hang_health_s", True),
}
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's values in nvml.h (driver 580): none, GPU reset, node
# reboot, drain P2P, drain and reset, GPU reset through the bus.
RECOVERY_ACTIONS = range(0, 6)


def xid_log_path():
    return paths.under_root("var/log/fakegpu/kernel.log")


def make_xid_log(truncate=False):
    """The kernel log stand-in, empty, as a booted node's kernel log holds no Xid: root's,
    0644 (the Xid reader refuses a file others may write)."""
    os.makedirs(os.path.dirname(xid_log_path()), exist_ok=True)
    fd = os.open(xid_log_path(), os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0), 0o644)
    try:
        os.fchmod(fd, 0o644)     # a test may have opened it to everyone
    finally:
        os.close(fd)


def _value(name, text):
    if text is None:
        raise UsageError("fault %s needs a value" % name)
    try:
        value = float(text) if name == "hang-health" else int(text)
    except ValueError:
        raise UsageError("fault %s %r: not a number" % (name, text))
    if name == "recovery-action" and value not in RECOVERY_ACTIONS:
        raise UsageError("fault recovery-action %r: must be 0..5 (nvmlGpuRecoveryAction_t)" % text)
    if value < 0 or (name == "hang-health" and value == 0):
        raise UsageError("fault %s %r: must be %s" % (name, text, "> 0" if name == "hang-health" else ">= 0"))
    return value


def fault(args):
    if args.clear and args.name:
        raise UsageError("fault: give either a fault or --clear, not both")
    if not args.clear and not args.name:
        raise UsageError("fault: give a fault (%s) or --clear" % ", ".join(sorted(FAULTS)))
    if args.name and args.name not in FAULTS:
        raise UsageError("fault %r: not one of %s" % (args.name, ", ".join(sorted(FAULTS))))
    if args.name:
        key, takes = FAULTS[args.name]
        if takes:
            value = _value(args.name, args.value)
        elif args.value is not None:
            raise UsageError("fault %s takes no value, got %r" % (args.name, args.value))
        else:
            value = 1

    def change(cfg):
        targets = cfg["gpus"] if args.gpu is None else [config.gpu_by_index(cfg, args.gpu)]
        if args.clear:
            for gpu in targets:
                gpu.pop("faults", None)
            return
        if args.gpu is None:
            raise UsageError("fault %s needs --gpu IDX" % args.name)
        targets[0].setdefault("faults", {})[key] = value

    config.update(change)
    return 0


def xid_line(bus_id, xid, pid, text, at):
    """The line NVIDIA's kernel driver logs, as `journalctl -k -o short-unix` shows it, e.g.
    `1765000000.123456 node kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python3,
    GPU has fallen off the bus.`"""
    domain, bus, rest = bus_id.split(":")
    device = rest.split(".")[0]
    return "%.6f %s kernel: NVRM: Xid (PCI:%04x:%s:%s): %d, pid=%s, name=%s, %s\n" % (
        at, socket.gethostname(), int(domain, 16) & 0xffff, bus.lower(), device.lower(), xid,
        pid if pid is not None else "'<unknown>'", "python3" if pid is not None else "", text)


def xid(args):
    if args.clear:
        make_xid_log(truncate=True)
        return 0
    if args.gpu is None or args.xid is None:
        raise UsageError("xid: give --gpu IDX and the Xid number (or --clear)")
    if not 1 <= args.xid <= 999:
        raise UsageError("xid %r: must be in 1..999" % args.xid)
    cfg = config.load()
    gpu = config.gpu_by_index(cfg, args.gpu)
    line = xid_line(gpu["pci_bus_id"], args.xid, args.pid, args.text,
                    args.at if args.at is not None else time.time())
    make_xid_log()
    with open(xid_log_path(), "a") as f:
        f.write(line)
    return 0
