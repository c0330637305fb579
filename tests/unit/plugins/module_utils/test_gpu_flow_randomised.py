"""The reclaim ladder on random holder sets, on this host, against the stand-in driver.

Real processes (fakegpu hold), real signals, the real pynvml: only the lab's SSH and systemd
are missing here (the lab tests cover those). Hypothesis draws process trees, names, SIGTERM
handling and GPU selections; each drawn shape knows exactly which PIDs must end (every
unprotected process holding a selected GPU), which must live (the rest), which selected GPUs
stay held (those a protected process holds) and which PIDs `remaining` names, with which
reason_code. The oracle is `expected`.
"""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import json
import os
import signal
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
# The oracle's protected names: keepme-* by the `protect` pattern the test passes, nv-hostengine as
# GPU infrastructure by its name (gpu_decide.INFRASTRUCTURE). Where infrastructure is protected by
# identity instead (issue 22), a root python titled nv-hostengine may no longer be: then this set changes.
PROTECTED_NAMES = {'nv-hostengine', 'keepme-notebook'}


pytestmark = pytest.mark.usefixtures('stand_in_lib')


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
    'stopped': st.booleans(),   # SIGSTOPped (state T), as a job stopped with ^Z
})


class Shape(object):
    """One drawn process of a holder set and what the ladder must do with it.

    kind: 'holder' (its own context on `gpu`), 'child' (a --child worker with its own context
    on the child's GPU) or 'forked' (a --fork-inherit child: it maps its parent's context and
    allocates nothing, so it holds that context only once the parent is dead). Every process of
    a spec carries the spec's title, so a protected name protects all of them.
    """

    def __init__(self, pid, kind, name, gpu, parent=None):
        self.pid, self.kind, self.name, self.gpu, self.parent = pid, kind, name, gpu, parent
        self.start_time = None

    @property
    def protected(self):
        return self.name in PROTECTED_NAMES


def expected(shapes, selected):
    """The exact outcome for these processes and GPU selection.

    Returns (must_end, must_live, held, protected_holders, handles): PIDs the ladder must end;
    PIDs it must leave alive; the selected GPUs that must stay held (only a protected process
    keeps one); the PIDs `remaining` must name with reason_code 'protected' (protected context
    holders of a held GPU), and with 'device_open' (a protected forked child whose parent, the
    context's owner, is alive: it maps the GPU but holds no context of its own).

    Handles are named only where the last survey read every process (gpu_reclaim's RETURN,
    `holders`): it reads only the processes NVML lists when they account for every used MiB
    of the selected GPUs, and every process when NVML charges memory to a PID that is gone,
    which here is a protected forked child keeping its killed parent's context.
    """
    alive = [p for p in shapes if p.start_time is not None]
    alive_pids = set(p.pid for p in alive)
    must_end = set(p.pid for p in alive if p.gpu in selected and not p.protected)
    must_live = alive_pids - must_end
    held = set(p.gpu for p in alive if p.gpu in selected and p.protected)
    # A GPU whose context owner was killed while a protected forked child keeps its context (so
    # it stays so to the end): NVML charges a dead PID there, and no process names which mapper
    # inherited that context, so every process that maps the GPU counts as holding a context on
    # it (gpu_decide.context_gpus_of), a forked child of a live parent too. An unprotected
    # orphan's context is ended, and the GPU is an ordinary one again (the lab test's
    # counterexample in CI: an unprotected orphan beside a protected forked child). (Found by hypothesis after the merge: a protected
    # --fork-inherit holder beside an orphaned one on GPU 0; the oracle had said device_open.)
    orphaned = set(p.gpu for p in alive if p.kind == 'forked' and p.parent not in alive_pids and p.protected)
    in_context = [p for p in alive if p.kind != 'forked' or p.parent not in alive_pids or p.gpu in orphaned]
    protected_holders = set(p.pid for p in in_context if p.protected and p.gpu in held)
    read_every_process = any(p.kind == 'forked' and p.pid in protected_holders for p in alive)
    handles = set(p.pid for p in alive if read_every_process and p.kind == 'forked' and
                  p.parent in alive_pids and p.protected and p.gpu in held and p.gpu not in orphaned)
    return must_end, must_live, held, protected_holders, handles


def start_shapes(root, specs):
    """Start every drawn holder; returns [Shape] of all their processes (killed parents with
    start_time None)."""
    shapes = []
    for spec in specs:
        args = ['--gpu', '%d:%d' % (spec['gpu'], spec['mib']), '--title', spec['name']]
        if spec['ignore_term']:
            args.append('--ignore-term')
        if spec['fork_inherit']:
            args.append('--fork-inherit')
        if spec['child_gpu'] is not None:
            args += ['--child', '%d:128:%s' % (spec['child_gpu'], spec['name'])]
        holder = root.hold(*args)
        parent = Shape(holder.pid, 'holder', spec['name'], spec['gpu'])
        started = [parent] + [Shape(pid, 'forked', spec['name'], spec['gpu'], parent=holder.pid)
                              for pid in holder.ready['forked']]
        started += [Shape(pid, 'child', spec['name'], spec['child_gpu'], parent=holder.pid)
                    for pid in holder.ready['spawned']]
        for shape in started:
            shape.start_time = act.read_identity(shape.pid)[0]
        shapes += started
        if spec['orphan'] and holder.ready['spawned']:
            # The scenario's own SIGKILL of the parent (the seed incident), not the ladder's.
            holder.kill()
            parent.start_time = None
        elif spec['stopped']:
            os.kill(holder.pid, signal.SIGSTOP)
            stopped, _waited = act.wait_for(lambda: act.read_identity(holder.pid).state == 'stopped', 10)
            assert stopped, 'PID %d did not stop' % holder.pid
    return shapes


# Examples per CI run: EXAMPLES (each starts up to 12 real processes and runs the ladder in a
# process of its own). No shrinking phase in CI: a failing example is printed as drawn.
EXAMPLES = 20


@settings(max_examples=EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(holder_spec, min_size=1, max_size=4),
       selected=st.sets(st.integers(0, GPUS - 1), min_size=1, max_size=GPUS))
def test_ladder_ends_exactly_the_unprotected_holders_of_the_selected_gpus(tmp_path_factory, specs, selected):
    root = FakeGpuRoot(tmp_path_factory.mktemp('gpu'))
    root.setup('--gpus', str(GPUS))
    try:
        shapes = start_shapes(root, specs)
        must_end, must_live, held, protected_holders, handles = expected(shapes, selected)

        result = run_ladder(root, selected)

        shown = '%s\nactions: %s\nremaining: %s' % (
            [(p.pid, p.kind, p.name, p.gpu) for p in shapes], result['actions'],
            [(h['pid'], h.get('reason_code'), h.get('reason')) for h in result['remaining']])
        by_pid = dict((p.pid, p) for p in shapes)
        ended = set(pid for pid in must_end | must_live if not act.is_alive(pid, by_pid[pid].start_time))
        assert ended == must_end, shown
        signalled = set(a['pid'] for a in result['actions'] if a['step'] in ('sigterm', 'sigkill') and a['changed'])
        assert not signalled & must_live, shown
        assert set(row['index'] for row in result['after'] if not row['free']) == held, shown
        assert result['free'] is (not held), shown
        codes = dict((h['pid'], h['reason_code']) for h in result['remaining'])
        assert codes == dict([(pid, 'protected') for pid in protected_holders] +
                             [(pid, 'device_open') for pid in handles]), shown
        if held:
            # The sentence is written from the same entries: it names each blocking PID.
            for pid in protected_holders:
                assert 'PID %d (' % pid in result['msg'], result['msg']
    finally:
        root.cleanup()
