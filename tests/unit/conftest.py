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


@pytest.fixture(autouse=True)
def fresh_module_warnings():
    """A module run in-process keeps its warnings in ansible-core's process-wide registry, which
    no module run clears: one test's warnings would show in the next module's result (and a
    repeated warning is dropped as already given). Each test starts with none, as each real
    module run does in its own process."""
    from ansible.module_utils.common import warnings  # pylint: disable=import-outside-toplevel
    warnings._global_warnings.clear()  # pylint: disable=protected-access
    warnings._global_deprecations.clear()  # pylint: disable=protected-access
    yield
