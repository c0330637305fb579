"""gpu_patterns: user regexes searched in a forked child, each search bounded in time."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import os
import re

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_patterns as patterns


def test_search_answers_like_re_and_keeps_the_pattern_text():
    found = patterns.PatternSet(['^sglang', 'jupyter'], 'protect')
    first, second = list(found)
    assert first.pattern == '^sglang' and second.pattern == 'jupyter'
    found.prime(['sglang::scheduler_TP1', 'python3 -m jupyter lab', 'vllm'])
    assert first.search('sglang::scheduler_TP1') is True
    assert first.search('python3 -m jupyter lab') is False
    assert second.search('python3 -m jupyter lab') is True
    assert second.search('vllm') is False
    # Not primed: evaluated on demand, same answer.
    assert first.search('sglang.launch_server') is True


def test_empty_set_is_falsy_and_forks_nothing():
    empty = patterns.PatternSet([], 'match')
    assert not empty and len(empty) == 0
    empty.prime(['anything'])     # no pattern: nothing to evaluate


def test_invalid_pattern_names_the_option_and_value():
    with pytest.raises(patterns.PatternError, match=r"match: '\(unclosed' is not a valid regular expression"):
        patterns.PatternSet(['ok', '(unclosed'], 'match')


def test_catastrophic_pattern_fails_in_bounded_time_naming_it():
    # (a+)+$ against 'aaaa...b' backtracks 2^n times: without the bound this never returns.
    hostile = patterns.PatternSet(['sglang', '(a+)+$'], 'protect', timeout_s=1.0)
    # Returning at all shows the bound (the search alone would run for 2^5000 steps); the
    # error says which bound cut it off.
    with pytest.raises(patterns.PatternTimeout) as caught:
        hostile.prime(['python3 serve.py', 'a' * 5000 + 'b'])
    text = str(caught.value)
    assert "protect: pattern '(a+)+$' did not finish within 1.0 s" in text
    assert '(5001 characters)' in text


def test_the_evaluating_child_is_gone_after_a_timeout():
    hostile = patterns.PatternSet(['(a+)+$'], 'match', timeout_s=0.5)

    def children():
        with open('/proc/self/task/%d/children' % os.getpid()) as handle:
            return set(handle.read().split())
    before = children()
    with pytest.raises(patterns.PatternTimeout):
        hostile.prime(['a' * 3000 + 'b'])
    # Killed and reaped: no child of ours (not even a zombie) is left behind.
    assert children() == before


def test_many_quick_searches_never_add_up_to_a_timeout():
    quick = patterns.PatternSet(['x%d$' % i for i in range(20)], 'protect', timeout_s=0.5)
    texts = ['process-%d with a long command line %s' % (i, 'z' * 2000) for i in range(200)]
    quick.prime(texts)      # 4000 searches, each far below the bound
    assert not any(p.search(t) for p in quick for t in texts[:5])


def test_literal_patterns_answer_like_re_without_forking(monkeypatch):
    # A pattern without metacharacters (a server's name, a run id) is a substring test: answered
    # here, linear in the text, so a survey with only such patterns forks no evaluator.
    texts = ['gpurt-d8f6e1af s12r24-0-3', 'python3 -m sglang.launch_server', 'vllm serve', 'Sglang', '']
    values = ['gpurt-d8f6e1af', 'sglang', 'keep me', 'vllm serve']
    expected = dict(((value, text), re.search(value, text) is not None) for value in values for text in texts)

    def no_fork():
        raise AssertionError('a literal pattern forked an evaluator')
    monkeypatch.setattr(os, 'fork', no_fork)
    literal = patterns.PatternSet(values, 'match')
    literal.prime(texts)
    assert dict(((p.pattern, t), p.search(t)) for p in literal for t in texts) == expected
    # not primed: the same, still without a fork
    assert [p.search('sglang::scheduler_TP0') for p in literal] == [False, True, False, False]


def test_a_pattern_with_any_metacharacter_is_still_searched_in_the_bounded_child(monkeypatch):
    forks = []
    real_fork = os.fork
    monkeypatch.setattr(os, 'fork', lambda: forks.append(1) or real_fork())
    mixed = patterns.PatternSet(['sglang', 'TP[0-9]$'], 'match')
    mixed.prime(['sglang::scheduler_TP0', 'vllm'])
    assert len(forks) == 1
    assert [p.search('sglang::scheduler_TP0') for p in mixed] == [True, True]
    assert [p.search('vllm') for p in mixed] == [False, False]
