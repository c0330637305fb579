# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus' text exposition format (version 0.0.4), as node_exporter's textfile collector
reads it: written from metric families, and read back (issue 33).

No maintained library fits a module: prometheus_client is not in the standard library, and a
managed host has the standard library and nvidia-ml-py only. The format is a few lines:
`# HELP name text`, `# TYPE name counter|gauge`, then `name{label="value",...} value` samples,
each family's samples together after its HELP and TYPE. tests/unit/plugins/module_utils/
test_prom_text.py checks what this writes with promtool's own parser (`promtool check metrics`).

`parse` reads back only what `render` writes (no timestamps, no exemplars, no histogram), so
that a run can carry its counters on from the file the last run left; anything else in the
file is an error naming the line (`ParseError`).

Pure, stdlib only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import re

NAME = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*$')
LABEL_NAME = re.compile(r'^[a-zA-Z_][a-zA-Z0-9_]*$')
TYPES = ('counter', 'gauge')
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ([^ ]+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')


class ParseError(ValueError):
    """A line that is not what render writes; the message names the line."""


class Family(object):
    """One metric: its name, type, help text, and samples as (labels dict, value) pairs."""

    __slots__ = ('name', 'kind', 'help', 'samples')

    def __init__(self, name, kind, help_text, samples=()):
        if not NAME.match(name):
            raise ValueError('bad metric name %r' % (name,))
        if kind not in TYPES:
            raise ValueError('bad metric type %r for %s (counter or gauge)' % (kind, name))
        self.name = name
        self.kind = kind
        self.help = help_text
        self.samples = list(samples)

    def add(self, value, **labels):
        self.samples.append((labels, value))
        return self


def _escape_help(text):
    return text.replace('\\', '\\\\').replace('\n', '\\n')


def _escape_value(text):
    return text.replace('\\', '\\\\').replace('\n', '\\n').replace('"', '\\"')


def _unescape_value(text):
    return re.sub(r'\\([\\"n])', lambda m: '\n' if m.group(1) == 'n' else m.group(1), text)


def number(value):
    """A sample value as the format writes it: integers without a point, NaN, +Inf, -Inf."""
    if isinstance(value, bool):
        return '1' if value else '0'
    value = float(value)
    if math.isnan(value):
        return 'NaN'
    if math.isinf(value):
        return '+Inf' if value > 0 else '-Inf'
    if value == int(value) and abs(value) < 1e15:
        return '%d' % value
    return repr(value)


def render(families, header=()):
    """The file's text: `header` lines as comments first, then each family with HELP and TYPE."""
    lines = ['# ' + line for line in header]
    for family in families:
        lines.append('# HELP %s %s' % (family.name, _escape_help(family.help)))
        lines.append('# TYPE %s %s' % (family.name, family.kind))
        for labels, value in family.samples:
            for key in labels:
                if not LABEL_NAME.match(key) or key.startswith('__'):
                    raise ValueError('bad label name %r on %s' % (key, family.name))
            text = ','.join('%s="%s"' % (key, _escape_value(str(labels[key]))) for key in sorted(labels))
            lines.append('%s%s %s' % (family.name, '{%s}' % text if text else '', number(value)))
    return '\n'.join(lines) + '\n'


def _labels(text, lineno):
    found = {}
    rest = text
    while rest:
        match = _LABEL.match(rest)
        if not match:
            raise ParseError('line %d: labels not understood: {%s}' % (lineno, text))
        found[match.group(1)] = _unescape_value(match.group(2))
        rest = rest[match.end():]
    return found


def parse(text):
    """Samples of a file render wrote: {(name, ((label, value), ...) sorted): float}, and the
    TYPE of each name. Raises ParseError naming the first line that is neither a comment, a
    blank line nor a sample."""
    samples = {}
    types = {}
    for lineno, line in enumerate(text.split('\n'), 1):
        if not line:
            continue
        if line.startswith('#'):
            parts = line.split(None, 3)
            if len(parts) == 4 and parts[1] == 'TYPE':
                types[parts[2]] = parts[3]
            continue
        match = _SAMPLE.match(line)
        if not match:
            raise ParseError('line %d: not a sample: %r' % (lineno, line[:120]))
        name, labels, value = match.groups()
        try:
            figure = float(value)
        except ValueError:
            raise ParseError('line %d: %s has no number: %r' % (lineno, name, value[:40]))
        key = (name, tuple(sorted(_labels(labels or '', lineno).items())))
        samples[key] = figure
    return samples, types
