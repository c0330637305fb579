"""Unit tests import the collection as Ansible does: ansible_collections.gpuops.reclaim.

`make collection-link` creates .build/collections/ansible_collections/gpuops/reclaim -> repo root.
The stand-in driver's test helpers (fakegpulib.testing) come from tests/fakegpu.
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', '..', '.build', 'collections'))
sys.path.insert(0, os.path.join(HERE, '..', 'fakegpu'))


@pytest.fixture(scope='session')
def stand_in_lib():
    """tests/fakegpu/build/libnvidia-ml.so.1, built once per session."""
    from fakegpulib.testing import build_lib  # pylint: disable=import-outside-toplevel
    build_lib()
