"""Every module's documentation (DOCUMENTATION, EXAMPLES, RETURN) parses. That each key a module
returns is in its RETURN, and each documented key is returned by some path, is checked in the
module's own test file (test_gpu_holders.py, test_gpu_reclaim.py)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import yaml

from ansible_collections.gpuops.reclaim.plugins.modules import gpu_holders, gpu_reclaim


def test_every_module_documentation_parses():
    for module in (gpu_holders, gpu_reclaim):
        for text in (module.DOCUMENTATION, module.EXAMPLES, module.RETURN):
            assert yaml.safe_load(text)
