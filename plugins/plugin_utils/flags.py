# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render an inference server's flags dict into a command line, and compare it with a running server's.

The logic of the filters cli_flags, systemd_quote, flags_running and flags_diff; each filter is
a file of its own in plugins/filter/ with its documentation (one plugin per file is what
ansible-doc and Galaxy list).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.collections import is_sequence

# Filters run on the controller (Python 3 only): str is the only string type.
string_types = (str,)

_KEY = re.compile(r"^(--)?[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Characters systemd's ExecStart parser takes literally outside quotes.
_SAFE = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def _flag_name(key):
    if not isinstance(key, string_types) or not _KEY.match(key):
        raise AnsibleFilterError("cli_flags: bad flag name %r: use letters, digits, '_', '-', '.'" % (key,))
    if key.startswith("--"):
        return key  # spelled out by the user: taken verbatim
    # Both SGLang and vLLM spell their flags with dashes (ServerArgs field
    # mem_fraction_static is --mem-fraction-static).
    return "--" + key.replace("_", "-")


def _scalar(key, value):
    if isinstance(value, bool):
        raise AnsibleFilterError("cli_flags: flag %r: booleans are only allowed as the whole value, got %r in a list" % (key, value))
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (int, string_types)):
        return str(value)
    if isinstance(value, dict):
        # e.g. vLLM --compilation-config '{"level": 3}'
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    raise AnsibleFilterError("cli_flags: flag %r has a value of unsupported type %s: %r" % (key, type(value).__name__, value))


def cli_flags(flags, positional=None, grouped=False):
    """dict -> argv list. true: bare flag; false/null: omitted; list: the flag
    repeated once per item; anything else: '--flag value'. Keys are sorted so
    that the same flags always give the same command line (no spurious restart).
    Keys named in `positional` (the engine table's, e.g. vLLM's `model` in
    `vllm serve MODEL`) come first, as bare values, in the order given."""
    if flags is None:
        flags = {}
    if not isinstance(flags, dict):
        raise AnsibleFilterError("cli_flags: expected a dict of flags, got %s: %r" % (type(flags).__name__, flags))
    if positional is None:
        positional = []
    if not is_sequence(positional):
        raise AnsibleFilterError("cli_flags: positional must be a list of flag names, got %r" % (positional,))
    groups = []
    for key in positional:
        value = flags.get(key)
        if value is None or value is False:
            continue
        if value is True or is_sequence(value):
            raise AnsibleFilterError("cli_flags: flag %r is positional: give it one value, got %r" % (key, value))
        groups.append([_scalar(key, value)])
    for key in sorted(flags, key=str):
        if key in positional:
            continue
        name = _flag_name(key)
        value = flags[key]
        if value is True:
            groups.append([name])
        elif value is False or value is None:
            continue
        elif is_sequence(value):
            groups.extend([name, _scalar(key, item)] for item in value)
        else:
            groups.append([name, _scalar(key, value)])
    if grouped:
        return groups
    return [word for group in groups for word in group]


def systemd_quote(arg):
    """Quote one word (or each word of a list) for a systemd ExecStart= line.
    '%' starts a specifier and '$' a variable in ExecStart, so both are doubled."""
    if is_sequence(arg):
        return [systemd_quote(a) for a in arg]
    if not isinstance(arg, string_types):
        arg = str(arg)
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if arg and _SAFE.match(arg):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return '"%s"' % escaped


def _field(key):
    """Flag key -> the server's own field name (--tp-size / tp-size -> tp_size)."""
    return str(key).lstrip("-").replace("-", "_")


def _same(wanted, running):
    if wanted is False or wanted is None:
        return running in (False, None, 0, "", [])
    if isinstance(wanted, bool) or isinstance(running, bool):
        return bool(wanted) == bool(running)
    if isinstance(wanted, (int, float)) and not isinstance(running, (list, dict)):
        try:
            return float(wanted) == float(running)
        except (TypeError, ValueError):
            return False
    if isinstance(wanted, string_types) and isinstance(running, (int, float)):
        try:
            return float(wanted) == float(running)
        except ValueError:
            return False
    return wanted == running


def flags_running(flags, server_info):
    """The wanted flags as the server reports them: {field: running value}."""
    if not isinstance(flags, dict) or not isinstance(server_info, dict):
        raise AnsibleFilterError("flags_running: expected two dicts, got %s and %s"
                                 % (type(flags).__name__, type(server_info).__name__))
    return dict((_field(k), server_info[_field(k)]) for k in sorted(flags, key=str) if _field(k) in server_info)


def flags_diff(flags, server_info):
    """Wanted flags the server reports a different value for, as sentences.
    Flags the server does not report are not judged."""
    running = flags_running(flags, server_info)
    return ["%s: wanted %r, running %r" % (f, flags[k], running[f])
            for k in sorted(flags, key=str) for f in [_field(k)]
            if f in running and not _same(flags[k], running[f])]
