# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Text a node's users control, made safe to print on one line (issue 22).

Process titles (comm, argv), command lines and cgroup names are theirs to choose: any byte
but NUL in argv, anything but '/' and NUL in a cgroup directory name. A newline in one could
start a line of its own in a printed table (a forged "GPU 2: ... free"); an ESC sequence could
move the cursor, recolour or erase what a terminal shows. escape_text writes every such
character as a visible escape, so what was one field stays one field of one line.

Pure, stdlib only: the modules (managed hosts' Python 3.9+) and the controller's filters and
action plugins use the same function.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# C0 controls (newline, carriage return, tab, ESC, ...), DEL and the C1 controls (U+0085 NEL,
# U+009B CSI among them); the Unicode line and paragraph separators; the bidirectional
# embeddings, overrides and isolates that reorder what a terminal shows.
_UNSAFE = re.compile(u'[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]')
_NAMED = {u'\n': u'\\n', u'\r': u'\\r', u'\t': u'\\t'}


def _escape(match):
    char = match.group(0)
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return u'\\x%02x' % code if code < 0x100 else u'\\u%04x' % code


def escape_text(text):
    """`text` with every control, line-breaking or reordering character written as an escape
    (\\n, \\r, \\t, \\xNN, \\uNNNN); bytes are decoded as UTF-8 first (undecodable ones as
    U+FFFD); None stays None, anything else is turned to text first."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode('utf-8', 'replace')
    elif not isinstance(text, str):
        text = str(text)
    return _UNSAFE.sub(_escape, text)
