"""Holders run by a real process supervisor under systemd: supervisord (Debian's supervisor,
supervisor.service), runit (Debian's runit + runit-run, runit.service running runsvdir on
/etc/service) and s6 (Debian's s6: a unit this test writes runs s6-svscan on a scan directory of
its own), on a lab node booted with LAB_RUNTIMES=1 (tests/lab/README.md, 'Runtime nodes').

Each supervisor runs two programs with automatic restart on: the holder (`fakegpu hold`,
re-titling itself and loading 2 s before it takes the GPU, as SGLang's scheduler does) and a
bystander that must survive any reclaim of the holder. Every program sits in the supervisor's
own unit cgroup, so the unit's only lever is the whole unit, which would end every program.

These are issue 19 item 3's acceptance tests (supervisors as owners, gpu_supervisor; until it
landed they were xfail(strict), gpu_reclaim stopping the supervisor's whole unit): the owner
is the supervisor's program, stopped through the supervisor, and nothing else is.

pm2 has no lab test: it is not packaged in Debian 12 (`apt-cache policy pm2` lists nothing; pm2
comes from npm), so its row is tested on `pm2 jlist` output written from pm2's documented
format only (tests/unit/plugins/module_utils/test_gpu_supervisor.py).
"""

import re
import shlex

import pytest

from . import scenarios as sc

FAST = {"term_timeout": 1.5, "release_timeout": 5, "nvml_timeout": 5}
HOLDER, BYSTANDER = "gpuops-t-gpuhog", "gpuops-t-bystander"
ITEM3 = ("issue 19 item 3: supervisors are not owners yet; the holder's owner is the supervisor's "
         "systemd unit, and gpu_reclaim stops that whole unit (stop_units), ending every program")
BYSTANDER_CMD = "/usr/bin/python3 -c 'import time; time.sleep(100000)'"


class Supervisord:
    """Debian's supervisor: supervisord (python3, root) is supervisor.service's MainPID and the
    parent of every program; `supervisorctl status` lists each program with its PID."""

    name = "supervisord"
    unit = "supervisor.service"
    conf = "/etc/supervisor/conf.d/gpuops-t.conf"

    def start(self, lab, node, gpu, mib):
        lab.exec(node, "cat > %s <<'EOF'\n"
                       "[program:%s]\ncommand=/usr/local/bin/fakegpu hold --gpu %d:%d --title sglang-sup --load-s 2\n"
                       "autorestart=true\nstartsecs=1\n"
                       "[program:%s]\ncommand=%s\nautorestart=true\nstartsecs=1\n"
                       "EOF\n"
                       "supervisorctl update >/dev/null" % (self.conf, HOLDER, gpu, mib, BYSTANDER, BYSTANDER_CMD))

    def end_script(self):
        return "rm -f %s; systemctl is-active -q %s && supervisorctl update >/dev/null; true" % (self.conf, self.unit)

    def pid(self, lab, node, program):
        """The program's PID while supervisord says RUNNING, else None."""
        out = lab.exec(node, "supervisorctl status %s || true" % program).stdout
        found = re.search(r"RUNNING\s+pid (\d+),", out)
        return int(found.group(1)) if found else None

    @staticmethod
    def running(program, not_pid):
        status = "supervisorctl status %s" % program
        return "%s | grep -q 'RUNNING *pid [0-9]*,'%s" % (
            status, " && ! %s | grep -q 'pid %d,'" % (status, not_pid) if not_pid else "")

    def stopped(self, lab, node, program):
        return " STOPPED " in " %s " % lab.exec(node, "supervisorctl status %s || true" % program).stdout

    def command(self, program):
        # supervisorctl finds supervisord's socket through the config the unit runs it with.
        return r"supervisorctl( -c /etc/supervisor/supervisord\.conf)? stop %s" % re.escape(program)


class Runit:
    """Debian's runit under systemd (runit-run): runsvdir is runit.service's MainPID, one runsv
    per service directory linked into /etc/service, each program runsv's child."""

    name = "runit"
    unit = "runit.service"

    def start(self, lab, node, gpu, mib):
        for service, run in ((HOLDER, "/usr/local/bin/fakegpu hold --gpu %d:%d --title sglang-runit --load-s 2" % (gpu, mib)),
                             (BYSTANDER, BYSTANDER_CMD)):
            lab.exec(node, "mkdir -p /etc/sv/%s && printf '#!/bin/sh\\nexec %%s\\n' %s > /etc/sv/%s/run && "
                           "chmod +x /etc/sv/%s/run && ln -sfn /etc/sv/%s /etc/service/%s"
                     % (service, shlex.quote(run), service, service, service, service))

    @staticmethod
    def end_script():
        return ("for s in %s %s; do [ -e /etc/service/$s ] || continue; "
                "sv -w 10 force-shutdown /etc/service/$s >/dev/null 2>&1; rm -f /etc/service/$s; done; "
                "rm -rf /etc/sv/%s /etc/sv/%s; true" % (HOLDER, BYSTANDER, HOLDER, BYSTANDER))

    def pid(self, lab, node, program):
        out = lab.exec(node, "sv status /etc/service/%s 2>/dev/null || true" % program).stdout
        found = re.match(r"run: \S+ \(pid (\d+)\)", out)
        return int(found.group(1)) if found else None

    @staticmethod
    def running(program, not_pid):
        status = "sv status /etc/service/%s 2>/dev/null" % program
        return "%s | grep -q '^run: '%s" % (
            status, " && ! %s | grep -q '(pid %d)'" % (status, not_pid) if not_pid else "")

    def stopped(self, lab, node, program):
        # "down: SERVICE: 3s, normally up": put down by sv (runsv restarts nothing then).
        return lab.exec(node, "sv status /etc/service/%s 2>/dev/null || true" % program).stdout.startswith("down:")

    def command(self, program):
        return r"sv down \S*%s" % re.escape(program)


class S6:
    """Debian's s6 under a systemd unit this test writes: s6-svscan (the unit's MainPID) on the
    scan directory SCAN, one s6-supervise per service directory in it (its cwd), each program
    s6-supervise's child."""

    name = "s6"
    unit = "gpuops-t-s6.service"
    scan = "/etc/gpuops-t-s6"

    def prepare_script(self):
        return ("mkdir -p %s && printf '[Service]\\nExecStart=/usr/bin/s6-svscan %s\\n' > /etc/systemd/system/%s && "
                "systemctl daemon-reload" % (self.scan, self.scan, self.unit))

    def start(self, lab, node, gpu, mib):
        for service, run in ((HOLDER, "/usr/local/bin/fakegpu hold --gpu %d:%d --title sglang-s6 --load-s 2" % (gpu, mib)),
                             (BYSTANDER, BYSTANDER_CMD)):
            lab.exec(node, "mkdir -p %s/%s && printf '#!/bin/sh\\nexec %%s\\n' %s > %s/%s/run && chmod +x %s/%s/run"
                     % (self.scan, service, shlex.quote(run), self.scan, service, self.scan, service))
        lab.exec(node, "s6-svscanctl -a %s" % self.scan)

    def end_script(self):
        # Stopping the unit ends s6-svscan, every s6-supervise and their programs (its cgroup).
        return "systemctl stop %s 2>/dev/null; rm -rf %s; true" % (self.unit, self.scan)

    def pid(self, lab, node, program):
        out = lab.exec(node, "s6-svstat -o up,pid %s/%s 2>/dev/null || true" % (self.scan, program)).stdout.split()
        return int(out[1]) if out[:1] == ["true"] and len(out) == 2 else None

    def running(self, program, not_pid):
        status = "s6-svstat -o up,pid %s/%s 2>/dev/null" % (self.scan, program)
        return "%s | grep -q '^true [0-9]'%s" % (
            status, " && ! %s | grep -q ' %d$'" % (status, not_pid) if not_pid else "")

    def stopped(self, lab, node, program):
        # Up false and wanted up false: put down by s6-svc -d (s6-supervise restarts nothing then).
        return lab.exec(node, "s6-svstat -o up,wantedup %s/%s 2>/dev/null || true"
                        % (self.scan, program)).stdout.split() == ["false", "false"]

    def command(self, program):
        return r"s6-svc -d \S*%s" % re.escape(program)


SUPERVISORS = {"supervisord": Supervisord(), "runit": Runit(), "s6": S6()}


def unit_main_pid(lab, node, unit):
    out = lab.exec(node, "systemctl show -p ActiveState -p MainPID %s" % unit).stdout
    fields = dict(line.split("=", 1) for line in out.split())
    return fields["ActiveState"], int(fields["MainPID"])


@pytest.fixture(scope="module")
def runtimes_node(lab):
    name = lab.nodes[-1]
    tools = lab.status().get(name, {}).get("tools", [])
    missing = [t for t in ("supervisord", "runit") if t not in tools]
    if lab.exec(name, "command -v s6-svscan", check=False).returncode != 0:
        missing.append("s6 (runtimes layer v3)")
    if missing:
        pytest.skip("the lab nodes have no %s: run with LAB_RUNTIMES=1 after `tests/lab/lab down` "
                    "(tests/lab/README.md, 'Runtime nodes')" % " or ".join(missing))
    if "fakegpu" not in tools:
        pytest.skip("stand-in GPU driver not installed on %s: tests/fakegpu not built" % name)
    return name


def reset(lab, node):
    """No test program in either supervisor, idle stand-in GPUs, both supervisors' units active
    (a test before may have stopped one) and supervisord answering: one call into the node."""
    units = " ".join(s.unit for s in SUPERVISORS.values())
    lab.exec(node, "%s; lab-reset-gpus --gpus %d >/dev/null; %s; systemctl reset-failed %s; systemctl start %s; "
                   "for i in $(seq 600); do supervisorctl pid >/dev/null 2>&1 && exit 0; sleep 0.05; done; "
                   "echo supervisord not answering >&2; exit 1"
             % ("; ".join(s.end_script() for s in SUPERVISORS.values()), lab.gpus,
                SUPERVISORS["s6"].prepare_script(), units, units),
             timeout=180)


@pytest.fixture(params=sorted(SUPERVISORS))
def supervised(request, lab, runtimes_node):
    """(node, supervisor, holder PID, bystander PID): the supervisor's two programs running,
    the holder holding 1200 MiB on GPU 5."""
    node, supervisor = runtimes_node, SUPERVISORS[request.param]
    reset(lab, node)
    supervisor.start(lab, node, 5, 1200)
    holder = wait_program(lab, node, supervisor, HOLDER)
    wait_held(lab, node, 5, 1200)
    bystander = wait_program(lab, node, supervisor, BYSTANDER)
    yield node, supervisor, holder, bystander
    reset(lab, node)


def wait_program(lab, node, supervisor, program, not_pid=None):
    """Poll in the node until the supervisor says `program` runs (with another PID than
    `not_pid`); return its PID."""
    sc.wait_until(lab, node, supervisor.running(program, not_pid),
                  "%s program %s running%s" % (supervisor.name, program, " again" if not_pid else ""))
    return supervisor.pid(lab, node, program)


def wait_held(lab, node, gpu, mib):
    sc.wait_until(lab, node, "[ \"$(fakegpu status | python3 -c 'import json,sys; "
                  "print([g for g in json.load(sys.stdin)[\"gpus\"] if g[\"index\"] == %d][0][\"memory_used_mib\"])')\" = %d ]"
                  % (gpu, mib), "supervised holder holding %d MiB on GPU %d" % (mib, gpu))


def test_supervised_programs_sit_in_the_supervisors_unit(lab, supervised):
    """The shape the owner code meets, read from the real supervisors: automatic restart is
    on (a killed holder comes back); both programs in the supervisor's unit cgroup;
    supervisord itself the holder's parent and the unit's MainPID; runit's runsv (s6's
    s6-supervise: the unit's runsvdir's or s6-svscan's child, in the service directory) the
    holder's parent."""
    node, supervisor, holder, bystander = supervised
    lab.exec(node, "kill -9 %d" % holder)
    holder = wait_program(lab, node, supervisor, HOLDER, not_pid=holder)
    wait_held(lab, node, 5, 1200)
    state, main_pid = unit_main_pid(lab, node, supervisor.unit)
    assert state == "active"
    for pid in (holder, bystander):
        assert lab.exec(node, "cat /proc/%d/cgroup" % pid).stdout.strip().endswith(
            "::/system.slice/%s" % supervisor.unit)
    parent = int(lab.exec(node, "ps -o ppid= -p %d" % holder).stdout)
    if supervisor.name == "supervisord":
        assert parent == main_pid
        assert lab.exec(node, "cat /proc/%d/cmdline | tr '\\0' ' '" % main_pid).stdout.split()[:2] == [
            "/usr/bin/python3", "/usr/bin/supervisord"]
    else:
        monitor, service = {"runit": ("/usr/bin/runsv", "/etc/sv/%s" % HOLDER),
                            "s6": ("/usr/bin/s6-supervise", "%s/%s" % (S6.scan, HOLDER))}[supervisor.name]
        assert int(lab.exec(node, "ps -o ppid= -p %d" % parent).stdout) == main_pid
        assert lab.exec(node, "readlink /proc/%d/exe" % parent).stdout.strip() == monitor
        assert lab.exec(node, "readlink /proc/%d/cwd" % parent).stdout.strip() == service
    holders = lab.module(node, "gpuops.reclaim.gpu_holders", {"gpus": ["5"]})
    assert [h["pid"] for h in holders["holders"]] == [holder]


def test_holders_names_the_supervisor_and_the_program(lab, supervised):
    node, supervisor, holder, _bystander = supervised

    result = lab.module(node, "gpuops.reclaim.gpu_holders", {"gpus": ["5"]})

    owner = [h for h in result["holders"] if h["pid"] == holder][0]["owner"]
    assert owner["kind"] == "supervisor", "today: owner %s (the supervisor's whole unit)" % owner
    assert (owner["runtime"], owner["name"], owner["unit"]) == (supervisor.name, HOLDER, supervisor.unit)


def test_holder_is_stopped_through_its_supervisor_and_every_other_program_keeps_running(lab, supervised):
    node, supervisor, holder, bystander = supervised
    _state, main_pid = unit_main_pid(lab, node, supervisor.unit)

    result = lab.module(node, "gpuops.reclaim.gpu_reclaim", dict(FAST, gpus=["5"]))

    units_stopped = [a["unit"] for a in result["actions"] if a["step"] == "stop_unit"]
    assert supervisor.unit not in units_stopped, "today: gpu_reclaim stopped %s: %s" % (
        supervisor.unit, result["actions"])
    assert not result.get("failed"), result.get("msg")
    assert result["free"] is True
    # The holder's program is down by its supervisor's own word (so no autorestart), the
    # bystander is the very process it was, and the supervisor and its unit never stopped.
    assert supervisor.stopped(lab, node, HOLDER)
    assert supervisor.pid(lab, node, BYSTANDER) == bystander
    assert unit_main_pid(lab, node, supervisor.unit) == ("active", main_pid)
    assert not sc.identity(lab, node, holder)
    # Stays down: asked again after the run (longer than startsecs and runsv's 1 s), nothing
    # holds GPU 5 and the program is still down.
    again = lab.module(node, "gpuops.reclaim.gpu_holders", {"gpus": ["5"]})
    assert again["free"] is True, again["holders"]
    assert supervisor.stopped(lab, node, HOLDER)


def test_without_the_supervisor_lever_the_failure_names_the_exact_command(lab, supervised):
    node, supervisor, holder, bystander = supervised

    result = lab.module(node, "gpuops.reclaim.gpu_reclaim", dict(FAST, gpus=["5"], stop_supervised=False))

    assert result.get("failed") is True
    assert re.search(supervisor.command(HOLDER), result["msg"]), result["msg"]
    assert not [a for a in result["actions"] if a["changed"]], result["actions"]
    assert supervisor.pid(lab, node, HOLDER) == holder and supervisor.pid(lab, node, BYSTANDER) == bystander


def test_a_launchers_child_that_outlives_its_stopped_program_is_ended_never_the_unit(lab, runtimes_node):
    """A supervised launcher whose child holds a GPU too (as SGLang's launcher and its
    schedulers): supervisorctl stops the program (SIGTERM to the launcher only, supervisord's
    default), the child outlives it as an orphan that nothing restarts any more, and the ladder
    ends it with signals; supervisor.service is never stopped and the other program lives."""
    node, supervisor = runtimes_node, SUPERVISORS["supervisord"]
    reset(lab, node)
    try:
        lab.exec(node, "cat > %s <<'EOF'\n"
                       "[program:%s]\ncommand=/usr/local/bin/fakegpu hold --gpu 5:300 --child 6:1000:sglang-child "
                       "--title sglang-launch\nautorestart=true\nstartsecs=1\n"
                       "[program:%s]\ncommand=%s\nautorestart=true\nstartsecs=1\n"
                       "EOF\n"
                       "supervisorctl update >/dev/null" % (supervisor.conf, HOLDER, BYSTANDER, BYSTANDER_CMD))
        launcher = wait_program(lab, node, supervisor, HOLDER)
        wait_held(lab, node, 6, 1000)
        bystander = wait_program(lab, node, supervisor, BYSTANDER)
        child = int(lab.exec(node, "ps -o pid= --ppid %d" % launcher).stdout.split()[0])
        _state, main_pid = unit_main_pid(lab, node, supervisor.unit)

        result = lab.module(node, "gpuops.reclaim.gpu_reclaim", dict(FAST, gpus=["5", "6"]))

        assert not result.get("failed"), result.get("msg")
        assert result["free"] is True
        steps = [(a["step"], a.get("pid")) for a in result["actions"] if a["changed"]]
        assert steps[0] == ("stop_supervised", None), result["actions"]
        assert ("sigterm", child) in steps, result["actions"]
        assert not [a for a in result["actions"] if a["step"] == "stop_unit"], result["actions"]
        assert supervisor.stopped(lab, node, HOLDER)
        assert supervisor.pid(lab, node, BYSTANDER) == bystander
        assert unit_main_pid(lab, node, supervisor.unit) == ("active", main_pid)
    finally:
        reset(lab, node)
