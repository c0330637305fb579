"""CSV rendering of nvidia-smi's --query-gpu / --query-compute-apps, real spellings."""

# field -> (header, unit or None, getter(gpu))
GPU_FIELDS = {
    "index": ("index", None, lambda g: str(g["index"])),
    "uuid": ("uuid", None, lambda g: g["uuid"]),
    "gpu_uuid": ("uuid", None, lambda g: g["uuid"]),
    "name": ("name", None, lambda g: g["name"]),
    "gpu_name": ("name", None, lambda g: g["name"]),
    "pci.bus_id": ("pci.bus_id", None, lambda g: g["pci_bus_id"]),
    "gpu_bus_id": ("pci.bus_id", None, lambda g: g["pci_bus_id"]),
    "minor_number": ("minor_number", None, lambda g: str(g["minor"])),
    "memory.total": ("memory.total", "MiB", lambda g: g["memory_total_mib"]),
    "memory.used": ("memory.used", "MiB", lambda g: g["memory_used_mib"]),
    "memory.free": ("memory.free", "MiB", lambda g: g["memory_free_mib"]),
    "memory.reserved": ("memory.reserved", "MiB", lambda g: g["memory_reserved_mib"]),
    "persistence_mode": ("persistence_mode", None,
                         lambda g: "Enabled" if g["persistence_mode"] else "Disabled"),
    "count": ("count", None, lambda g: str(g["count"])),
}

# field -> (header, unit or None, getter(app, gpu))
APP_FIELDS = {
    "pid": ("pid", None, lambda a, g: str(a["pid"])),
    "process_name": ("process_name", None, lambda a, g: a["name"]),
    "name": ("process_name", None, lambda a, g: a["name"]),
    "used_memory": ("used_gpu_memory", "MiB", lambda a, g: a["used_mib"]),
    "used_gpu_memory": ("used_gpu_memory", "MiB", lambda a, g: a["used_mib"]),
    "gpu_uuid": ("gpu_uuid", None, lambda a, g: g["uuid"]),
    "gpu_bus_id": ("gpu_bus_id", None, lambda a, g: g["pci_bus_id"]),
    "gpu_name": ("gpu_name", None, lambda a, g: g["name"]),
}


class FieldError(Exception):
    pass


def parse_fields(text, table):
    fields = [f.strip() for f in text.split(",") if f.strip()]
    if not fields:
        raise FieldError("Missing field list.")
    for f in fields:
        if f not in table:
            raise FieldError('Field "%s" is not a valid field to query.' % f)
    return fields


def parse_format(text):
    opts = [o.strip() for o in text.split(",")]
    if not opts or opts[0] != "csv" or any(o not in ("csv", "noheader", "nounits") for o in opts):
        raise FieldError('"%s" is not a valid format. Use csv[,noheader][,nounits].' % text)
    return "noheader" not in opts, "nounits" not in opts


def _cell(unit, value, units):
    if unit is None:
        return value
    return "%d %s" % (value, unit) if units else str(value)


def render(fields, table, rows, header, units):
    """rows: argument tuples for the getters."""
    lines = []
    if header:
        lines.append(", ".join(
            table[f][0] + (" [%s]" % table[f][1] if table[f][1] else "") for f in fields))
    for row in rows:
        lines.append(", ".join(_cell(table[f][1], table[f][2](*row), units) for f in fields))
    return "\n".join(lines)
