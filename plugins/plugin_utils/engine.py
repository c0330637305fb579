# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Decisions of the inference_service role about the engine on a host, pure.

engine_help_flags: the options an engine's argparse `--help` lists.
flags_unknown: wanted flags the engine does not know, each with the closest known one.
server_takeover: which processes on the server's port and GPUs are ours, adoptable,
    refused (another service or program), or strays.

Each filter is a file of its own in plugins/filter/ with its documentation (one plugin per
file is what ansible-doc and Galaxy list); the logic is here.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import difflib
import re

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.collections import is_sequence

from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text

# An option as argparse prints it at the start of a help entry: "  --tp-size TP_SIZE, --tp ..."
# or "  -tp, --tensor-parallel-size ...". Only words in the option column count, so
# "--flag" quoted inside a description never becomes a known flag.
_ENTRY = re.compile(r"^\s{1,24}(-{1,2}[A-Za-z0-9][^\s]*(?:[ ,]+.*)?)$")
_OPTION = re.compile(r"(?:^|[\s,])(--[A-Za-z0-9][A-Za-z0-9_.-]*)")


def engine_help_flags(text):
    """argparse help text -> sorted list of the long options it lists ('--tp-size', ...)."""
    if not isinstance(text, str):
        raise AnsibleFilterError("engine_help_flags: expected the help text as a string, got %s"
                                 % type(text).__name__)
    found = set()
    for line in text.splitlines():
        match = _ENTRY.match(line)
        if not match:
            continue
        # The option column ends where two spaces start the description.
        column = re.split(r"\s{2,}", match.group(1).strip(), maxsplit=1)[0]
        for option in _OPTION.findall(" " + column):
            # argparse prints BooleanOptionalAction as --[no-]flag in some versions
            found.add(option.rstrip(",.="))
    found.update(m.replace("[no-]", "") for m in list(found) if "[no-]" in m)
    return sorted(found)


def _option_name(key):
    return key if key.startswith("--") else "--" + key.replace("_", "-")


def flags_unknown(flags, known, positional=None):
    """Wanted flags the engine does not list: [{'key', 'flag', 'closest'}], sorted by key.
    An empty `known` list means the help could not be read: nothing is judged."""
    if not isinstance(flags, dict):
        raise AnsibleFilterError("flags_unknown: expected the flags dict, got %s" % type(flags).__name__)
    if not is_sequence(known):
        raise AnsibleFilterError("flags_unknown: expected the list of known flags, got %s" % type(known).__name__)
    positional = positional or []
    if not known:
        return []
    known = sorted(set(known))
    unknown = []
    for key in sorted(flags, key=str):
        if key in positional:
            continue
        option = _option_name(str(key))
        if option in known:
            continue
        close = difflib.get_close_matches(option, known, n=1, cutoff=0.6)
        unknown.append({"key": key, "flag": option, "closest": close[0] if close else None})
    return unknown


def _matches(proc, patterns):
    text = " ".join([proc.get("name") or "", proc.get("cmdline") or ""])
    return any(re.search(p, text) for p in patterns)


def _label(proc):
    # The command line and unit are the node's users' text: escaped, a sentence stays one line.
    return "PID %s (%s)" % (proc["pid"], escape_text((proc.get("cmdline") or proc.get("name") or "?")[:160]))


def server_takeover(port_owners, holders, unit, patterns, gpus=None):
    """Sort the processes on the server's port and GPUs.

    port_owners: [{pid, start_time, name, cmdline, unit}] listening on the server's port.
    holders: gpu_holders' holders of the server's GPUs (handles and protected ones are skipped).
    unit: the managed unit ('sglang.service'); patterns: regexes for the engine's command lines.
    gpus: the server's GPU indices; holders of none of them are left out (all when None).

    Returns {'ours': [pid], 'adopt': [{pid, start_time, name, cmdline, why}],
             'refuse': [sentence], 'strays': [holder]}:
    - ours: in the managed unit;
    - adopt: the engine started by hand (not in any service unit), on the port or the GPUs;
    - refuse: anything else on the port, or a GPU held by another service unit (stopping
      someone else's service is not this role's call);
    - strays: other holders of the server's GPUs outside any service (leftovers, to free).
    """
    if not is_sequence(port_owners) or not is_sequence(holders):
        raise AnsibleFilterError("server_takeover: expected two lists (port owners, GPU holders)")
    try:
        patterns = [re.compile(p) for p in (patterns or [])]
    except re.error as exc:
        raise AnsibleFilterError("server_takeover: bad adoption pattern: %s" % exc)
    result = {"ours": [], "adopt": [], "refuse": [], "strays": []}
    adopted = {}

    def adopt(proc, why):
        if proc["pid"] in adopted:
            adopted[proc["pid"]]["why"] += ", " + why
            return
        entry = {"pid": proc["pid"], "start_time": proc.get("start_time"), "name": proc.get("name"),
                 "cmdline": proc.get("cmdline") or proc.get("name"), "why": why}
        adopted[proc["pid"]] = entry
        result["adopt"].append(entry)

    for proc in port_owners:
        if proc.get("unit") == unit:
            result["ours"].append(proc["pid"])
        elif not _service(proc) and not proc.get("protected") and _matches(proc, patterns):
            adopt(proc, "listens on the port")
        else:
            result["refuse"].append("the port is taken by %s%s" % (_label(proc), _of_unit(proc)))
    wanted = None if gpus is None else set(str(g) for g in gpus)
    for holder in holders:
        if wanted is not None and not wanted & set(str(g) for g in holder.get("gpus") or []):
            continue
        where = ",".join(str(g) for g in holder.get("context_gpus") or holder.get("gpus") or [])
        if holder.get("kind") == "handle" or holder.get("protected"):
            continue  # a monitor's open handle or infrastructure: never a target, never in the way
        if holder.get("unit") == unit:
            result["ours"].append(holder["pid"])
        elif _service(holder):
            result["refuse"].append("GPU %s is held by %s%s" % (where, _label(holder), _of_unit(holder)))
        elif _matches(holder, patterns):
            adopt(holder, "holds GPU %s" % where)
        else:
            result["strays"].append(holder)
    result["ours"] = sorted(set(result["ours"]))
    return result


def _service(proc):
    return (proc.get("unit") or "").endswith(".service")


def _of_unit(proc):
    return " of %s" % escape_text(proc["unit"]) if proc.get("unit") else ""
