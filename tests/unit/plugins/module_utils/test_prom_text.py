"""prom_text: the text exposition format as written, read back, and as promtool's own parser
reads it (`promtool check metrics`, from Debian's prometheus package: tests/prometheus/fetch)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import subprocess

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import prom_text
from ansible_collections.gpuops.reclaim.plugins.module_utils.prom_text import Family

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
PROMTOOL = os.path.join(REPO, '.build', 'prometheus', 'promtool')


def promtool_check_metrics(text):
    """promtool's verdict on `text`: (rc, what it said). Skips, saying how to get promtool,
    when it is not unpacked, unless GPUOPS_REQUIRE_PROMTOOL is set (make rules-check sets it)."""
    if not os.access(PROMTOOL, os.X_OK):
        if os.environ.get('GPUOPS_REQUIRE_PROMTOOL'):
            pytest.fail('%s is missing: run tests/prometheus/fetch' % PROMTOOL)
        pytest.skip('promtool is not unpacked at %s: run tests/prometheus/fetch (make rules-check does)' % PROMTOOL)
    run = subprocess.run([PROMTOOL, 'check', 'metrics'], input=text, capture_output=True, text=True, timeout=60)
    return run.returncode, run.stdout + run.stderr


def sample_families():
    return [
        Family('gpuops_test_runs_total', 'counter', 'Runs, by result.',
               [({'result': 'ok'}, 3), ({'result': 'failed'}, 0)]),
        Family('gpuops_test_seconds', 'gauge', 'A help text with a back\\slash\nand a new line.').add(1.25),
        Family('gpuops_test_bytes', 'gauge', 'Bytes per GPU.').add(80 * 1024 ** 3, gpu='0').add(0, gpu='1'),
        Family('gpuops_test_code', 'gauge', 'A label value with "quotes", \\ and a\nnew line.').add(1, code='a"b\\c\nd'),
    ]


def test_render_writes_help_and_type_before_each_familys_samples():
    text = prom_text.render(sample_families(), header=['made by a test'])
    lines = text.splitlines()
    assert lines[0] == '# made by a test'
    assert lines[1:5] == ['# HELP gpuops_test_runs_total Runs, by result.', '# TYPE gpuops_test_runs_total counter',
                          'gpuops_test_runs_total{result="ok"} 3', 'gpuops_test_runs_total{result="failed"} 0']
    assert '# HELP gpuops_test_seconds A help text with a back\\\\slash\\nand a new line.' in lines
    assert 'gpuops_test_bytes{gpu="0"} 85899345920' in lines
    assert 'gpuops_test_code{code="a\\"b\\\\c\\nd"} 1' in lines
    assert text.endswith('\n')


def test_parse_reads_back_what_render_wrote():
    samples, types = prom_text.parse(prom_text.render(sample_families(), header=['x']))
    assert samples[('gpuops_test_runs_total', (('result', 'ok'),))] == 3
    assert samples[('gpuops_test_seconds', ())] == 1.25
    assert samples[('gpuops_test_code', (('code', 'a"b\\c\nd'),))] == 1
    assert types['gpuops_test_runs_total'] == 'counter' and types['gpuops_test_bytes'] == 'gauge'


@pytest.mark.parametrize('value, text', [(True, '1'), (False, '0'), (3, '3'), (3.0, '3'), (0.125, '0.125'),
                                         (float('nan'), 'NaN'), (float('inf'), '+Inf'), (-float('inf'), '-Inf')])
def test_numbers_are_written_as_the_format_spells_them(value, text):
    assert prom_text.number(value) == text


@pytest.mark.parametrize('text, named', [
    ('gpuops_x{gpu="0"} 1\ngarbage here\n', 'line 2'),
    ('gpuops_x{gpu=0} 1\n', 'line 1: labels not understood'),
    ('gpuops_x{gpu="0"} many\n', "line 1: gpuops_x has no number: 'many'"),
    ('gpuops_x 1 1700000000000\n', 'line 1: not a sample'),
])
def test_parse_names_the_first_line_it_does_not_understand(text, named):
    with pytest.raises(prom_text.ParseError) as err:
        prom_text.parse(text)
    assert named in str(err.value)


@pytest.mark.parametrize('make, named', [
    (lambda: Family('gpuops-bad', 'gauge', 'x'), "bad metric name 'gpuops-bad'"),
    (lambda: Family('gpuops_x', 'histogram', 'x'), "bad metric type 'histogram'"),
])
def test_a_bad_family_is_refused_naming_it(make, named):
    with pytest.raises(ValueError) as err:
        make()
    assert named in str(err.value)


def test_a_bad_label_name_is_refused_naming_it():
    with pytest.raises(ValueError) as err:
        prom_text.render([Family('gpuops_x', 'gauge', 'x').add(1, **{'__name__': 'y'})])
    assert "bad label name '__name__'" in str(err.value)


def test_promtool_reads_what_render_writes_without_a_complaint():
    rc, said = promtool_check_metrics(prom_text.render(sample_families(), header=['made by a test']))
    assert rc == 0 and said.strip() == '', said


def test_promtool_check_metrics_does_complain_about_a_bad_file():
    """The check above can fail: promtool flags a counter without _total and a missing HELP."""
    rc, said = promtool_check_metrics('# TYPE gpuops_things counter\ngpuops_things 1\n')
    assert rc != 0 and 'gpuops_things' in said, said
