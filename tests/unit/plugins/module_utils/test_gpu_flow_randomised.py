"""The reclaim ladder on random holder sets, on this host, against the stand-in driver.

Real processes (fakegpu hold), real signals, the real pynvml: only the lab's SSH and systemd
are missing here (the lab tests cover those). Hypothesis draws process trees, names, SIGTERM
handling and GPU selections; afterwards nothing protected or out of scope was signalled and
every selected GPU is free or explained.
"""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from fakegpulib.testing import FakeGpuRoot

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act as act

COLLECTIONS = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', '.build', 'collections'))
# The ladder runs in its own process, as the module does: the holders are not its children
# (a module never runs the processes it reclaims), and pynvml loads the stand-in library.
RUNNER = '''
import json, sys
sys.path.insert(0, %r)
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_flow import Ladder, Surveyor
args = json.loads(sys.argv[1])
surveyor = Surveyor(gpus=args['gpus'], protect=args['protect'], dev_dir=args['dev_dir'])
print(json.dumps(Ladder(surveyor, term_timeout=0.5, release_timeout=5, passes=2).run()))
''' % COLLECTIONS

GPUS = 4
NAMES = ['python3', 'sglang::scheduler_TP1', '[kworker/3:1]', 'VLLM::Worker_TP0', 'nv-hostengine',
         'keepme-notebook']
PROTECTED_NAMES = {'nv-hostengine', 'keepme-notebook'}


pytestmark = pytest.mark.usefixtures('stand_in_lib')


def identity_or_none(pid):
    """The process's identity, or None for one already gone (a killed orphan parent)."""
    try:
        return act.read_identity(pid)
    except act.ProcessGone:
        return None


def run_ladder(root, selected):
    args = {'gpus': [str(i) for i in sorted(selected)], 'protect': ['^keepme'],
            'dev_dir': os.path.join(root.path, 'dev')}
    out = subprocess.run([sys.executable, '-c', RUNNER, json.dumps(args)], env=root.env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


holder_spec = st.fixed_dictionaries({
    'gpu': st.integers(0, GPUS - 1),
    'mib': st.integers(64, 4096),
    'name': st.sampled_from(NAMES),
    'ignore_term': st.booleans(),
    'child_gpu': st.one_of(st.none(), st.integers(0, GPUS - 1)),
    'orphan': st.booleans(),
    'fork_inherit': st.booleans(),
})


# No shrinking phase: a failing example is printed as drawn, and CI time stays bounded.
@settings(max_examples=10, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(holder_spec, min_size=1, max_size=4),
       selected=st.sets(st.integers(0, GPUS - 1), min_size=1, max_size=GPUS))
def test_ladder_spares_protected_and_out_of_scope_and_frees_or_explains(tmp_path_factory, specs, selected):
    root = FakeGpuRoot(tmp_path_factory.mktemp('gpu'))
    root.setup('--gpus', str(GPUS))
    try:
        processes = []   # (pid, start_time, name, gpus it holds)
        for spec in specs:
            args = ['--gpu', '%d:%d' % (spec['gpu'], spec['mib']), '--title', spec['name']]
            if spec['ignore_term']:
                args.append('--ignore-term')
            if spec['fork_inherit']:
                args.append('--fork-inherit')
            if spec['child_gpu'] is not None:
                args += ['--child', '%d:128:%s' % (spec['child_gpu'], spec['name'])]
            holder = root.hold(*args)
            processes.append((holder.pid, spec['name'], {spec['gpu']}))
            for forked in holder.ready.get('forked', []):
                processes.append((forked, spec['name'], {spec['gpu']}))
            for child in holder.ready.get('spawned', []) or holder.children:
                if child not in holder.ready.get('forked', []):
                    processes.append((child, spec['name'], {spec['child_gpu']}))
            if spec['orphan'] and spec['child_gpu'] is not None:
                holder.kill()
        identities = [(pid, identity_or_none(pid), name, gpus) for pid, name, gpus in processes]

        result = run_ladder(root, selected)

        for pid, identity, name, gpus in identities:
            if identity is None:
                continue
            still = act.is_alive(pid, identity[0])
            if name in PROTECTED_NAMES:
                assert still, 'protected %s (%d) was killed: %s' % (name, pid, result['actions'])
            if not gpus & selected:
                assert still, 'out-of-scope PID %d on GPU %s was killed' % (pid, gpus)
        signalled = set(a['pid'] for a in result['actions'] if a['step'] in ('sigterm', 'sigkill') and a['changed'])
        protected_pids = set(pid for pid, _unused, name, _unused in identities if name in PROTECTED_NAMES)
        assert not signalled & protected_pids
        if result['free']:
            assert all(row['free'] for row in result['after'])
        else:
            # Only protected holders may keep a selected GPU, and the message says so.
            assert 'protected' in result['msg'], result['msg']
    finally:
        root.cleanup()
