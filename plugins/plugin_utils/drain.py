# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drain before a planned stop of the inference server (issue 30 item 7), pure.

drain_inputs: inference_service_drain_timeout against the stop timeout that must cover it, as codes
    naming the variable (empty when they fit).
drain_record: what roles/inference_service/files/drain_stop.py measured -> the `drain` entry of the
    inference_service_server fact: {in_flight, in_flight_error, seconds, timeout, killed}.
drain_say: the one place those become sentences.

Both engines finish the requests in flight on SIGTERM when told to: vLLM (0.18+) waits up to its
--shutdown-timeout, SGLang waits for its last request with no bound of its own. Whichever it is, the
unit's stop timeout (TimeoutStopSec; the runtime's stop --time in a container) ends the stop with a
SIGKILL, so a drain longer than it would be cut by it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math


def _whole(value):
    """A whole number of seconds >= 0, or None. Booleans are not numbers here."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(number) or math.isinf(number) or number < 0 or number != int(number):
        return None
    return int(number)


def drain_inputs(drain_timeout, stop_timeout):
    """[{code, variable, value, ...}] for a drain timeout that is not a whole number of seconds >= 0,
    or that is longer than the stop timeout."""
    drain, stop = _whole(drain_timeout), _whole(stop_timeout)
    if drain is None:
        return [{'code': 'drain_timeout_bad', 'variable': 'inference_service_drain_timeout', 'value': drain_timeout}]
    if stop is None:
        return [{'code': 'stop_timeout_bad', 'variable': 'inference_service_stop_timeout', 'value': stop_timeout}]
    if drain > stop:
        return [{'code': 'drain_longer_than_stop', 'variable': 'inference_service_drain_timeout', 'value': drain,
                 'stop_timeout': stop}]
    return []


def drain_inputs_say(problems):
    said = []
    for p in problems or []:
        if p['code'] == 'drain_longer_than_stop':
            said.append('inference_service_drain_timeout=%s is longer than inference_service_stop_timeout=%s: the '
                        'stop would SIGKILL the server before its drain ends; raise the stop timeout or lower the '
                        'drain timeout' % (p['value'], p['stop_timeout']))
        else:
            said.append('%s=%r must be a whole number of seconds, 0 or more' % (p['variable'], p['value']))
    return said


def drain_inputs_checked(drain_timeout, stop_timeout):
    """drain_inputs with each problem's sentence as `msg`."""
    problems = drain_inputs(drain_timeout, stop_timeout)
    return [dict(p, msg=msg) for p, msg in zip(problems, drain_inputs_say(problems))]


def _round(value):
    try:
        return round(float(value), 2)
    except (TypeError, ValueError):
        return None


def drain_record(stopped, drain_timeout):
    """The `drain` entry of inference_service_server from drain_stop.py's output, or None when the stop
    found the unit not running (nothing to drain).

    in_flight: the requests the engine counted in flight when the stop began (None when it could not be
    read: in_flight_error says why). seconds: from the stop's start to the unit inactive, the drain and
    the engine's teardown together. killed: systemd's stop timeout ran out and it SIGKILLed the unit."""
    if not isinstance(stopped, dict) or not stopped.get('was_active'):
        return None
    return {'in_flight': stopped.get('in_flight'), 'in_flight_error': stopped.get('in_flight_error'),
            'seconds': _round(stopped.get('seconds')), 'timeout': _whole(drain_timeout),
            'killed': stopped.get('result') == 'timeout'}


def drain_say(record):
    """One sentence for drain_record's entry; '' for None."""
    if not record:
        return ''
    count = record.get('in_flight')
    if count is None:
        flight = 'an unknown number of requests in flight (%s)' % (record.get('in_flight_error') or 'not read')
    else:
        flight = '%d request%s in flight' % (count, '' if count == 1 else 's')
    said = 'stopped with %s; drained and stopped in %s s (drain timeout %s s)' % (
        flight, record.get('seconds'), record.get('timeout'))
    if record.get('killed'):
        said += ', then SIGKILLed by systemd at the stop timeout'
    return said
