"""gpu_text.printable: what a user puts in a process title or a cgroup name cannot forge a
line or drive the terminal once printed."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import printable


@pytest.mark.parametrize("raw, shown", [
    ("sglang::scheduler_TP0", "sglang::scheduler_TP0"),
    ("python3 -m sglang.launch_server --port 30000", "python3 -m sglang.launch_server --port 30000"),
    ("x\nGPU 0 free", "x\\x0aGPU 0 free"),
    ("\x1b[2J\x1b[1;1Hok", "\\x1b[2J\\x1b[1;1Hok"),
    ("a\rb\tc\x7f\x85", "a\\x0db\\x09c\\x7f\\x85"),
    ("evil\u202eexe.txt", "evil\\u202eexe.txt"),      # right-to-left override
    ("a\u2028b", "a\\u2028b"),                        # line separator
    ("zero\u200bwidth", "zero\\u200bwidth"),
    ("caf\u00e9 \u4e2d\u6587", "caf\u00e9 \u4e2d\u6587"),   # printable text stays
    ("bad\udcffbyte", "bad\\udcffbyte"),              # a surrogate from an undecodable byte
])
def test_printable(raw, shown):
    assert printable(raw) == shown
    assert printable(raw).isprintable()


def test_none_and_non_strings():
    assert printable(None) is None
    assert printable(42) == "42"
