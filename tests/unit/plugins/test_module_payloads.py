"""The modules' AnsiballZ payloads carry every module_util they may import, also those imported
inside a function (gpu_patterns only with protect/match, gpu_lock only when the lock is taken,
gpu_nvidia by the vendor table): a file missing from the zip would fail only on a managed host,
and only on the path that needs it.

The payload is built by ansible-core's own module_common.recursive_finder, as the controller
does (so this is a controller-side test, not under modules/, where ansible-test offers only
module_utils), in a child Python: the collection finder it needs would otherwise take over the
`ansible_collections` imports of the other tests.
"""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..'))
# A checkout reaches itself through `make collection-link`; ansible-test's copy already sits at
# .../ansible_collections/gpuops/reclaim.
COLLECTIONS = (os.path.dirname(os.path.dirname(os.path.dirname(REPO)))
               if os.path.basename(os.path.dirname(os.path.dirname(REPO))) == 'ansible_collections'
               else os.path.join(REPO, '.build', 'collections'))
MODULE_UTILS = 'ansible_collections/gpuops/reclaim/plugins/module_utils/'

BUILD = r'''
import datetime, io, json, sys, zipfile
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
from ansible.executor.module_common import recursive_finder
from ansible._internal._ansiballz._builder import ExtensionManager

collections, name, path = sys.argv[1:]
_AnsibleCollectionFinder(paths=[collections])._install()
with open(path, 'rb') as handle:
    source = handle.read()
payload = zipfile.ZipFile(io.BytesIO(), mode='w')
recursive_finder(name, 'ansible_collections.gpuops.reclaim.plugins.modules.' + name, source, payload,
                 datetime.datetime.now(datetime.timezone.utc), ExtensionManager())
print(json.dumps(payload.namelist()))
'''


def payload_module_utils(module):
    """The collection's module_utils files in the AnsiballZ payload of `module`."""
    if not os.path.isdir(os.path.join(COLLECTIONS, 'ansible_collections', 'gpuops', 'reclaim')):
        pytest.skip('the collection link is missing: run `make collection-link`')
    path = os.path.join(REPO, 'plugins', 'modules', module + '.py')
    out = subprocess.run([sys.executable, '-c', BUILD, COLLECTIONS, module, path], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    names = json.loads(out.stdout.splitlines()[-1])
    return set(n[len(MODULE_UTILS):] for n in names if n.startswith(MODULE_UTILS) and n != MODULE_UTILS + '__init__.py')


ROLE_MODULE_UTILS = {'gpu_adopt.py', 'gpu_listen.py'}
# run_metrics' own (issue 33): the metrics file, nothing of the survey. gpu_reclaim carries them too
# (its `metrics` option, imported only when asked: issue 31 item 5).
METRICS_MODULE_UTILS = {'gpu_metrics.py', 'prom_text.py', 'gpu_metrics_file.py'}


def test_gpu_reclaim_payload_has_every_module_util():
    # gpu_reclaim reaches all of them; gpu_patterns, gpu_lock, gpu_nvidia and the metrics file only from
    # inside functions. (all but those of the inference_service role's modules, gpu_adopt and gpu_listen)
    every = set(f for f in os.listdir(os.path.join(REPO, 'plugins', 'module_utils')) if f.endswith('.py'))
    assert {'gpu_patterns.py', 'gpu_lock.py', 'gpu_nvidia.py', 'gpu_metrics_file.py'} <= every
    # gpu_health's verdict is gpu_holders' alone: gpu_reclaim carries its codes (gpu_health_codes,
    # for gpu_say) since gpu_say no longer imports gpu_health (issue 32 item 5: no import cycle).
    assert payload_module_utils('gpu_reclaim') == every - ROLE_MODULE_UTILS - {'gpu_health.py'}


def test_run_metrics_payload_has_only_the_metrics_files():
    # Written at the end of every run on every node: it compiles two small files, not the survey.
    assert payload_module_utils('run_metrics') == METRICS_MODULE_UTILS


def test_gpu_holders_payload_has_what_it_imports():
    shipped = payload_module_utils('gpu_holders')
    assert {'gpu_flow.py', 'gpu_patterns.py', 'gpu_nvidia.py', 'gpu_observe.py', 'gpu_health.py'} <= shipped
    assert 'gpu_lock.py' not in shipped   # only gpu_reclaim takes the host lock


def test_the_role_modules_payloads_have_what_they_import():
    adopt = payload_module_utils('service_adopt')
    assert {'gpu_adopt.py', 'gpu_act.py', 'gpu_observe.py', 'gpu_owner.py', 'gpu_text.py', 'gpu_say.py'} <= adopt
    listen = payload_module_utils('port_owner')
    assert {'gpu_listen.py', 'gpu_observe.py', 'gpu_owner.py', 'gpu_trust.py', 'gpu_text.py'} <= listen
    # Neither carries the ladder.
    assert not {'gpu_flow.py', 'gpu_decide.py'} & (adopt | listen)
