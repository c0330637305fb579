"""gpu_supervisor: the table's identity match on ancestry facts, argv, the status outputs, the
sentences; and the hooks in gpu_decide and the ladder (gpu_flow) with a scripted actor. The
family's stop through a supervisor is gpu_family_supervisor's (test_gpu_family_supervisor.py).

The ancestry facts mirror what the lab's real supervisors show (tests/integration/
test_supervisors.py, Debian bookworm): supervisord is `/usr/bin/python3 /usr/bin/supervisord -n
-c /etc/supervisor/supervisord.conf` (exe python3.11), supervisor.service's MainPID and each
program's parent; runit's runsv (cwd the service directory) under runsvdir, runit.service's
MainPID; s6's s6-supervise under s6-svscan. Status outputs are the real CLIs' (supervisorctl
4.2.5, sv 2.1.2, s6-svstat 2.11 with -o, copied from the lab node). pm2 is not packaged in Debian
12, so its `pm2 jlist` output is written from pm2's documented format (a JSON list, one object per
process: name, pid, pm_id, pm2_env.status, monit), not captured from a real pm2.
"""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import json

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_lever as lever
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_observe
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_supervisor as sup
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_supervisor import Link

from .test_gpu_flow import ScriptedActor, ScriptedSurveyor, held_by, ladder

SUP_CG = '0::/system.slice/supervisor.service\n'
RUNIT_CG = '0::/system.slice/runit.service\n'
ROOT = (0, 0, 0, 0)
CONF = '/etc/supervisor/supervisord.conf'


def link(pid, exe, ppid, cgroup=SUP_CG, uids=ROOT, exe_uid=0, argv=None, cwd='/', cwd_root=False, pm2=False,
         home=None):
    return Link(pid, 1000 + pid, ppid, exe, exe_uid, uids, cgroup, argv, cwd, cwd_root, pm2, home)


def holder(pid=300, ppid=40, cgroup=SUP_CG, uids=ROOT):
    # Its title and command line are the user's (sglang::scheduler_TP0): never read.
    return link(pid, '/usr/bin/python3.11', ppid, cgroup=cgroup, uids=uids, exe_uid=0)


def supervisord(pid=40, argv=None, **kw):
    return link(pid, '/usr/bin/python3.11', 1,
                argv=argv or ['/usr/bin/python3', '/usr/bin/supervisord', '-n', '-c', CONF], **kw)


def runit_chain(cwd_root=True, runsv_uid=0, main=37):
    return [holder(500, 480, RUNIT_CG),
            link(480, '/usr/bin/runsv', 37, RUNIT_CG, uids=(runsv_uid,) * 4, argv=['runsv', 'x'],
                 cwd='/etc/sv/worker', cwd_root=cwd_root),
            link(37, '/usr/bin/runsvdir', 1, RUNIT_CG, argv=['runsvdir', '-P', '/etc/service', 'log: ...'])]


# --- identity --------------------------------------------------------------------------------------

def test_supervisord_is_the_units_main_pid_running_its_script_as_root():
    found = sup.match([holder(), supervisord()], main_pid=40)
    assert found == {'runtime': 'supervisord', 'pid': 40, 'start_time': 1040, 'program_pid': 300,
                     'service': None, 'conf': CONF, 'home': None, 'uid': 0}


@pytest.mark.parametrize('why, chain, main_pid', [
    ('not the MainPID systemd gives', [holder(), supervisord()], 41),
    ('no unit (a session): no MainPID', [holder(), supervisord()], None),
    ('another script', [holder(), supervisord(argv=['/usr/bin/python3', '/home/a/supervisord', '-n'])], 40),
    ('a user runs it', [holder(), supervisord(uids=(1000,) * 4, argv=None)], 40),
    ('a user owns the executable', [holder(), supervisord(exe_uid=1000)], 40),
    ('not the same cgroup', [holder(), supervisord(cgroup='0::/system.slice/other.service\n')], 40),
])
def test_supervisord_is_not_taken_on_anything_less(why, chain, main_pid):
    assert sup.match(chain, main_pid) is None, why


def test_a_title_or_command_line_saying_supervisord_chooses_nothing():
    # A user's process re-titled "supervisord" with argv naming the script: argv of a non-root
    # process is not even read (gpu_observe.supervisor_chain gives None), and it is no MainPID.
    fake = link(41, '/usr/bin/python3.11', 1, uids=(1000,) * 4, exe_uid=0, argv=None)
    assert sup.match([holder(ppid=41), fake], main_pid=40) is None


def test_the_program_is_the_supervisors_child_on_the_holders_path():
    launcher = link(290, '/usr/bin/bash', 40)
    found = sup.match([holder(ppid=290), launcher, supervisord()], main_pid=40)
    assert (found['runtime'], found['program_pid']) == ('supervisord', 290)


def test_supervisord_without_c_lets_supervisorctl_find_its_default_config():
    found = sup.match([holder(), supervisord(argv=['/usr/bin/python3', '/usr/bin/supervisord', '-n'])], 40)
    assert found['conf'] is None
    assert sup.argv('supervisord', 'stop', found, 'worker') == ['supervisorctl', 'stop', 'worker']


def test_runit_is_runsv_under_the_units_runsvdir_with_a_root_service_directory():
    found = sup.match(runit_chain(), main_pid=37)
    assert found == {'runtime': 'runit', 'pid': 37, 'start_time': 1037, 'program_pid': 500,
                     'service': '/etc/sv/worker', 'conf': None, 'home': None, 'uid': 0}


@pytest.mark.parametrize('why, chain, main_pid', [
    ('a service directory others may write', runit_chain(cwd_root=False), 37),
    ('runsv not root', runit_chain(runsv_uid=1000), 37),
    ('runsvdir not the MainPID', runit_chain(), 38),
])
def test_runit_is_not_taken_on_anything_less(why, chain, main_pid):
    assert sup.match(chain, main_pid) is None, why


def test_s6_is_s6_supervise_under_the_units_s6_svscan():
    cg = '0::/system.slice/s6.service\n'
    chain = [holder(700, 690, cg), link(690, '/usr/bin/s6-supervise', 60, cg, cwd='/etc/s6/worker', cwd_root=True),
             link(60, '/usr/bin/s6-svscan', 1, cg)]
    found = sup.match(chain, main_pid=60)
    assert (found['runtime'], found['service'], found['program_pid']) == ('s6', '/etc/s6/worker', 700)


def test_pm2_is_a_node_daemon_of_the_holders_user_whose_pid_file_names_it():
    user = (1000,) * 4
    cg = '0::/user.slice/user-1000.slice/session-3.scope\n'
    daemon = link(800, '/usr/bin/node', 1, cg, uids=user, exe_uid=0, pm2=True, home='/home/a/.pm2')
    found = sup.match([holder(810, 800, cg, uids=user), daemon], main_pid=None)
    assert found == {'runtime': 'pm2', 'pid': 800, 'start_time': 1800, 'program_pid': 810, 'service': None,
                     'conf': None, 'home': '/home/a/.pm2', 'uid': 1000}
    other_user = daemon._replace(uids=(1001,) * 4)
    assert sup.match([holder(810, 800, cg, uids=user), other_user], None) is None
    no_pid_file = daemon._replace(pm2=False)
    assert sup.match([holder(810, 800, cg, uids=user), no_pid_file], None) is None


def test_a_supervisors_unit_is_known_by_its_main_pid_alone():
    assert sup.daemon_row([supervisord()], 40) == 'supervisord'
    assert sup.daemon_row([runit_chain()[2]], 37) == 'runit'
    assert sup.daemon_row([supervisord()], 41) is None
    assert sup.daemon_row([link(40, '/usr/bin/python3.11', 1, argv=['/usr/bin/python3', 'app.py'])], 40) is None


# --- argv and sentences ----------------------------------------------------------------------------

def owner_of(found, program_id, name=None, error=None, unit='supervisor.service'):
    return gpu_owner.new_owner(gpu_owner.SUPERVISOR, '/system.slice/' + unit, runtime=found['runtime'],
                               id=program_id, name=name or program_id, unit=unit,
                               manager=gpu_owner.SYSTEM_MANAGER, confirmed=True, cli_error=error,
                               supervisor=dict((k, v) for k, v in found.items() if k != 'runtime'))


def test_each_rows_stop_and_status():
    sd = sup.match([holder(), supervisord()], 40)
    assert sup.argv('supervisord', 'stop', sd, 'worker') == ['supervisorctl', '-c', CONF, 'stop', 'worker']
    assert sup.argv('supervisord', 'status', sd, 'worker') == ['supervisorctl', '-c', CONF, 'status']
    rn = sup.match(runit_chain(), 37)
    assert sup.argv('runit', 'stop', rn, '/etc/sv/worker', grace=30) == ['sv', '-w', '30', 'force-stop', '/etc/sv/worker']
    assert sup.argv('runit', 'stop', rn, '/etc/sv/worker', grace=0) == ['sv', '-w', '1', 'force-stop', '/etc/sv/worker']
    assert sup.argv('s6', 'stop', rn, '/etc/s6/w', grace=1.5) == ['s6-svc', '-wd', '-T', '1500', '-d', '/etc/s6/w']
    assert sup.argv('s6', 'status', rn, '/etc/s6/w') == ['s6-svstat', '-o', 'up,wantedup,pid', '/etc/s6/w']
    assert sup.argv('pm2', 'stop', {}, 'api') == ['pm2', 'stop', 'api']
    assert sup.argv('supervisord', 'kill', sd, 'worker') is None


def test_the_manual_command_is_exact():
    sd = sup.match([holder(), supervisord()], 40)
    assert sup.manual(owner_of(sd, 'worker')) == 'supervisorctl -c /etc/supervisor/supervisord.conf stop worker'
    assert sup.manual(owner_of(sup.match(runit_chain(), 37), '/etc/sv/worker', 'worker',
                               unit='runit.service')) == 'sv down /etc/sv/worker'


def test_lever_off_names_the_exact_command():
    owner = owner_of(sup.match([holder(), supervisord()], 40), 'worker')
    said = gpu_say.supervised(owner)
    assert '`supervisorctl -c /etc/supervisor/supervisord.conf stop worker`' in said
    assert 'stop_supervised: true' in said
    assert sup.skip_code(owner) == sup.LEVER_OFF


def test_a_cli_failure_names_the_cli_the_bound_and_how_to_find_the_program():
    found = sup.match([holder(), supervisord()], 40)
    error = {'code': gpu_owner.CLI_TIMEOUT,
             'text': '`supervisorctl -c %s status` did not answer within 4.0s' % CONF}
    owner = owner_of(found, None, error=error)._replace(name=None)
    said = gpu_say.supervised(owner)
    assert 'did not answer within 4.0s' in said and 'nothing was signalled' in said
    assert '`supervisorctl -c %s stop PROGRAM`' % CONF in said
    assert 'whose pid is 300 with `supervisorctl -c %s status`' % CONF in said
    assert sup.skip_code(owner) == gpu_owner.CLI_TIMEOUT
    assert not sup.stoppable(owner)


# --- status outputs --------------------------------------------------------------------------------

SUPERVISORCTL = """gpuops-t-bystander               RUNNING   pid 2210, uptime 0:00:04
gpuops-t-gpuhog                  RUNNING   pid 2209, uptime 0:00:04
grp:member                       STOPPED   Dec 02 12:29 AM
flaky                            BACKOFF   Exited too quickly (process log may have details)
"""


def test_supervisorctl_status():
    entries = sup.parse_status('supervisorctl', SUPERVISORCTL)
    assert [(e['name'], e['state'], e['pid'], e['down']) for e in entries] == [
        ('gpuops-t-bystander', 'RUNNING', 2210, False), ('gpuops-t-gpuhog', 'RUNNING', 2209, False),
        ('grp:member', 'STOPPED', None, True), ('flaky', 'BACKOFF', None, False)]
    assert sup.program_of('supervisord', entries, 2209) == ('gpuops-t-gpuhog', 'gpuops-t-gpuhog')
    assert sup.program_of('supervisord', entries, 9999) is None
    assert sup.is_down('supervisord', entries, 'grp:member') and not sup.is_down('supervisord', entries, 'flaky')
    # Its refusal (the socket gone, rc 4) is no status.
    assert sup.parse_status('supervisorctl', 'unix:///var/run/supervisor.sock no such file') is None


@pytest.mark.parametrize('text, state, pid, down', [
    ('run: /etc/sv/worker: (pid 1234) 5s; run: log: (pid 1200) 60s', 'run', 1234, False),
    ('down: /etc/sv/worker: 3s, normally up', 'down', None, True),
    ('down: /etc/sv/worker: 0s, normally up, want up', 'down', None, False),
    ('finish: /etc/sv/worker: (pid 1240) 0s, normally up', 'finish', 1240, False),
])
def test_sv_status(text, state, pid, down):
    (entry,) = sup.parse_status('sv', text)
    assert (entry['state'], entry['pid'], entry['down']) == (state, pid, down)


def test_sv_refusal_is_no_status():
    assert sup.parse_status('sv', 'warning: /etc/sv/x: unable to open supervise/ok: file does not exist') is None


@pytest.mark.parametrize('text, pid, down', [
    ('true true 4321', 4321, False), ('false false -1', None, True), ('false true -1', None, False)])
def test_s6_svstat(text, pid, down):
    (entry,) = sup.parse_status('s6-svstat', text)
    assert (entry['pid'], entry['down']) == (pid, down)


# Written from pm2's documented `pm2 jlist` format (pm2 is not packaged in Debian 12).
PM2_JLIST = json.dumps([
    {'pid': 5120, 'name': 'api', 'pm_id': 0, 'monit': {'memory': 52428800, 'cpu': 0},
     'pm2_env': {'name': 'api', 'pm_id': 0, 'status': 'online', 'restart_time': 0, 'exec_mode': 'fork_mode'}},
    {'pid': 0, 'name': 'worker', 'pm_id': 1, 'monit': {'memory': 0, 'cpu': 0},
     'pm2_env': {'name': 'worker', 'pm_id': 1, 'status': 'stopped', 'restart_time': 2, 'exec_mode': 'fork_mode'}},
])


def test_pm2_jlist():
    entries = sup.parse_status('pm2', PM2_JLIST)
    assert [(e['name'], e['pid'], e['down']) for e in entries] == [('api', 5120, False), ('worker', None, True)]
    assert sup.program_of('pm2', entries, 5120) == ('api', 'api')
    assert sup.is_down('pm2', entries, 'worker') and not sup.is_down('pm2', entries, 'api')
    assert sup.parse_status('pm2', '[PM2] Spawning PM2 daemon') is None


# --- decide and the ladder -------------------------------------------------------------------------

def supervised_survey(pid=16, error=None, name='exits-on-term'):
    survey = held_by((pid, name), cgroup=SUP_CG.strip())
    found = sup.match([holder(pid), supervisord()], 40)
    owner = owner_of(found, None if error else 'worker', name='worker', error=error)
    owner = owner._replace(supervisor=dict(owner.supervisor, program_pid=pid))
    survey.holders[0] = survey.holders[0]._replace(owner=owner)
    return survey


class SupervisingActor(ScriptedActor):
    """A scripted actor on a host whose supervisord stops the program (its holders exit, its
    status then reads STOPPED) or whose stop leaves it RUNNING (`stops` False): the family reads
    that status (gpu_observe.supervisor_status, answered here as supervisorctl would)."""

    def __init__(self, monkeypatch, stops=True):
        ScriptedActor.__init__(self)
        self.stops = stops
        self.stopped = False
        monkeypatch.setattr(gpu_observe, 'supervisor_status', self.status)

    def run(self, argv, timeout, as_user=None, ends=()):
        self.calls.append(('run', ' '.join(argv), timeout))
        if self.stops:
            self.stopped = True
            self.gone.update(h.pid for h in ends)
        return gpu_say.step(lever.COMMAND_OK, rc=0, output=''), True

    def status(self, argv, timeout, uid=None, home=None):
        self.calls.append(('status', ' '.join(argv)))
        return 'rc=3' if self.stopped else 'ok', (
            'worker                           STOPPED   Dec 02 12:29 AM' if self.stopped
            else 'worker                           RUNNING   pid 16, uptime 0:00:04')


STOP_WORKER = 'supervisorctl -c %s stop worker' % CONF


def test_without_the_lever_it_is_left_named_with_the_exact_command(monkeypatch):
    actor = SupervisingActor(monkeypatch)
    result = ladder(ScriptedSurveyor(supervised_survey()), actor, stop_supervised=False).run()
    assert [c for c in actor.calls if c[0] != 'wait_release'] == []
    assert result['free'] is False
    (left,) = result['remaining']
    assert left['reason_code'] == sup.LEVER_OFF
    assert '`supervisorctl -c %s stop worker`' % CONF in result['msg']


def test_a_supervised_holder_is_no_target_and_its_unit_is_never_stopped():
    survey = supervised_survey()
    holder_ = survey.holders[0]
    assert decide.skip_code(holder_, ()) == sup.LEVER_OFF
    holder_ = holder_._replace(unit='supervisor.service')
    assert decide.units_to_stop([holder_], set()) == []
    assert decide.supervised_to_stop(survey.holders, [0], ()) == [holder_.owner]
    survey.holders[0] = holder_._replace(protected=True, protected_reason='matches protect pattern')
    assert decide.supervised_to_stop(survey.holders, [0], ()) == []


def test_a_container_whose_runtime_cli_failed_is_left_naming_its_stop(monkeypatch):
    survey = held_by((20, 'exits-on-term'))
    cid = 'a' * 64
    survey.holders[0] = survey.holders[0]._replace(owner=gpu_owner.new_owner(
        gpu_owner.CONTAINER, '/system.slice/docker-%s.scope' % cid, runtime='docker', id=cid,
        unit='docker-%s.scope' % cid, manager=gpu_owner.SYSTEM_MANAGER,
        cli_error={'code': gpu_owner.CLI_MISSING, 'text': 'docker is not on PATH here'}))
    actor = SupervisingActor(monkeypatch)
    result = ladder(ScriptedSurveyor(survey), actor).run()
    assert [c for c in actor.calls if c[0] != 'wait_release'] == []
    (left,) = result['remaining']
    assert left['reason_code'] == gpu_owner.CLI_MISSING
    assert '`docker stop -t 10 -- %s`' % cid in result['msg'] and 'docker is not on PATH here' in result['msg']
