"""Fixtures the ladder's tests of more than one family share."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe as observe


@pytest.fixture
def managers(monkeypatch):
    """systemd's side of a unit's stop: each unit's is-active reads inactive once asked (a
    queued stop done), and user 1000's own manager runs. Returns what was asked, as whom."""
    asked = []

    def unit_state(argv, timeout, keywords=None):
        asked.append((' '.join(argv), (keywords or {}).get('user')))
        return 3, 'inactive'
    monkeypatch.setattr(observe, 'unit_state', unit_state)
    monkeypatch.setattr(observe, 'user_manager_call', lambda uid: ({}, {'user': uid}) if uid == 1000 else None)
    return asked
