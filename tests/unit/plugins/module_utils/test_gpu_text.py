"""gpu_text.escape_text: what a node's users write (titles, command lines, cgroup names) prints
as one field of one line (issue 22 item 6)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text


@pytest.mark.parametrize('raw, shown', [
    ('sglang::scheduler_TP0', 'sglang::scheduler_TP0'),          # ordinary text unchanged
    ('a b/c.service -- x=1 "q" \'q\' \\', 'a b/c.service -- x=1 "q" \'q\' \\'),
    ('a\nb', 'a\\nb'), ('a\rb', 'a\\rb'), ('a\tb', 'a\\tb'),
    ('\x1b[2J\x1b[H', '\\x1b[2J\\x1b[H'),                        # ESC: clear screen, home
    ('\x00\x07\x08\x7f', '\\x00\\x07\\x08\\x7f'),
    (u'\x85\x9b', '\\x85\\x9b'),                                  # C1: NEL, CSI
    (u'a\u2028b\u2029', 'a\\u2028b\\u2029'),                     # line / paragraph separators
    (u'\u202eevil\u2066', '\\u202eevil\\u2066'),                 # bidi override, isolate
    (u'caf\xe9 \u4e2d', u'caf\xe9 \u4e2d'),                       # printable non-ASCII unchanged
    (u'zero\u200bwidth', 'zero\\u200bwidth'),                    # format characters (Cf)
    (u'bad\udcffbyte', 'bad\\udcffbyte'),                        # a surrogate from an undecodable byte
    (u'x\nGPU 0 free', 'x\\nGPU 0 free'),                        # a forged table line
])
def test_escape_text(raw, shown):
    assert escape_text(raw) == shown
    assert escape_text(raw).isprintable()


def test_bytes_none_and_other_types():
    assert escape_text(b'x\n\xff') == u'x\\n\ufffd'
    assert escape_text(None) is None
    assert escape_text(4242) == '4242'


def test_the_escaped_text_has_no_line_break_for_any_character():
    every = u''.join(chr(c) for c in range(0x3000))
    assert len(escape_text(every).splitlines()) == 1
