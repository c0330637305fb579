"""Argument parsing for `fakegpu`. Every bad value is refused before anything changes."""
import argparse
import sys

from . import faults, hold, knobs, setup_cmd, status
from .errors import UsageError


def build_parser():
    p = argparse.ArgumentParser(prog="fakegpu", description=(
        "Stand-in NVIDIA driver: set up GPUs under $FAKEGPU_ROOT (default /), hold memory, "
        "turn knobs. The C library build/libnvidia-ml.so.1 reads the same state."))
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("setup", help="write config and device files (idempotent)")
    s.add_argument("--gpus", type=int, default=8, help="GPU count, 1..64 (default 8)")
    s.add_argument("--memory-mib", type=int, default=97887)
    s.add_argument("--reserved-mib", type=int, default=615)
    s.add_argument("--name", default="NVIDIA H200")
    s.add_argument("--minors", help="minor number per index, e.g. 3,0,1,2 (default 0..N-1)")
    s.add_argument("--release-lag-ms", type=int, default=0)
    # MiB used per live context that NVML charges to no process (a real H200: 6-8; README)
    s.add_argument("--context-uncharged-mib", type=int, default=0)
    s.set_defaults(func=setup_cmd.run)

    h = sub.add_parser("hold", help="hold GPU memory until killed")
    h.add_argument("--gpu", action="append", default=[], metavar="IDX:MIB")
    h.add_argument("--child", action="append", default=[], metavar="IDX:MIB[:TITLE]",
                   help="spawn a child holding memory that survives our SIGKILL")
    h.add_argument("--peer", action="append", default=[], metavar="IDX:MIB",
                   help="also map MIB of peer memory on GPU IDX (NCCL/IPC): used there, charged "
                        "by NVML to no process; needs a --gpu context on another GPU")
    h.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM (children too)")
    h.add_argument("--title", help="process title shown in /proc/PID/comm and cmdline")
    h.add_argument("--exec-name", help="process name for /proc/PID/comm (default: title)")
    h.add_argument("--import-s", type=float, default=0.0, metavar="SECONDS",
                   help="start up this long (as a server imports torch) before taking --title")
    h.add_argument("--load-s", type=float, default=0.0, metavar="SECONDS",
                   help="after taking --title, load this long (as a server loads its weights) "
                        "before mapping any memory; what must fit is checked then, as cudaMalloc does")
    h.add_argument("--load-until", metavar="PATH",
                   help="after --load-s, load until PATH exists (at most an hour): a load as long as a "
                        "test needs, ended by it")
    h.add_argument("--fork-inherit", action="store_true",
                   help="fork a child after allocating that keeps the inherited fds")
    h.add_argument("--ready-file", help="write JSON here once everything is held")
    h.add_argument("--notify-fd", type=int, help=argparse.SUPPRESS)
    h.set_defaults(func=hold.run)

    lk = sub.add_parser("leak", help="memory held with no process (or --clear)")
    lk.add_argument("--gpu", type=int, metavar="IDX")
    lk.add_argument("--mib", type=int)
    lk.add_argument("--clear", action="store_true", help="clear (one GPU, or all without --gpu)")
    lk.set_defaults(func=knobs.leak)

    lg = sub.add_parser("lag", help="delay before a dead holder's memory comes back")
    lg.add_argument("--ms", type=int, required=True)
    lg.set_defaults(func=knobs.lag)

    hg = sub.add_parser("hang", help="make NVML calls block")
    hg.add_argument("--calls", help="'all' or NVML function names, comma-separated")
    hg.add_argument("--seconds", type=float, help="how long each call blocks (default 3600)")
    hg.add_argument("--off", action="store_true")
    hg.set_defaults(func=knobs.hang)

    ft = sub.add_parser("fault", help="what a GPU's health reads answer (or --clear)")
    ft.add_argument("--gpu", type=int, metavar="IDX")
    ft.add_argument("name", nargs="?", metavar="FAULT", help=", ".join(sorted(faults.FAULTS)))
    ft.add_argument("value", nargs="?", help="ecc COUNT, recovery-action 0..5, hang-health SECONDS")
    ft.add_argument("--clear", action="store_true", help="clear (one GPU, or all without --gpu)")
    ft.set_defaults(func=faults.fault)

    xd = sub.add_parser("xid", help="log an Xid line to var/log/fakegpu/kernel.log (or --clear)")
    xd.add_argument("--gpu", type=int, metavar="IDX")
    xd.add_argument("xid", nargs="?", type=int)
    xd.add_argument("--text", default="GPU has fallen off the bus.")
    xd.add_argument("--pid", type=int)
    xd.add_argument("--at", type=float, help="epoch seconds (default now)")
    xd.add_argument("--clear", action="store_true")
    xd.set_defaults(func=faults.xid)

    st = sub.add_parser("status", help="GPUs and allocations as JSON")
    st.set_defaults(func=status.run)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print("fakegpu %s: error: %s" % (args.command, exc), file=sys.stderr)
        return 2
