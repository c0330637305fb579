"""gpu_say: the one place that writes sentences from decision codes (issue 19 item 1).

Every code a decision returns has its sentence here: each diagnosis code is found by
gpu_decide.findings on a hand-built shape and written, each full-scan code and each step code
(the action log's `result`) is written, and no decision anywhere in plugins/ compares or slices a
sentence. The words themselves are the older tests' (test_gpu_decide, test_gpu_peers, test_gpu_act,
test_gpu_flow and the test_gpu_family_* files), which pass unchanged."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import ast
import os
import signal

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as say

from .holders import make_holder
from .observations import CTX, FREE_MIB, diagnosed, gpu, proc, runtime_confirms, snap, systemd_confirms

CID = 'e6cca3930084' + '0' * 52
PLUGINS = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'plugins')


def _held(**kwargs):
    return snap([gpu(0, used=1000, processes=[(10, 1000)])], [proc(10, fds=CTX, maps=CTX, **kwargs)])


def _traced(holders):
    holders[0] = holders[0]._replace(tracer_pid=77, tracer_name='gdb', state='tracing-stop')


def _policy(holders):
    holders[0] = holders[0]._replace(owner=holders[0].owner._replace(restart_policy='always', name='sglang'))


def _unreadable():
    shape = _held()
    shape.unreadable = [(pid, 'fd') for pid in range(3, 20)]
    return shape


def _peer():
    return snap([gpu(0, used=291, processes=[(4241, 291)]), gpu(1, used=1000, processes=[(4242, 1000)])],
                [proc(4242, name='sglang::schedul', cmdline='sglang::scheduler_TP1',
                      fds=('/dev/nvidia0', '/dev/nvidia1'), maps=('/dev/nvidia0', '/dev/nvidia1'))], missing=[4241])


UNIT = '/system.slice/sglang.service'
# code: (the shape, facts for classify, a change to the holders, blind, words its sentence holds)
SHAPES = {
    lever.IMPOSSIBLE_PID: (lambda: snap([gpu(0, used=400, processes=[(5000000, 400)])], [], missing=[5000000]),
                           None, None, False, 'impossible PID 5000000 (400 MiB)'),
    lever.LISTED_UNSEEN: (lambda: snap([gpu(0, used=900, processes=[(77, 900)])], [], missing=[77]),
                          None, None, True, 'PID 77 (900 MiB), which this module cannot see'),
    lever.LISTED_EXITED: (lambda: snap([gpu(0, used=900, processes=[(77, 900)])], [proc(78, name='child', maps=CTX)],
                                       missing=[77]),
                          None, None, False, 'PID 78 (child) still maps the device (inherited from it)'),
    lever.LISTED_MISSING: (lambda: snap([gpu(0, used=900, processes=[(77, 900)])], [], missing=[77]),
                           None, None, False, 'no such process exists in this PID namespace'),
    lever.PEER_MEMORY: (_peer, None, None, False, 'PID 4242 (sglang::scheduler_TP1) maps GPU 0, its context is on GPU 1'),
    lever.MEMORY_UNSEEN: (lambda: snap([gpu(0, used=9000)], []), None, None, True,
                          '9000 MiB used with no process visible to this module'),
    lever.MEMORY_UNEXPLAINED: (lambda: snap([gpu(0, used=9000)], []), None, None, False,
                               '9000 MiB used with no process visible here'),
    lever.UNCONFIRMED_PID: (lambda: snap([gpu(0, used=900, processes=[(30, 900)])], [proc(30, name='bash')]),
                            None, None, False, 'but PID 30 here (bash) holds no NVIDIA device'),
    # PID 30 listed on GPU 1 (a dead parent's context, its forked child keeps it) is a rank of GPU 0 now
    lever.UNCONFIRMED_GPU: (lambda: snap([gpu(0, used=900, processes=[(30, 900)]), gpu(1, used=900, processes=[(30, 900)])],
                                         [proc(30, name='sglang::schedul', fds=CTX, maps=CTX)]),
                            None, None, False, "PID 30 here (sglang::schedul) has none of that GPU's device nodes"),
    lever.DISK_SLEEP: (lambda: _held(state='disk-sleep'), None, None, False, 'PID 10 (python3) is in uninterruptible'),
    lever.ZOMBIE: (lambda: snap([gpu(0, used=1000, processes=[(10, 1000)])],
                                [proc(10, fds=CTX, maps=CTX, state='zombie', ppid=5), proc(5, name='sh')]),
                   None, None, False, 'its parent PID 5 (sh) must reap it'),
    lever.TRACED: (_held, None, _traced, False, 'is traced by PID 77 (gdb) and stopped (state t)'),
    lever.STOPPED: (lambda: _held(state='stopped'), None, None, False, 'is stopped (SIGSTOP, state T)'),
    lever.ZOMBIE_LEADER: (lambda: _held(state='zombie-leader'), None, None, False, 'is a zombie leader'),
    lever.UNIT_RESTARTS: (lambda: _held(cgroup='0::' + UNIT), {'units': systemd_confirms(UNIT, restart='always')}, None,
                          False, 'belongs to sglang.service with Restart=always'),
    lever.OWNER_LEVER: (lambda: _held(cgroup='0::/system.slice/docker-%s.scope\n' % CID),
                        {'facts': runtime_confirms('0::/system.slice/docker-%s.scope\n' % CID)}, _policy, False,
                        'holds GPU 0: its docker container sglang (e6cca3930084) restarts it'),
    lever.OTHER_PID_NAMESPACE: (lambda: _held(pidns='pid:[4026532000]'), None, None, False,
                                'runs in another PID namespace (a container) than this module'),
    lever.UNREADABLE: (_unreadable, None, None, False, 'Could not read the fds or maps of 17 process(es)'),
}


def test_every_diagnosis_code_has_a_shape_here():
    assert sorted(SHAPES) == sorted(lever.DIAGNOSIS)


@pytest.mark.parametrize('code', sorted(SHAPES))
def test_each_diagnosis_code_is_found_on_its_shape_and_written_from_its_facts(code):
    shape, extra, change, blind, words = SHAPES[code]
    observed = shape()
    extra = extra or {}
    holders, _clients, unconfirmed = decide.classify(observed, [], set(), extra.get('units') or {}, FREE_MIB,
                                                     extra.get('facts'))
    if change:
        change(holders)
    rows = decide.gpu_table(observed, holders, [0], 128)
    found = decide.findings(observed, holders, unconfirmed, rows, blind=blind)
    assert code in [f.code for f in found]
    sentences = [say.finding(f) for f in found if f.code == code]
    assert any(words in sentence for sentence in sentences), sentences
    # The sentences the operator reads are these, in this order (the blind sentence first).
    blind_sentence = 'blind.' if blind else None
    assert diagnosed(observed, holders, unconfirmed, rows, blind_sentence=blind_sentence) == \
        ([blind_sentence] if blind else []) + [say.finding(f) for f in found]


def test_an_unknown_code_has_no_sentence_and_says_so():
    with pytest.raises(ValueError, match="'nope'"):
        say.finding(decide.Finding('nope', {'pid': 1, 'name': 'x'}))
    with pytest.raises(ValueError, match="'nope'"):
        say.full_scan(decide.Finding('nope', {}))
    with pytest.raises(KeyError):
        say.step('nope')


def test_each_full_scan_code_is_decided_then_written():
    cases = [
        (snap([gpu(0, used=1000, processes=[(10, 1000)])], [proc(10)]), lever.LISTED_HOLDS_NOTHING,
         'GPU 0: NVML lists PID 10, which holds nothing here'),
        (snap([gpu(0, used=1000, processes=[(10, None)])], [proc(10, fds=CTX, maps=CTX)]), lever.NO_MEMORY_GIVEN,
         'GPU 0: NVML gives no memory for PID 10'),
        (snap([gpu(0, used=3000, processes=[(10, 1000)])], [proc(10, fds=CTX, maps=CTX)]), lever.UNCHARGED_MEMORY,
         'GPU 0: 3000 MiB used, 1000 MiB charged to processes'),
    ]
    assert sorted(code for _shape, code, _text in cases) == sorted(lever.FULL_SCAN)
    for shape, code, text in cases:
        found = decide.full_scan_code(shape, [0], 128)
        assert found.code == code and say.full_scan(found) == text == say.full_scan(decide.full_scan_code(shape, [0], 128))
    enough = snap([gpu(0, used=1000, processes=[(10, 1000)])], [proc(10, fds=CTX, maps=CTX)])
    assert decide.full_scan_code(enough, [0], 128) is None and say.full_scan(None) is None


# Every fact any step's sentence names, so each code can be written here.
HOLDER = make_holder(pid=20, name='sglang', state='sleeping', owner={'kind': 'none'},
                     protected_reason='matches protect pattern', start_time=1).left(None, 'not a target')
FACTS = {'pid': 20, 'waited': 1.5, 'uid': 1000, 'timeout': 35.0, 'output': 'Unit x.service not loaded.',
         'runtime': 'proxmox', 'rc': 1, 'command': 'sv down /etc/sv/x', 'watched': 1.5, 'left': [21],
         'argv': ['nvidia-smi', '-r'], 'grace': 10, 'signal': 'SIGTERM', 'count': 2,
         'back': {'ended': [10], 'new_pids': [12], 'after_s': 0.5}, 'depth': 2, 'parent': HOLDER,
         'refusal': lever.PROTECTED, 'bound': 3.0, 'alive': [50], 'took': 0.25, 'holders': [],
         'blocked': [(0, [(HOLDER, lever.LEFT)])], 'unseen': [1], 'pids': [10, 11], 'why': 'ignored (SigIgn)',
         'state': 'disk-sleep'}


@pytest.mark.parametrize('code', lever.STEPS)
def test_each_step_code_is_written_and_carries_its_code(code):
    said = say.step(code, **FACTS)
    assert isinstance(said, str) and said.code == code and str(said) and not isinstance(str(said), say.Said)


def test_the_step_table_writes_exactly_the_step_codes():
    assert sorted(say._STEPS) == sorted(lever.STEPS)    # pylint: disable=protected-access


def test_a_signal_is_written_from_its_code():
    refused = say.step(lever.PID_PROTECTED, pid=42)
    assert refused == 'refused: PID 42 is protected' and refused.code == lever.PID_PROTECTED
    assert say.step(lever.SENT) == 'sent' and say.step(lever.SENT).code == lever.SENT
    assert say.step(lever.RESPAWNER_TARGET, **FACTS) == \
        'PID(s) 10 came back as PID 12 0.50 s after the first was ended; the grandparent becomes the target'


def test_what_a_signalled_holder_did_reads_as_the_ladder_always_wrote_it():
    assert say.step(lever.EXITED, signal='SIGKILL', took=0.671) == 'exited after SIGKILL in 0.67 s'
    assert say.step(lever.STILL_RUNNING, signal='SIGTERM', took=5.0) == 'still running 5.00 s after SIGTERM'
    assert say.step(lever.SENT_FUTILE, why='ignored (SigIgn)') == 'sent; ignored (SigIgn): SIGKILL at once'
    assert say.step(lever.ALIVE_AFTER_KILL_STEP, state='disk-sleep') == 'alive after SIGKILL (state disk-sleep)'


# --- no decision compares or slices a sentence -------------------------------------------------------

def _sentence_heads():
    """The first words of every step sentence gpu_say writes that are more than a code's own word
    ('sent', 'gone', ...): a `startswith` with one of them decides on words."""
    heads = set()
    for code in lever.STEPS:
        text = str(say.step(code, **FACTS))
        if text != code and text not in (lever.SENT, lever.GONE, lever.REUSED):
            heads.add(text)
    return heads


def _say_functions():
    return set(name for name, value in vars(say).items() if callable(value) and not name.startswith('_')
               and getattr(value, '__module__', None) == say.__name__)


def _sentence_constants():
    """The sentences gpu_say keeps as constants (CONTAINER_INIT, POD_PROTECTED, ...)."""
    return set(value for name, value in vars(say).items()
               if isinstance(value, str) and name.isupper() and not name.startswith('_') and ' ' in value)


def _module_aliases(tree):
    """{alias: module} for each `from ...module_utils import gpu_X as alias` of a source."""
    import importlib
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith('plugins.module_utils'):
            for name in node.names:
                aliases[name.asname or name.name] = importlib.import_module('%s.%s' % (node.module, name.name))
    return aliases


def _a_sentence(operand, aliases, heads, constants):
    """What in a comparison's operand is a sentence gpu_say writes: a literal of two words or
    more found in one, or a module's name for one of gpu_say's sentence constants
    (decide.CONTAINER_INIT); else None."""
    if isinstance(operand, ast.Constant) and isinstance(operand.value, str):
        literal = operand.value
        if ' ' in literal.strip() and len(literal) >= 6 and any(literal in text for text in heads | constants):
            return repr(literal)
    if isinstance(operand, ast.Attribute) and isinstance(operand.value, ast.Name) \
            and operand.value.id in aliases:
        value = getattr(aliases[operand.value.id], operand.attr, None)
        if isinstance(value, str) and value in constants:
            return '%s.%s' % (operand.value.id, operand.attr)
    return None


_COMPARES = {ast.Eq: '==', ast.NotEq: '!=', ast.In: 'in', ast.NotIn: 'not in'}


def _decisions_on_sentences(source, heads, writers):
    """(line, what) for each `x.startswith(LITERAL)`/`endswith` whose literal begins a sentence
    gpu_say writes, each `==`, `!=`, `in` or `not in` with a sentence on one side (a literal
    found in one, or gpu_say's sentence constant by any module's name), and each slice of what
    a gpu_say function (or a wrapper of one) returned."""
    found = []
    tree = ast.parse(source)
    aliases, constants = _module_aliases(tree), _sentence_constants()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARES for op in node.ops):
            for operand in [node.left] + node.comparators:
                what = _a_sentence(operand, aliases, heads, constants)
                if what:
                    found.append((node.lineno, '%s %s' % (_COMPARES[type(node.ops[0])], what)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ('startswith', 'endswith') and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            literal = node.args[0].value
            if len(literal) >= 4 and any(head.startswith(literal) for head in heads):
                found.append((node.lineno, '%s(%r)' % (node.func.attr, literal)))
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice) and isinstance(node.value, ast.Call):
            func = node.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, 'id', None)
            if name in writers:
                found.append((node.lineno, 'a slice of %s()' % name))
    return found


def test_no_decision_in_plugins_compares_or_slices_a_sentence():
    heads, writers = _sentence_heads(), _say_functions()
    assert any(head.startswith('stopped in 1.50 s') for head in heads) and 'peer_lever' in writers and 'next_lever' in writers
    offenders = []
    for folder, _dirs, files in os.walk(PLUGINS):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith('.py') or name == 'gpu_say.py':
                continue
            with open(path) as handle:
                offenders += ['%s:%d %s' % (os.path.relpath(path, PLUGINS), line, what)
                              for line, what in _decisions_on_sentences(handle.read(), heads, writers)]
    assert offenders == []


def test_the_rule_catches_what_it_names():
    heads, writers = _sentence_heads(), _say_functions()
    # The two this issue removed: gpu_adopt's stop read from its words, gpu_peers' clause cut out
    # of peer_lever's sentence.
    assert _decisions_on_sentences("stopped = result.startswith('stopped')", heads, writers) == \
        [(1, "startswith('stopped')")]
    assert _decisions_on_sentences("text = peer_lever(holder, index)[3:]", heads, writers) == \
        [(1, 'a slice of peer_lever()')]
    assert _decisions_on_sentences("ok = line.startswith('CapEff:')", heads, writers) == []
    # Issue 32 item 3: a comparison with a sentence, a literal or gpu_say's constant by any
    # module's name (gpu_flow's `reason == decide.CONTAINER_INIT`, gpu_decide's re-export then);
    # codes and plain words pass.
    head = "from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say as words\n" \
           "from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever\n"
    assert _decisions_on_sentences(head + "x = reason == words.CONTAINER_INIT", heads, writers) == \
        [(3, '== words.CONTAINER_INIT')]
    assert _decisions_on_sentences(head + "x = 'came back' in result", heads, writers) == \
        [(3, "in 'came back'")]
    assert _decisions_on_sentences(head + "x = result != 'still running'", heads, writers) == \
        [(3, "!= 'still running'")]
    assert _decisions_on_sentences(head + "x = why == lever.CONTAINER_INIT", heads, writers) == []
    assert _decisions_on_sentences(head + "x = signame == 'SIGTERM'", heads, writers) == []


def test_a_signal_refusal_is_a_code_and_send_signal_writes_it():
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_act
    assert gpu_act.signal_refusal(1, 5) == lever.PID_NEVER
    assert gpu_act.signal_refusal(os.getpid(), 5) == lever.PID_PROTECTED
    refused = gpu_act.send_signal(0, 5, signal.SIGTERM)
    assert refused.code == lever.PID_NEVER and refused == 'refused: PID 0 is never signalled'


def test_the_blind_sentence_is_written_here_from_what_access_found():
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_access as access
    seen = access.ProcAccess(euid=1000, user='lab', can_read_all=False, hidepid='invisible')
    text = say.blind(seen)
    assert text.startswith('Run as root (become: true): this module runs as lab (UID 1000)')
    assert 'hidepid=invisible' in text
    assert seen.sentence() == text   # gpu_access only hands it on
    assert say.blind(access.ProcAccess(euid=0, user='root', can_read_all=True, hidepid=None)) is None
    assert say.reset_refused_blind(text) == 'allow_reset refused: %s Nothing was signalled.' % text


def test_an_owner_cli_that_gave_no_answer_is_written_here():
    argv = ['supervisorctl', 'status', 'a b']
    assert say.cli_not_on_path('docker') == 'docker is not on PATH here'
    assert say.cli_no_answer(argv, 10) == '`supervisorctl status a b` did not answer within 10s'
    assert say.cli_not_started(argv, OSError(13, 'Permission denied')) == \
        '`supervisorctl status a b` could not start: [Errno 13] Permission denied'
    assert say.cli_failed(argv, 'rc=4', 'x' * 400) == '`supervisorctl status a b` failed (rc=4): ' + 'x' * 300
    assert say.cli_unfinished(['sv', 'down', 'w'], 40) == 'sv down w did not finish within 40s'
    assert say.not_down(['sv', 'down', 'w'], 1, 'y' * 250, 40) == \
        '`sv down w` (rc=1: %s) and the program is not down after 40s' % ('y' * 200)
    assert say.program_back(4242, 1.234) == 'it started the program again (PID 4242) 1.23 s after it read down'
    assert say.not_listed(77) == 'its status lists no program with PID 77'
    assert say.status_after_stop('z' * 400) == 'its status after the stop: ' + 'z' * 300


def test_no_owner_cli_error_text_is_written_outside_gpu_say():
    """The phrases of an owner's CLI that gave no answer, and the blind sentence, live in gpu_say
    alone. (A driver's or a pattern's typed error carries its own message: gpu_nvidia,
    gpu_patterns.)"""
    phrases = ('not on PATH here', '` did not answer within', '` could not start:', '%s did not finish within %ss',
               'is not down after', 'started the program again', 'lists no program with PID',
               'its status after the stop', 'without CAP_SYS_PTRACE', 'allow_reset refused:',
               'no start time was recorded', 'systemd refused the scope', 'no control group to verify',
               'no process this run planned')
    found = []
    for top, _dirs, files in os.walk(PLUGINS):
        for name in files:
            if not name.endswith('.py') or name == 'gpu_say.py':
                continue
            path = os.path.join(top, name)
            with open(path) as handle:
                tree = ast.parse(handle.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found += ['%s:%d %s' % (name, node.lineno, p) for p in phrases if p in node.value]
    # Docstrings and DOCUMENTATION may name the phrases; what is written is in code.
    written = [f for f in found if not _in_documentation(f)]
    assert written == []


def _in_documentation(found):
    name, rest = found.split(':', 1)
    line = int(rest.split()[0])
    for top, _dirs, files in os.walk(PLUGINS):
        if name in files:
            with open(os.path.join(top, name)) as handle:
                tree = ast.parse(handle.read())
            docs = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and any(getattr(t, 'id', '') in ('DOCUMENTATION', 'EXAMPLES', 'RETURN')
                                                        for t in node.targets):
                    docs.append((node.lineno, node.end_lineno))
                if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)) and ast.get_docstring(node):
                    first = node.body[0]
                    docs.append((first.lineno, first.end_lineno))
            return any(a <= line <= b for a, b in docs)
    return False


def test_why_an_adoption_stopped_is_written_from_its_code():
    assert say.adopt_error(lever.ADOPT_SCOPE_REFUSED, scope='s-1.scope', result='denied') == \
        'systemd refused the scope s-1.scope: denied'
    assert say.adopt_error(lever.ADOPT_STOP_FAILED, scope='s-1.scope', result='timeout') == \
        'systemctl stop s-1.scope: timeout'
    assert 'PID 7, 9, which is no process this run planned' in say.adopt_error(lever.ADOPT_STRANGERS,
                                                                               scope='s-1.scope', pids=[7, 9])
    assert '`systemctl status s-1.scope`' in say.adopt_error(lever.ADOPT_NO_CGROUP, scope='s-1.scope')
    assert say.adopt_error(lever.ADOPT_NO_START_TIME, pids=[4242]).startswith(
        'no start time was recorded for PID 4242 when it was found')
    with pytest.raises(KeyError):
        say.adopt_error('no_such_code')
