"""tests/gpu's verdict: what its report says and how it exits, from the scenarios' entries.

A run where a scenario was skipped (one GPU lent: s7 and s8 need two), or left out with --only,
is PARTIAL and names what did not run and why; only a run where every scenario ran and passed
is PASS. The suite itself needs a GPU; this logic does not.
"""

import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_DIR = os.path.join(HERE, '..', '..', 'gpu')


@pytest.fixture(scope='module')
def suite():
    sys.path.insert(0, GPU_DIR)
    try:
        spec = importlib.util.spec_from_file_location('suite', os.path.join(GPU_DIR, 'suite.py'))
        module = importlib.util.module_from_spec(spec)
        sys.modules['suite'] = module
        spec.loader.exec_module(module)
        import scenarios  # pylint: disable=import-outside-toplevel,import-error
        yield module, scenarios
    finally:
        sys.path.remove(GPU_DIR)
        sys.modules.pop('suite', None)
        sys.modules.pop('scenarios', None)


def entry(name, status, why=None):
    return dict({'name': name, 'status': status, 'notes': []}, **({'skip_reason': why} if why else {}))


def test_every_scenario_run_and_passed_is_pass(suite):
    verdict = suite[0].verdict
    assert verdict([entry('s1', 'pass'), entry('s2', 'pass')]) == ('PASS', 's1=pass, s2=pass', 0)


def test_a_skipped_scenario_makes_it_partial_naming_it_and_why(suite):
    result, summary, code = suite[0].verdict([entry('s1', 'pass'), entry('s7', 'skip', 'needs 2 GPUs, 1 usable'),
                                              entry('s8', 'skip', 'needs 2 GPUs, 1 usable')])
    assert (result, code) == ('PARTIAL', 3)
    assert summary.endswith('did not run: s7 (needs 2 GPUs, 1 usable), s8 (needs 2 GPUs, 1 usable)'), summary


def test_scenarios_left_out_by_only_make_it_partial(suite):
    result, summary, code = suite[0].verdict([entry('s1', 'pass')], not_selected=['s2', 's11'])
    assert (result, code) == ('PARTIAL', 3)
    assert 'did not run: s2 (not in --only), s11 (not in --only)' in summary


def test_a_failure_or_an_error_is_fail_even_beside_skips(suite):
    verdict = suite[0].verdict
    for bad in ('fail', 'error'):
        result, _summary, code = verdict([entry('s1', 'pass'), entry('s4', bad), entry('s7', 'skip', 'x')])
        assert (result, code) == ('FAIL', 1)
    assert verdict([entry('s1', 'pass')], broke=True)[::2] == ('FAIL', 1)


def test_no_scenario_run_is_not_a_pass(suite):
    assert suite[0].verdict([])[::2] == ('PARTIAL', 3)


def test_the_skip_helper_records_the_reason_the_verdict_names(suite):
    sc = entry('s8', 'pass')
    suite[0].skip(sc, 'torch has no NCCL')
    assert sc['status'] == 'skip' and 'did not run: s8 (torch has no NCCL)' in suite[0].verdict([sc])[1]


def test_a_soft_check_is_only_a_warning_and_a_hard_one_fails_the_scenario(suite):
    # s4's and s8's key facts are hard checks: a failed one fails the scenario (suite.scenario).
    mod = suite[0]

    class Fake(mod.Suite):
        def __init__(self):    # pylint: disable=super-init-not-called
            self.report = {'scenarios': []}
            self.test_gpus = [0]
            self.has_ansible = True
            self.started = 0

        def left(self):
            return 1000

        def kill_ours(self, timeout=10.0):
            return [], []

        def wait_baseline(self, gpus, timeout=15.0, slack_mib=64):
            return True, 0.0, {}

    fake = Fake()
    fake.scenario('soft', 'a soft miss', lambda ctx: ctx.check('x', False, hard=False), 10)
    fake.scenario('hard', 'a hard miss', lambda ctx: ctx.check('x', False), 10)
    assert [s['status'] for s in fake.report['scenarios']] == ['pass', 'fail']


def test_s4_and_s8_key_facts_are_hard_checks(suite):
    # Read from the scenario code: no check in s4 or s8 may be soft (hard=False).
    import inspect  # pylint: disable=import-outside-toplevel
    scenarios = suite[1]
    for fn in (scenarios.s4_forked_child, scenarios.s8_nccl_peer_memory):
        assert 'hard=False' not in inspect.getsource(fn), fn.__name__


# Free MiB on GPU 0 at s12's start on the device machine's cards (total less the driver's
# reserve, nvidia-smi and NVML of the reports): the H200's 143771 - 615, the H100's 81559 - 615.
H200_FREE, H100_FREE = 143156, 80944


def test_s12_keeps_its_shapes_where_the_card_has_room(suite):
    assert suite[1].rank_shapes(H200_FREE) == ([(24, 1024), (8, 12288)], [])


def test_s12_sizes_the_tp8_shape_down_to_what_an_h100_holds(suite):
    shapes, left_out = suite[1].rank_shapes(H100_FREE)
    assert left_out == []
    assert shapes[0] == (24, 1024)
    count, mib = shapes[1]
    assert count == 8 and 1024 <= mib < 12288 and mib % 1024 == 0
    # Every rank's tensor and its context (610 MiB measured on the H200) within free memory.
    assert count * (mib + 610) <= H100_FREE


def test_s12_leaves_out_a_shape_that_cannot_fit_saying_why(suite):
    shapes, left_out = suite[1].rank_shapes(40000)
    assert shapes == [(8, 3072)]
    assert left_out == ['24 x 1024 MiB: GPU 0 has 40000 MiB free, not room for 24 ranks of 1 GiB with their contexts']


def test_s12_that_fits_no_shape_ends_skipped_naming_the_card_memory_not_as_an_error(suite, monkeypatch):
    mod, scenarios = suite

    class TinyCard:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def gpu(self, index):
            return {'index': index, 'free_mib': 9000}

    monkeypatch.setattr(scenarios, 'Nvml', TinyCard)

    class Fake(mod.Suite):
        def __init__(self):    # pylint: disable=super-init-not-called
            self.report = {'scenarios': []}
            self.test_gpus = [0]
            self.has_ansible = True
            self.started = 0

        def left(self):
            return 1000

        def kill_ours(self, timeout=10.0):
            return [], []

        def wait_baseline(self, gpus, timeout=15.0, slack_mib=64):
            return True, 0.0, {}

    fake = Fake()
    fake.scenario('s12', 'many ranks', scenarios.s12_many_ranks, 10)
    entry_ = fake.report['scenarios'][0]
    assert entry_['status'] == 'skip', entry_
    assert 'GPU 0 has 9000 MiB free' in entry_['skip_reason']
    assert mod.verdict([entry_])[::2] == ('PARTIAL', 3)


def test_the_report_names_the_card_and_its_memory(suite):
    mod = suite[0]
    gpus = [{'index': i, 'name': 'NVIDIA H100 80GB HBM3', 'total_mib': 81559, 'free_mib': 80944} for i in (0, 1)]
    line = mod.cards_line(gpus)
    assert line == 'NVIDIA H100 80GB HBM3 x2, 81559 MiB each (free MiB at the start: 0: 80944, 1: 80944)'
    text = mod.render_text({'suite': 'x', 'run_id': 'r', 'started_at': 't', 'result': 'PASS', 'summary': '',
                            'preflight': {'cards': line}, 'scenarios': []})
    assert 'CARDS: ' + line in text.splitlines()
    mixed = mod.cards_line([dict(gpus[0]), {'index': 1, 'name': 'NVIDIA H200', 'total_mib': 143771, 'free_mib': 143156}])
    assert mixed.startswith('0: NVIDIA H100 80GB HBM3, 81559 MiB; 1: NVIDIA H200, 143771 MiB')
