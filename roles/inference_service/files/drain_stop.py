"""Stop the inference server's unit for a planned restart, letting it drain first (issue 30 item 7),
and measure it.

usage: drain_stop.py REQUEST_JSON
  REQUEST_JSON: {"unit": "NAME.service", "timeout": SECONDS (bound of the whole stop),
                 "metrics": {"url": "http://HOST:PORT/metrics", "names": [...], "timeout": S} or null}

prints JSON: {"was_active": bool, "in_flight": N or null, "in_flight_error": str or null,
              "seconds": from the stop's start to the unit inactive, "result": systemd's Result,
              "active_state": after the stop}
exit 1 (with the JSON and "error") when the stop fails or outlives its bound.

The engine drains on the SIGTERM that systemd's stop sends (vLLM up to its --shutdown-timeout, SGLang
until its last request), so the stop itself is the drain: `systemctl stop` returns when the unit is
inactive, after the drain and the engine's teardown, or after TimeoutStopSec's SIGKILL. The requests in
flight are read just before, from the engine's own Prometheus gauges (both engines export them on
/metrics: vLLM always, SGLang with --enable-metrics): a server that does not answer leaves the count
unknown and the stop goes on; the count informs the report, it never holds the stop back.
Stdlib only, Python 3.9+.
"""
import json
import math
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\S+)?$')


def in_flight(text, names):
    """The sum of the samples of `names` (every label set: one per engine, DP rank or model) in a
    Prometheus text exposition, or None when none of them is there."""
    total, seen = 0.0, False
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        match = SAMPLE.match(line)
        if not match or match.group(1) not in names:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if math.isnan(value):  # the engine has no count yet
            continue
        total, seen = total + value, True
    return int(round(total)) if seen else None


def read_in_flight(metrics):
    """(count or None, error or None) from the engine's /metrics."""
    if not metrics:
        return None, 'not serving'
    try:
        with urllib.request.urlopen(metrics['url'], timeout=float(metrics.get('timeout', 3))) as answer:
            text = answer.read(4 * 1024 * 1024).decode('utf-8', 'replace')
    except urllib.error.HTTPError as exc:
        return None, '%s answered %s' % (metrics['url'], exc.code)
    except (OSError, ValueError) as exc:
        return None, '%s: %s' % (metrics['url'], getattr(exc, 'reason', exc))
    count = in_flight(text, metrics['names'])
    if count is None:
        return None, '%s exports none of %s' % (metrics['url'], ', '.join(metrics['names']))
    return count, None


def unit_state(unit):
    out = subprocess.run(['systemctl', 'show', '-p', 'ActiveState,Result', unit], capture_output=True, text=True,
                         timeout=30, check=False).stdout
    return dict(line.split('=', 1) for line in out.splitlines() if '=' in line)


def main():
    request = json.loads(sys.argv[1])
    unit, bound = request['unit'], float(request['timeout'])
    before = unit_state(unit).get('ActiveState', '')
    out = {'was_active': before in ('active', 'activating', 'reloading'), 'in_flight': None, 'in_flight_error': None}
    if out['was_active']:
        out['in_flight'], out['in_flight_error'] = read_in_flight(request.get('metrics'))
    start = time.monotonic()
    try:
        stop = subprocess.run(['systemctl', 'stop', unit], capture_output=True, text=True, timeout=bound, check=False)
        error = None if stop.returncode == 0 else 'systemctl stop %s: %s' % (unit, (stop.stderr or '').strip())
    except subprocess.TimeoutExpired:
        error = 'systemctl stop %s did not return within %s s' % (unit, bound)
    out['seconds'] = round(time.monotonic() - start, 2)
    after = unit_state(unit)
    out['result'], out['active_state'] = after.get('Result'), after.get('ActiveState')
    if error:
        out['error'] = error
    print(json.dumps(out))
    return 1 if error else 0


if __name__ == '__main__':
    sys.exit(main())
