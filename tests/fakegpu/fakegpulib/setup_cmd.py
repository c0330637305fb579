"""`fakegpu setup`: config plus device files (regular files) under $FAKEGPU_ROOT."""
import os
import re
import uuid

from . import config, faults, paths
from .errors import UsageError


def parse_minors(text, count):
    if text is None:
        return list(range(count))
    parts = text.split(",")
    try:
        minors = [int(p) for p in parts]
    except ValueError:
        raise UsageError("--minors %r: expected comma-separated integers" % text)
    if len(minors) != count:
        raise UsageError("--minors %r: has %d entries, --gpus is %d" % (text, len(minors), count))
    if len(set(minors)) != count or any(m < 0 or m > 255 for m in minors):
        raise UsageError("--minors %r: must be distinct integers in 0..255" % text)
    return minors


def validate(args):
    if not 1 <= args.gpus <= config.MAX_GPUS:
        raise UsageError("--gpus %r: must be in 1..%d" % (args.gpus, config.MAX_GPUS))
    if not 1 <= args.memory_mib <= 1 << 24:
        raise UsageError("--memory-mib %r: must be in 1..%d" % (args.memory_mib, 1 << 24))
    if not 0 <= args.reserved_mib < args.memory_mib:
        raise UsageError("--reserved-mib %r: must be in 0..%d (below --memory-mib)"
                         % (args.reserved_mib, args.memory_mib - 1))
    if not args.name or len(args.name) > 95 or not re.fullmatch(r"[ -~]+", args.name):
        raise UsageError("--name %r: must be 1..95 printable ASCII characters" % args.name)
    if not 0 <= args.context_uncharged_mib <= 1024:
        raise UsageError("--context-uncharged-mib %r: must be in 0..1024" % args.context_uncharged_mib)
    if args.release_lag_ms < 0:
        raise UsageError("--release-lag-ms %r: must be >= 0" % args.release_lag_ms)
    return parse_minors(args.minors, args.gpus)


def build_config(args, minors, old):
    old_gpus = {g.get("index"): g for g in (old or {}).get("gpus", [])}
    gpus = []
    for index, minor in enumerate(minors):
        prev = old_gpus.get(index, {})
        gpus.append({
            "index": index,
            "minor": minor,
            # Kept across re-runs so a UUID a caller recorded stays valid.
            "uuid": prev.get("uuid") or "GPU-%s" % uuid.uuid4(),
            "name": args.name,
            "pci_bus_id": config.bus_id_for(index),
            "memory_total_mib": args.memory_mib,
            "reserved_mib": args.reserved_mib,
            "leaked_mib": int(prev.get("leaked_mib", 0)),
            "context_uncharged_mib": args.context_uncharged_mib,
        })
        if prev.get("faults"):
            gpus[-1]["faults"] = prev["faults"]
    return {
        "version": 1,
        "driver_version": "580.159.04",
        "cuda_version": 13000,
        "release_lag_ms": args.release_lag_ms,
        "hang": (old or {}).get("hang"),
        "gpus": gpus,
    }


def make_device_files(minors):
    os.makedirs(paths.dev_path(""), exist_ok=True)
    for name in ["nvidiactl", "nvidia-uvm"] + ["nvidia%d" % m for m in minors]:
        path = paths.dev_path(name)
        if not os.path.exists(path):
            # Opened and mapped by holders; never written, so it stays empty.
            with open(path, "a"):
                pass
            os.chmod(path, 0o666)


def run(args):
    minors = validate(args)
    for d in (paths.alloc_dir(), paths.dead_dir()):
        os.makedirs(d, exist_ok=True)
    with config.locked():
        try:
            old = config.load()
        except UsageError:
            old = None
        cfg = build_config(args, minors, old)
        make_device_files(minors)
        faults.make_xid_log()
        config.write(cfg)
    print("fakegpu: %d GPU(s) under %s" % (len(minors), paths.root()))
    return 0
