"""`fakegpu leak`, `lag` and `hang`: the driver knobs, kept in config.json."""
import re

from . import config
from .errors import UsageError

NAME_RE = re.compile(r"nvml[A-Za-z0-9_]+")


def leak(args):
    if args.clear and args.mib is not None:
        raise UsageError("leak: give either --mib or --clear, not both")
    if not args.clear and args.mib is None:
        raise UsageError("leak: give --mib M (or --clear)")
    if args.mib is not None and args.mib < 0:
        raise UsageError("--mib %r: must be >= 0" % args.mib)

    def change(cfg):
        targets = cfg["gpus"] if args.gpu is None else [config.gpu_by_index(cfg, args.gpu)]
        if args.clear:
            for gpu in targets:
                gpu["leaked_mib"] = 0
            return
        if args.gpu is None:
            raise UsageError("leak --mib needs --gpu IDX")
        gpu = targets[0]
        room = gpu["memory_total_mib"] - gpu["reserved_mib"]
        if args.mib > room:
            raise UsageError("--mib %r: more than GPU %d can hold (%d MiB)"
                             % (args.mib, gpu["index"], room))
        gpu["leaked_mib"] = args.mib

    config.update(change)
    return 0


def lag(args):
    if args.ms < 0:
        raise UsageError("--ms %r: must be >= 0" % args.ms)

    def change(cfg):
        cfg["release_lag_ms"] = args.ms

    config.update(change)
    return 0


def parse_calls(text):
    names = [n.strip() for n in text.split(",")]
    if names == ["all"]:
        return names
    for name in names:
        if not NAME_RE.fullmatch(name):
            raise UsageError("--calls %r: %r is not 'all' or an NVML function name" % (text, name))
    return names


def hang(args):
    if args.off and args.calls is not None:
        raise UsageError("hang: give either --calls or --off, not both")
    if not args.off and args.calls is None:
        raise UsageError("hang: give --calls all|NAME[,NAME] (or --off)")
    if args.seconds is not None and args.seconds <= 0:
        raise UsageError("--seconds %r: must be > 0" % args.seconds)
    calls = None if args.off else parse_calls(args.calls)

    def change(cfg):
        cfg["hang"] = None if args.off else {
            "calls": calls, "seconds": args.seconds if args.seconds is not None else 3600}

    config.update(change)
    return 0
