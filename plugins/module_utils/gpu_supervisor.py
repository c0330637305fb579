# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Supervisors: process supervisors under systemd as owners of GPU holders (issue 19 item 3).

Everything this collection knows about a process supervisor is one row of SUPERVISORS: how it
is recognised, how the holder's program is found, how the program is stopped and how to see
that it stayed down. Adding a supervisor is a row here plus its tests.

What the lab's real supervisors show (tests/integration/test_supervisors.py, a LAB_RUNTIMES=1
node, Debian bookworm): every supervised program sits in its supervisor's systemd unit cgroup,
so the only lever the unit owner offers is that whole unit, and stopping it ends every program
of the supervisor (measured: the bystander program too; runit.service is left failed). Killing
the program's process is no lever either: autorestart brings it back (supervisord at once,
runsv after 1 s). The lever is the supervisor's own stop of that one program.

Identity, never names. A title, a program name or a command line a user controls never chooses
the lever. A supervisor is recognised on the holder's ancestry (at most MAX_DEPTH ancestors,
all in the holder's cgroup) by what the kernel and systemd keep:
- supervisord: the ancestor is its unit's MainPID (systemd's record), runs as root from a
  root-owned python3, and argv[1] is one of the row's scripts (a root process's argv is root's);
  the program is the status line (`supervisorctl -c CONF status`, CONF from supervisord's own
  `-c`) whose PID is the ancestor's child on the holder's path;
- runit and s6: a root `runsv` (`s6-supervise`) whose parent, a root `runsvdir` (`s6-svscan`),
  is the unit's MainPID; the service is the monitor's cwd (a kernel fact), accepted only when
  that directory and its `supervise/` are root's and not group- or world-writable, and its
  status gives the program's PID;
- pm2: the God Daemon, a `node` running as the holder's user, whose `$PM2_HOME/pm2.pid` names it
  (pm2 writes it); the program is the `pm2 jlist` entry with that PID, asked as that user. Its
  lever runs as that user, never root: it can do only what she could do herself.

Pure: the table, matching ancestry facts (gpu_observe.supervisor_chain reads them) against it,
argv from it, and parsing each status output. Running a command is gpu_observe's (status) or
gpu_act's (stop).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import json
import os
import re

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text

# How many ancestors above a holder are looked at: the program may be the holder itself
# (supervisord -> holder), its parent (supervisord -> launcher -> scheduler), and a
# monitor's shape adds one (runsvdir -> runsv -> program -> holder).
MAX_DEPTH = 4

# After a program reads down, how long its status is watched for a restart before the GPUs may
# be called free: runsv waits 1 s before it starts a service again (measured in the lab: the
# holder came back 1.0-1.1 s after a kill); supervisord restarts at once. A program its
# supervisor put down is not restarted by its own word (STOPPED, `down ... normally up` without
# `want up`); this watch checks that word against what happens.
STAY_DOWN_S = 1.5

# Why a supervised holder is left (the `remaining` entries' reason_code; gpu_say.supervised writes
# the sentences).
# The CLI's own failures are gpu_owner's (the same for a container's runtime), named here too for
# the code that runs a supervisor's status and stop (gpu_flow, gpu_act).
CLI_MISSING, CLI_TIMEOUT, CLI_FAILED = gpu_owner.CLI_MISSING, gpu_owner.CLI_TIMEOUT, gpu_owner.CLI_FAILED
LEVER_OFF = 'supervised'            # stop_supervised: false
NOT_LISTED = 'supervisor_not_listed'  # the status answered and lists no program with that PID
CAME_BACK = 'supervisor_restarted'    # put down, the supervisor started it again
STOP_FAILED = 'supervisor_stop_failed'

# One row per supervisor. `daemon`: the executable names (basenames) of the supervisor itself;
# `monitor`: of its per-service monitor between it and the program (None: the program is the
# daemon's child); `script`: for an interpreted supervisor, the paths argv[1] may name;
# `main_pid`: the daemon must be its unit's MainPID; `as_user`: the daemon runs as the holder's
# user and the CLI is run as that user. `status` and `stop` are argv templates ({conf}, {id},
# {grace}, {grace_ms}); `kill`: what ends a program that outlives the stop's grace; `manual` the
# command a person runs by hand; `parse` how `status` output is read.
SUPERVISORS = collections.OrderedDict([
    ('supervisord', {
        'cli': 'supervisorctl',
        'daemon': ('python3', 'python'),
        'monitor': None,
        'script': ('/usr/bin/supervisord', '/usr/local/bin/supervisord'),
        'main_pid': True,
        'as_user': False,
        'status': ['supervisorctl', '-c', '{conf}', 'status'],
        'stop': ['supervisorctl', '-c', '{conf}', 'stop', '{id}'],
        'kill': None,
        'manual': 'supervisorctl -c {conf} stop {id}',
        'parse': 'supervisorctl',
    }),
    ('runit', {
        'cli': 'sv',
        'daemon': ('runsvdir',),
        'monitor': ('runsv',),
        'script': None,
        'main_pid': True,
        'as_user': False,
        'status': ['sv', 'status', '{id}'],
        # force-stop: down (TERM, CONT, and never restarted), wait up to -w seconds, then KILL.
        'stop': ['sv', '-w', '{grace}', 'force-stop', '{id}'],
        'kill': None,
        'manual': 'sv down {id}',
        'parse': 'sv',
    }),
    ('s6', {
        'cli': 's6-svc',
        'daemon': ('s6-svscan',),
        'monitor': ('s6-supervise',),
        'script': None,
        'main_pid': True,
        'as_user': False,
        'status': ['s6-svstat', '-o', 'up,wantedup,pid', '{id}'],
        # -d: want down (TERM, then CONT; never restarted); -wd -T: wait for it, bounded.
        'stop': ['s6-svc', '-wd', '-T', '{grace_ms}', '-d', '{id}'],
        'kill': ['s6-svc', '-k', '{id}'],
        'manual': 's6-svc -d {id}',
        'parse': 's6-svstat',
    }),
    ('pm2', {
        'cli': 'pm2',
        'daemon': ('node', 'nodejs'),
        'monitor': None,
        'script': None,
        'main_pid': False,
        'as_user': True,
        'status': ['pm2', 'jlist'],
        'stop': ['pm2', 'stop', '{id}'],
        'kill': None,
        'manual': 'pm2 stop {id}',
        'parse': 'pm2',
    }),
])

# One ancestor (or the holder) as the match needs it, read by gpu_observe.supervisor_chain:
# `exe` the path /proc/PID/exe names, `exe_uid` its file's owner, `uids` (real, effective,
# saved, filesystem), `cgroup` the /proc/PID/cgroup text, `argv` (root processes only, else
# None), `cwd` where /proc/PID/cwd leads and `cwd_root` whether that directory and its
# supervise/ are root's and not group- or world-writable, `pm2` whether $PM2_HOME/pm2.pid
# names this PID, with `home` that PM2_HOME.
Link = collections.namedtuple('Link', 'pid start_time ppid exe exe_uid uids cgroup argv cwd cwd_root pm2 home')


def _base(path):
    name = os.path.basename(path or '')
    suffix = ' (deleted)'
    return name[:-len(suffix)] if name.endswith(suffix) else name


def _is_root(link):
    return bool(link.uids) and all(uid == 0 for uid in link.uids) and link.exe_uid == 0


def _python(name, daemon):
    # /usr/bin/python3 is a link to python3.11: the exe names the versioned file.
    return any(name == d or re.match(r'^%s\.\d+$' % re.escape(d), name) for d in daemon)


def _conf(argv):
    """supervisord's own -c/--configuration, or None (supervisorctl then finds the default)."""
    argv = list(argv or [])
    for index, arg in enumerate(argv):
        if arg in ('-c', '--configuration') and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith('--configuration='):
            return arg.split('=', 1)[1]
        if arg.startswith('-c') and len(arg) > 2:
            return arg[2:]
    return None


def match(chain, main_pid):
    """The supervisor of the holder chain[0], or None.

    `chain`: Links of the holder and its ancestors, nearest first (at most MAX_DEPTH + 1);
    `main_pid`: the MainPID systemd gives for the holder's system unit (None: none). Returns
    {'runtime': row name, 'pid', 'start_time' (the supervisor's), 'program_pid' (its child on
    the holder's path), 'service' (runit/s6: the service directory), 'conf' (supervisord),
    'home' and 'uid' (pm2)}."""
    if not chain:
        return None
    holder = chain[0]
    same = list(chain[:MAX_DEPTH + 1])
    for index in range(1, len(same)):
        if same[index].cgroup != holder.cgroup:
            same = same[:index]
            break
    for name, row in SUPERVISORS.items():
        for index in range(1, len(same)):
            found = _match_row(name, row, same, index, main_pid)
            if found:
                return found
    return None


def _match_row(name, row, chain, index, main_pid):
    link, holder = chain[index], chain[0]
    program = chain[index - 1]
    if row['monitor']:
        if index + 1 >= len(chain) or _base(link.exe) not in row['monitor']:
            return None
        daemon = chain[index + 1]
        if _base(daemon.exe) not in row['daemon'] or not (_is_root(link) and _is_root(daemon)):
            return None
        if row['main_pid'] and daemon.pid != main_pid:
            return None
        if not link.cwd or not link.cwd_root:
            return None
        return {'runtime': name, 'pid': daemon.pid, 'start_time': daemon.start_time,
                'program_pid': program.pid, 'service': link.cwd, 'conf': None, 'home': None, 'uid': 0}
    exe = _base(link.exe)
    if not (_python(exe, row['daemon']) if row['script'] else exe in row['daemon']):
        return None
    if row['as_user']:
        # pm2: the daemon runs as the holder's user (all four uids), and its own pid file names it.
        if not link.uids or not holder.uids or set(link.uids) != set([holder.uids[0]]) or not link.pm2:
            return None
        return {'runtime': name, 'pid': link.pid, 'start_time': link.start_time,
                'program_pid': program.pid, 'service': None, 'conf': None, 'home': link.home,
                'uid': holder.uids[0]}
    if not _is_root(link) or (row['main_pid'] and link.pid != main_pid):
        return None
    argv = link.argv or []
    if row['script'] and (len(argv) < 2 or argv[1] not in row['script']):
        return None
    return {'runtime': name, 'pid': link.pid, 'start_time': link.start_time, 'program_pid': program.pid,
            'service': None, 'conf': _conf(argv[2:]), 'home': None, 'uid': 0}


def argv(runtime, action, supervisor, program_id, grace=0):
    """The argv of `action` ('status', 'stop', 'kill') for the program `program_id` of a matched
    supervisor, or None when the row has no such command."""
    template = SUPERVISORS[runtime].get(action)
    if not template:
        return None
    values = {'{conf}': supervisor.get('conf'), '{id}': program_id or '',
              '{grace}': '%d' % max(1, int(round(grace or 0))),
              '{grace_ms}': '%d' % max(1000, int(round((grace or 0) * 1000)))}
    out = []
    for arg in template:
        value = values.get(arg, arg)
        if value is None:
            # No -c: supervisorctl finds supervisord's default config itself.
            if out and out[-1] == '-c':
                out.pop()
            continue
        out.append(value)
    return out


def manual(owner):
    """The command a person runs by hand to stop the holder's program (text for a message)."""
    sup = owner.supervisor or {}
    row = SUPERVISORS.get(owner.runtime) or {}
    program = owner.id or 'PROGRAM'
    if not row:
        return None
    text = row['manual'].format(conf=sup.get('conf') or '', id=program)
    text = text.replace(' -c  ', ' ')
    if row['as_user'] and sup.get('uid'):
        text = 'as uid %s with PM2_HOME=%s: %s' % (sup['uid'], sup.get('home'), text)
    return escape_text(text)


def status_command(owner):
    """The status command, as text, for a message."""
    sup = owner.supervisor or {}
    words = argv(owner.runtime, 'status', sup, owner.id or sup.get('service'))
    return escape_text(' '.join(words)) if words else None


# --- status output ------------------------------------------------------------------------------

_SUPERVISORCTL = re.compile(r'^(\S+)\s+(RUNNING|STOPPED|STARTING|BACKOFF|STOPPING|EXITED|FATAL|UNKNOWN)\b(.*)$')
_SV = re.compile(r'^(run|down|finish):\s+([^:]+):\s+(?:\(pid (\d+)\)\s+)?(.*)$')


def parse_status(style, text):
    """The programs a status output lists: [{'name', 'state', 'pid' (or None), 'down'}], or
    None when the output is not understood. `down` is the supervisor's word that it will not
    start the program again by itself (put down, not merely exited)."""
    try:
        if style == 'supervisorctl':
            return _parse_supervisorctl(text)
        if style == 'sv':
            return _parse_sv(text)
        if style == 's6-svstat':
            return _parse_s6(text)
        if style == 'pm2':
            return _parse_pm2(text)
    except (ValueError, TypeError, AttributeError, IndexError, KeyError):
        return None
    return None


def _parse_supervisorctl(text):
    found = []
    for line in (text or '').splitlines():
        hit = _SUPERVISORCTL.match(line.strip())
        if not hit:
            continue
        pid = re.search(r'\bpid (\d+),', hit.group(3))
        found.append({'name': hit.group(1), 'state': hit.group(2), 'pid': int(pid.group(1)) if pid else None,
                      # STOPPED: stopped by request; autorestart applies to exits, never to it.
                      'down': hit.group(2) == 'STOPPED'})
    return found or None


def _parse_sv(text):
    line = (text or '').strip().splitlines()[0] if (text or '').strip() else ''
    hit = _SV.match(line)
    if not hit:
        return None
    state, rest = hit.group(1), hit.group(4)
    # "down: /etc/sv/x: 3s, normally up": down by request; ", want up" would be restarted.
    first = rest.split(';')[0]
    return [{'name': hit.group(2), 'state': state, 'pid': int(hit.group(3)) if hit.group(3) else None,
             'down': state == 'down' and 'want up' not in first}]


def _parse_s6(text):
    words = (text or '').split()
    if len(words) != 3 or words[0] not in ('true', 'false') or words[1] not in ('true', 'false'):
        return None
    pid = int(words[2])
    up, wanted = words[0] == 'true', words[1] == 'true'
    return [{'name': None, 'state': 'up' if up else 'down', 'pid': pid if pid > 0 else None,
             'down': not up and not wanted}]


def _parse_pm2(text):
    # `pm2 jlist`: a JSON list, one object per process: name, pid, pm_id, pm2_env.status.
    data = json.loads(text)
    if not isinstance(data, list):
        return None
    found = []
    for entry in data:
        env = entry.get('pm2_env') or {}
        pid = entry.get('pid')
        status = env.get('status')
        found.append({'name': entry.get('name') or env.get('name'), 'state': status,
                      'pid': pid if isinstance(pid, int) and pid > 0 else None,
                      'down': status == 'stopped'})
    return found


def program_of(runtime, entries, program_pid, service=None):
    """(program id, program name) of the status entry whose PID is `program_pid`, or None."""
    for entry in entries or ():
        if entry['pid'] == program_pid:
            if service:
                return service, os.path.basename(service.rstrip('/'))
            return entry['name'], entry['name']
    return None


def is_down(runtime, entries, program_id):
    """Whether the status says the program is down by request (for runit/s6 the status is of
    the one service; supervisord and pm2 list every program)."""
    for entry in entries or ():
        if SUPERVISORS[runtime]['monitor'] or entry['name'] == program_id:
            return entry['down'] and entry['pid'] is None
    return False


def running_pid(runtime, entries, program_id):
    for entry in entries or ():
        if SUPERVISORS[runtime]['monitor'] or entry['name'] == program_id:
            return entry['pid']
    return None


# --- the lever's facts (gpu_say writes its sentences) --------------------------------------------

def stoppable(owner):
    """Whether the supervisor may be asked to stop this program: it was matched by identity, its
    status named the program, and nothing failed."""
    return owner.kind == 'supervisor' and bool(owner.id) and not owner.cli_error


def skip_code(owner):
    """The reason code for a supervised holder the signal ladder leaves to its supervisor."""
    return (owner.cli_error or {}).get('code') or LEVER_OFF


def key(owner):
    """One program of one supervisor: (row, the supervisor's PID and start time, program id)."""
    sup = owner.supervisor or {}
    return (owner.runtime, sup.get('pid'), sup.get('start_time'), owner.id or sup.get('program_pid'))


def daemon_row(chain, main_pid):
    """The row whose supervisor `chain[0]` is, by identity alone (a root daemon that is its
    unit's MainPID), or None: such a unit is never stopped whole, even for a holder that is not
    under the supervisor (an orphan of a stopped program)."""
    if not chain or chain[0].pid != main_pid or not _is_root(chain[0]):
        return None
    link = chain[0]
    exe = _base(link.exe)
    for name, row in SUPERVISORS.items():
        if row['as_user'] or not row['main_pid']:
            continue
        if row['script']:
            if _python(exe, row['daemon']) and len(link.argv or []) > 1 and link.argv[1] in row['script']:
                return name
        elif exe in row['daemon']:
            return name
    return None
