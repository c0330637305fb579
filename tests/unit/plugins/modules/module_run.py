"""Runs a module's main() in this process with the given arguments and returns its JSON result,
on ansible-core 2.19+ (patch_module_args) and before it (basic._ANSIBLE_ARGS: the collection
claims 2.16); and what the tests of each module's result against its RETURN share."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import json

import pytest
import yaml

from ansible.module_utils import basic


def run(module, capsys, **args):
    try:
        from ansible.module_utils import _internal   # ansible-core 2.19+
    except ImportError:
        _internal = None
    # A module runs on a managed host, never in the controller: once any test in this process has
    # loaded controller code (ansible-core sets _internal.is_controller then), a module's warn()
    # goes to the controller's display instead of its result, and a test of a warning fails in
    # the whole suite but not alone.
    was_controller = getattr(_internal, 'is_controller', False)
    if _internal is not None:
        _internal.is_controller = False
    try:
        return _run(module, capsys, args)
    finally:
        if _internal is not None:
            _internal.is_controller = was_controller


def _run(module, capsys, args):
    try:
        from ansible.module_utils.testing import patch_module_args   # ansible-core 2.19+
    except ImportError:       # before 2.19 AnsibleModule reads basic._ANSIBLE_ARGS
        patch_module_args = None
    if patch_module_args is not None:
        with patch_module_args(args):
            with pytest.raises(SystemExit):
                module.main()
    else:
        basic._ANSIBLE_ARGS = json.dumps({'ANSIBLE_MODULE_ARGS': args}).encode()
        try:
            with pytest.raises(SystemExit):
                module.main()
        finally:
            basic._ANSIBLE_ARGS = None
    return json.loads(capsys.readouterr().out)


# Ansible adds these to every result; a module documents them only where they say more.
ANSIBLE_KEYS = {'changed', 'failed', 'invocation', 'warnings'}


def documented(module):
    return yaml.safe_load(module.RETURN)


def keys_of(entries):
    found = set()
    for entry in entries:
        found |= set(entry)
    return found
