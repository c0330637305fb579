"""The `nvidia-smi` stand-in: the query, reset and persistence calls the project makes.
Everything it reports comes from the stand-in NVML library, so it agrees with NVML."""
import os
import sys

from . import config, smi_format, smi_reset
from .errors import UsageError
from .nvml import Nvml, NvmlError

USAGE = """usage: nvidia-smi [-L] [-i ID] [--query-gpu=FIELDS | --query-compute-apps=FIELDS]
                  [--format=csv[,noheader][,nounits]] [-r | --gpu-reset] [-pm 0|1]"""


def parse(argv):
    opts = {"id": None, "query_gpu": None, "query_apps": None, "format": None,
            "reset": False, "pm": None, "list": False}
    it = iter(argv)
    for arg in it:
        key, eq, val = arg.partition("=")
        if key in ("-i", "--id"):
            opts["id"] = val if eq else next(it, None)
            if not opts["id"]:
                raise UsageError("option %s needs a value" % key)
        elif key == "--query-gpu" and eq:
            opts["query_gpu"] = val
        elif key == "--query-compute-apps" and eq:
            opts["query_apps"] = val
        elif key == "--format" and eq:
            opts["format"] = val
        elif key in ("-r", "--gpu-reset") and not eq:
            opts["reset"] = True
        elif key in ("-pm", "--persistence-mode"):
            val = val if eq else next(it, None)
            if val not in ("0", "1"):
                raise UsageError("Invalid persistence mode %r: use 0 or 1" % val)
            opts["pm"] = int(val)
        elif key in ("-L", "--list-gpus") and not eq:
            opts["list"] = True
        else:
            raise UsageError("Invalid combination of input arguments: unknown option %r" % arg)
    return opts


def select(gpus, ident):
    if ident is None:
        return gpus
    chosen = []
    for want in ident.split(","):
        w = want.strip().lower()
        match = [g for g in gpus if w in (str(g["index"]), g["uuid"].lower(),
                                          g["pci_bus_id"].lower(), g["pci_bus_id"][4:].lower())]
        if not match:
            return None
        chosen += match
    return chosen


def process_name(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode(errors="replace")
        if argv0:
            return argv0
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return "[Not Found]"


def query(opts, gpus):
    header, units = smi_format.parse_format(opts["format"] or "csv")
    if opts["query_gpu"]:
        fields = smi_format.parse_fields(opts["query_gpu"], smi_format.GPU_FIELDS)
        rows = [(dict(g, count=len(gpus)),) for g in gpus]
        out = smi_format.render(fields, smi_format.GPU_FIELDS, rows, header, units)
    else:
        fields = smi_format.parse_fields(opts["query_apps"], smi_format.APP_FIELDS)
        rows = [(dict(p, name=process_name(p["pid"])), g) for g in gpus for p in g["processes"]]
        out = smi_format.render(fields, smi_format.APP_FIELDS, rows, header, units)
    if out:
        print(out)
    return 0


def reset(gpus):
    if os.geteuid() != 0:
        print("Unable to reset GPU: Insufficient Permissions. Run as root.", file=sys.stderr)
        return 4
    busy = [g for g in gpus if g["memory_used_mib"] > config.gpu_by_index(
        config.load(), g["index"]).get("leaked_mib", 0) or smi_reset.fd_holders(g["minor"])]
    if busy:
        for g in busy:
            print("GPU %s is currently in use by another process." % g["pci_bus_id"])
        print("\n%d device is currently being used by one or more other processes (e.g., "
              "Fabric Manager, CUDA application, graphics application such as an X server, or "
              "a monitoring application such as another instance of nvidia-smi). Please first "
              "kill all processes using this device and all compute applications running in "
              "the system." % len(busy))
        return 255
    indices = {g["index"] for g in gpus}

    def clear(cfg):
        for gpu in cfg["gpus"]:
            if gpu["index"] in indices:
                gpu["leaked_mib"] = 0

    config.update(clear)
    for g in gpus:
        print("GPU %s was successfully reset." % g["pci_bus_id"])
    print("All done.")
    return 0


def persistence(nvml, gpus, mode):
    for g in gpus:
        try:
            nvml.set_persistence(g["index"], mode)
        except NvmlError:
            print("Unable to set persistence mode for GPU %s: Insufficient Permissions"
                  % g["pci_bus_id"], file=sys.stderr)
            print("Terminating early due to previous errors.", file=sys.stderr)
            return 4
        print("%s persistence mode for GPU %s." % ("Enabled" if mode else "Disabled",
                                                   g["pci_bus_id"]))
    print("All done.")
    return 0


def run(argv):
    opts = parse(argv)
    if opts["query_gpu"] and opts["query_apps"]:
        raise UsageError("Only one of --query-gpu and --query-compute-apps may be given")
    if opts["reset"] and opts["id"] is None:
        raise UsageError("--gpu-reset needs -i ID (the GPU to reset)")
    with Nvml() as nvml:
        gpus = select([nvml.gpu(i) for i in range(nvml.count())], opts["id"])
        if gpus is None:
            print("No devices were found")
            return 6
        if opts["pm"] is not None:
            return persistence(nvml, gpus, opts["pm"])
    if opts["reset"]:
        return reset(gpus)
    if opts["query_gpu"] or opts["query_apps"]:
        return query(opts, gpus)
    if opts["list"]:
        for g in gpus:
            print("GPU %d: %s (UUID: %s)" % (g["index"], g["name"], g["uuid"]))
        return 0
    raise UsageError("nothing to do: this stand-in supports only the options below")


def main(argv=None):
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except smi_format.FieldError as exc:
        print(exc, file=sys.stderr)
        return 2
    except UsageError as exc:
        print("nvidia-smi: %s\n%s" % (exc, USAGE), file=sys.stderr)
        return 2
    except (OSError, NvmlError) as exc:
        # What the real one says when the driver cannot be reached.
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
              "driver. (%s)" % exc, file=sys.stderr)
        return 9
