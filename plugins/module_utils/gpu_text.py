# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Text a node's users control, made safe to print on one line (issue 22).

Process titles (comm, argv), command lines, cgroup names and a runtime's container names are
theirs to choose: any byte but NUL in argv, anything but '/' and NUL in a cgroup directory name.
A newline in one could start a line of its own in a printed table (a forged "GPU 2: ... free");
an ESC sequence could move the cursor, recolour or erase what a terminal shows; a bidirectional
override reorders what it shows. escape_text writes every such character as a visible escape,
so what was one field stays one field of one line.

Pure, stdlib only: the modules (managed hosts' Python 3.9+) and the controller's filters and
action plugins use the same function.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import unicodedata

# Unicode categories that print nothing or move the cursor: controls (C0, DEL, C1), format
# characters (bidirectional embeddings, overrides and isolates, zero-width joiners), line and
# paragraph separators, surrogates, private use and unassigned code points.
_UNSAFE_CATEGORIES = frozenset(('Cc', 'Cf', 'Zl', 'Zp', 'Cs', 'Co', 'Cn'))
_NAMED = {u'\n': u'\\n', u'\r': u'\\r', u'\t': u'\\t'}


def _escape(char):
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return u'\\x%02x' % code
    if code < 0x10000:
        return u'\\u%04x' % code
    return u'\\U%08x' % code


def escape_text(text):
    """`text` with every control, format, separator or unassigned character written as an
    escape (\\n, \\r, \\t, \\xNN, \\uNNNN, \\UNNNNNNNN); bytes are decoded as UTF-8 first
    (undecodable ones as U+FFFD); None stays None, anything else is turned to text first.
    A plain space is kept."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode('utf-8', 'replace')
    elif not isinstance(text, str):
        text = str(text)
    if text.isprintable():
        return text
    return u''.join(_escape(c) if unicodedata.category(c) in _UNSAFE_CATEGORIES else c for c in text)
