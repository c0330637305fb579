# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""User regular expressions (protect, match) evaluated with a bound on time.

Python's `re` cannot be interrupted: a pattern with catastrophic backtracking (`(a+)+$`
against a long run of `a`s) pins a core for hours, and managed hosts have only the standard
library. So every search runs in a forked child that reports one byte per (pattern, text)
pair; the parent waits for each byte at most `timeout_s` and, when one does not come, kills
the child and raises PatternTimeout naming the option, the pattern and the text. Surveys
evaluate every pattern on every process they see before the ladder acts, so a bad pattern
fails the module before anything is signalled.

One fork per survey (`prime`) keeps the cost at a few milliseconds; results are cached by
(pattern, text), so the ladder's later searches are dictionary look-ups. A pattern without any
metacharacter (a server's name: `sglang`, a run's id) is a substring test, whose time grows with
the text alone: it is answered in this process, and a survey with only such patterns forks nothing.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import select
import signal
import time

# Seconds one pattern may take on one text. Real patterns on real command lines take
# microseconds; this only has to separate "slow" from "never returns", in well under 5 s.
PATTERN_TIMEOUT_S = 2.0
_SHOWN_CHARS = 60
# What makes a pattern more than a literal string. Without any of them, re searches for the string
# itself (no repetition, no alternation: nothing to backtrack over), which `in` does in time linear
# in the text. The fork such a pattern cost every survey took gpu_reclaim's first signal on 24
# ranks matched by a run id from 22 ms to 26 (bench/run reclaim --shape s12, 8 reps, medians).
_METACHARACTERS = frozenset('.^$*+?{}[]\\|()')


class PatternError(ValueError):
    """A protect/match value that is not a usable regular expression."""


class PatternTimeout(PatternError):
    """A pattern did not finish on a text within the bound (catastrophic backtracking)."""


def _shown(text):
    if len(text) <= _SHOWN_CHARS:
        return repr(text)
    return '%r... (%d characters)' % (text[:_SHOWN_CHARS], len(text))


class BoundedPattern(object):
    """One compiled pattern of a PatternSet; `search` and `pattern` as re's objects have."""

    def __init__(self, owner, position, compiled):
        self._owner = owner
        self._position = position
        self.pattern = compiled.pattern
        self.compiled = compiled
        # The string itself when the pattern is one (searched in this process, unbounded: linear).
        self.literal = compiled.pattern if not _METACHARACTERS.intersection(compiled.pattern) else None

    def search(self, text):
        """True when the pattern matches somewhere in `text` (evaluated with the bound)."""
        return self._owner.result(self._position, text)


class PatternSet(object):
    """The regexes of one option, searched with a time bound per (pattern, text)."""

    def __init__(self, patterns, option, timeout_s=PATTERN_TIMEOUT_S, clock=time.monotonic):
        self.option = option
        self.timeout_s = timeout_s
        self.clock = clock
        self._patterns = []
        for value in patterns or []:
            try:
                compiled = re.compile(value)
            except (re.error, TypeError) as exc:
                raise PatternError('%s: %r is not a valid regular expression (%s)' % (option, value, exc))
            self._patterns.append(BoundedPattern(self, len(self._patterns), compiled))
        self._results = {}

    def __iter__(self):
        return iter(self._patterns)

    def __len__(self):
        return len(self._patterns)

    def __bool__(self):
        return bool(self._patterns)

    __nonzero__ = __bool__

    def prime(self, texts):
        """Evaluate every pattern on every text not evaluated yet, in one bounded child."""
        pairs = []
        seen = set()
        for text in texts:
            if text is None:
                continue
            for pattern in self._patterns:
                key = (pattern._position, text)
                if key in self._results or key in seen:
                    continue
                if pattern.literal is not None:
                    self._results[key] = pattern.literal in text
                else:
                    seen.add(key)
                    pairs.append(key)
        if pairs:
            self._evaluate(pairs)

    def result(self, position, text):
        key = (position, text)
        if key not in self._results:
            literal = self._patterns[position].literal
            if literal is not None:
                self._results[key] = literal in text
            else:
                self._evaluate([key])
        return self._results[key]

    def _evaluate(self, pairs):
        """Fill the cache for `pairs` from a forked child; PatternTimeout if one hangs."""
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # the child: search, one byte per pair, never return into the module
            status = 0
            try:
                os.close(read_end)
                for position, text in pairs:
                    found = self._patterns[position].compiled.search(text) is not None
                    os.write(write_end, b'1' if found else b'0')
            except BaseException:  # pylint: disable=broad-except
                status = 1
            finally:
                os._exit(status)
        os.close(write_end)
        answers = bytearray()
        timed_out = False
        try:
            while len(answers) < len(pairs):
                # Each pair gets its own bound: a long list of quick searches never adds up to
                # a timeout, one search that never ends is caught in timeout_s.
                started = self.clock()
                ready = []
                while not ready:
                    left = self.timeout_s - (self.clock() - started)
                    if left <= 0:
                        break
                    ready = select.select([read_end], [], [], left)[0]
                if not ready:
                    timed_out = True
                    break
                chunk = os.read(read_end, 65536)
                if not chunk:
                    break
                answers += chunk
        finally:
            os.close(read_end)
            if len(answers) < len(pairs):
                # Our own forked evaluator, never a holder: it is ended here, not through gpu_act.
                try:
                    os.kill(child, signal.SIGKILL)
                except OSError:
                    pass
            os.waitpid(child, 0)
        for index, answer in enumerate(answers[:len(pairs)]):
            self._results[pairs[index]] = answer == ord('1')
        if len(answers) < len(pairs):
            position, text = pairs[len(answers)]
            pattern = self._patterns[position].pattern
            if timed_out:
                raise PatternTimeout(
                    '%s: pattern %r did not finish within %.1f s on the text %s (catastrophic '
                    'backtracking, e.g. nested quantifiers like (a+)+); rewrite it'
                    % (self.option, pattern, self.timeout_s, _shown(text)))
            raise PatternError('%s: evaluating pattern %r on the text %s failed (the evaluating '
                               'process ended early)' % (self.option, pattern, _shown(text)))
