"""`fakegpu status`: GPUs and live allocations, as JSON, through the stand-in NVML."""
import json
import os

from . import config, paths
from .errors import UsageError
from .nvml import Nvml, NvmlError


def registry():
    """Raw registry entries (including ones NVML cannot list, e.g. other PID namespaces)."""
    out = []
    try:
        names = sorted(os.listdir(paths.alloc_dir()))
    except FileNotFoundError:
        return out
    for name in names:
        if name.startswith("."):
            continue
        try:
            with open(os.path.join(paths.alloc_dir(), name)) as f:
                fields = dict(line.split("=", 1) for line in f.read().split())
        except (OSError, ValueError):
            continue
        out.append({"id": name, **{k: int(v) for k, v in fields.items()}})
    return out


def run(args):
    cfg = config.load()
    try:
        with Nvml() as nvml:
            gpus = [nvml.gpu(i) for i in range(nvml.count())]
    except (OSError, NvmlError) as exc:
        raise UsageError("cannot query the stand-in NVML: %s" % exc)
    # Registry entries NVML no longer counts are dead and past their lag.
    print(json.dumps({
        "root": paths.root(),
        "release_lag_ms": cfg.get("release_lag_ms", 0),
        "hang": cfg.get("hang"),
        "gpus": [dict(g, leaked_mib=config.gpu_by_index(cfg, g["index"]).get("leaked_mib", 0))
                 for g in gpus],
        "allocations": registry(),
    }, indent=2))
    return 0
