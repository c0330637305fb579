# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Text a node's users control (process names, command lines, cgroup names, a runtime's
container names), made safe to print in a sentence or a table row.

Pure. Any local user can title a process or name a cgroup with a newline, an escape sequence
or a bidirectional override: printed raw, that forges lines of a table or of a message, or
rewrites the operator's terminal. `printable` writes every such character as a visible escape.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import unicodedata

# Unicode categories that print nothing or move the cursor: controls (C0, DEL, C1), format
# characters (bidirectional overrides, zero-width joiners), line and paragraph separators,
# surrogates (undecodable bytes), unassigned code points.
_UNSAFE_CATEGORIES = frozenset(('Cc', 'Cf', 'Zl', 'Zp', 'Cs', 'Co', 'Cn'))


def _escape(char):
    code = ord(char)
    if code < 0x100:
        return '\\x%02x' % code
    if code < 0x10000:
        return '\\u%04x' % code
    return '\\U%08x' % code


def printable(text):
    """`text` with every control, format or separator character written as \\xNN, \\uNNNN or
    \\UNNNNNNNN; None stays None, anything else becomes its str() first. A plain space is kept."""
    if text is None:
        return None
    text = text if isinstance(text, str) else str(text)
    if text.isprintable():
        return text
    return ''.join(_escape(c) if unicodedata.category(c) in _UNSAFE_CATEGORIES else c for c in text)
