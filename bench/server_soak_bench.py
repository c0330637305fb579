"""Server soak: inference_service on random server shapes on a lab node (issue 30 item 8).

usage: bench/run server-soak [--n N] [--seed S] [--only K,...] [--budget SECONDS] [--trace-signals]
                             [--out NAME] [--keep]

Boots one lab node (the private lab of LAB_STATE/LAB_RUN/LAB_ADDR_BASE when set, else
/var/lib/gpuops-lab-bench at base 200), installs SLOTS stand-in servers (tests/fakeserve) as
real systemd units through the role, and runs the trials in batches: each batch gives every
slot one shape (trial K of seed S is always the same shape: random.Random("S-K")), builds the
shapes with real processes (a hand restart, a one-shot fault of the stand-in, SIGSTOP and
SIGCONT), then runs the inference_service role once over all slots (bench/server_soak.yml: one
inventory host per slot, in parallel) and judges each slot against what its shape must end as:

  loading        restarted by hand as the role reads its unit, loading for 15-30 s, within its
                 health timeout (20-60 s more): not restarted (the same main process as the
                 hand restart started), and it comes up
  paused         serving; its main process SIGSTOPped for 4-9 s (shorter than the probe window
                 of 3 x 5 s) from 0-2 s after the role starts its survey of the GPUs (the task
                 before its probes), then SIGCONTed: not restarted. The trial records the probe
                 statuses, so the table says how many pauses the first probe met
  stalled        hung in loading (silent half-way, or in CUDA graph capture), older than its
                 health timeout when the play starts (or a few seconds short of it, so the
                 role waits and judges it again): restarted, reason stalled, and it comes up
  dead_rank      /health 200 while its last rank died (slot 0 runs 2 ranks): restarted, reason
                 rank_missing naming the rank's GPU, and it comes up
  generate_hang  /health 200 while every completion hangs: restarted (the role's rule: a
                 running server whose completion does not answer is stalled), and the new
                 start, without the fault, comes up

Counted, per trial:
  needless restart   a loading or paused server restarted (main process changed) or given a
                     restart reason
  stall left         a stalled, dead-rank or generate-hang server whose main process is the same
                     after the run
  wrong kill         a process that had to live died: a kept server's main process or ranks,
                     a monitor with /dev/nvidiactl open, another user's process holding a GPU of
                     no server (counted once per batch for a bystander)
  wrong reason       a restart whose reason code is not the shape's (or a dead rank's reason not
                     naming its GPU)
  not serving        a server not answering /health 200 after the run, or the role failed
  infra              the lab could not build the shape (not counted against the role; listed)

Prints the counts and writes bench/results/server_soak.json (every trial's shape, what the role
decided, the processes before and after). --only K,... runs only the batches that hold those
trials (a replay: the batch's other slots get their own shapes as in the full run).

--trace-signals records every SIGTERM and SIGKILL on the host (bench/signal_trace.py: the kernel's
signal:signal_generate tracepoint in a trace instance of its own) whose sender or target is in
this lab's node, or whose target was gone when read, into bench/results/NAME.signals.jsonl; each
failing trial then names the signals its slot's processes got during its batch: the sender's
comm, host PID, PID in its namespace, cmdline and cgroup (its node and unit). Without tracefs
it says so and runs on.
"""
import argparse
import collections
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import benchlib as bl
import signal_trace

LAB = os.path.join(bl.REPO, "tests", "lab", "lab")
PLAYBOOK = os.path.join(bl.BENCH, "server_soak.yml")
NODE_SCRIPT = os.path.join(bl.BENCH, "server_soak_node.py")
LAB_DEFAULTS = {"LAB_STATE": "/var/lib/gpuops-lab-bench", "LAB_RUN": "/run/gpuops-lab-bench",
                "LAB_ADDR_BASE": "200"}
GPUS = 8
# Slot 0 runs two ranks (a dead rank among several); the others one. 7 GPUs; the 8th is another
# user's holder, which no run may touch.
SLOT_TP = (2, 1, 1, 1, 1, 1)
PORT_BASE = 31000
SHAPES = ("loading", "paused", "stalled", "dead_rank", "generate_hang")
KEPT = ("loading", "paused")
REASON = {"stalled": "stalled", "dead_rank": "rank_missing", "generate_hang": "generate_hung"}
COUNTED = ("needless restart", "stall left", "wrong kill", "wrong reason", "not serving", "infra")
STRANGER_UID = 1990
FAULT_DIR = "/run/server-soak"
# The role's defaults but two: a stop bound of 5 s (a stalled stand-in ignores SIGTERM, as SGLang
# does before its first request: each stop of one waits that long) and a generation bound of
# 5 s (a hung completion waits that long).
BASE_VARS = {"inference_service_command": ["/usr/local/bin/fakeserve"], "inference_service_host": "{{ ansible_host }}",
             "inference_service_stop_timeout": 5, "inference_service_generate_timeout": 5,
             "inference_service_health_timeout": 60, "inference_service_gpu_health": True,
             "gpus_free_term_timeout": 2}


def lab(*args, timeout=300, stdin=None, check=True):
    run = subprocess.run([LAB] + list(args), input=stdin, capture_output=True, timeout=timeout, check=False)
    if check and run.returncode != 0:
        raise RuntimeError("lab %s failed (rc %d):\n%s\n%s" % (
            " ".join(args[:3]), run.returncode, run.stdout.decode()[-2000:], run.stderr.decode()[-2000:]))
    return run.stdout.decode()


# --- shapes (pure) ---------------------------------------------------------------------------


def slot_gpus(seed):
    """The GPUs of each slot and the stranger's GPU, drawn once per seed (a slot's GPUs are in its
    unit: changing them would be a unit change, which restarts at once)."""
    order = random.Random("%d-gpus" % seed).sample(range(GPUS), GPUS)
    slots, at = [], 0
    for tp in SLOT_TP:
        slots.append([str(g) for g in order[at:at + tp]])
        at += tp
    return slots, order[at]


def shape(seed, trial, dealt=False):
    """Trial `trial` of seed `seed`: its slot (trial mod the slots), its shape and the shape's
    numbers. Pure and deterministic. dealt: the shapes in turn from a seeded start (every
    len(SHAPES) trials hold each shape once: a small run covers them all); else drawn."""
    rng = random.Random("%d-%d" % (seed, trial))
    drawn = rng.choice(SHAPES)
    spec = {"trial": trial, "seed": seed, "slot": trial % len(SLOT_TP),
            "shape": SHAPES[(seed + trial) % len(SHAPES)] if dealt else drawn,
            "health_timeout": 60, "generate_timeout": 5}
    if spec["shape"] == "loading":
        spec["load_s"] = round(rng.uniform(15, 30), 1)
        spec["health_timeout"] = int(spec["load_s"] + rng.uniform(20, 60))
    elif spec["shape"] == "stalled":
        spec["fault"] = rng.choice(["hang-after-load", "hang-loading"])
        spec["health_timeout"] = rng.choice([15, 20, 25])
        # Mostly past its budget when the play starts; sometimes a few seconds short, so the role
        # first waits for it as loading and then judges it stalled.
        spec["past"] = rng.random() < 0.75
        spec["age_s"] = round(spec["health_timeout"] + (rng.uniform(1, 5) if spec["past"] else -rng.uniform(4, 8)), 1)
    elif spec["shape"] == "generate_hang":
        spec["generate_timeout"] = rng.choice([3, 5])
    elif spec["shape"] == "paused":
        spec["pause_after_s"] = round(rng.uniform(0, 2), 1)
        spec["pause_s"] = round(rng.uniform(4, 9), 1)
    return spec


def judge(spec, gpus, record, before, after):
    """Failures of one trial (a list of (count, detail)) from what the role decided (`record`,
    bench/server_soak.yml's) and the slot's processes before and after the run."""
    failures = []
    restarted = before["main"] != after["main"]
    record = record or {}
    now = record.get("now") or {}
    reasons = now.get("reasons") or []
    if spec["shape"] in KEPT:
        if restarted or reasons:
            failures.append(("needless restart", "main %s -> %s, reasons %s" % (before["main"], after["main"], reasons)))
        if not restarted:
            gone = [c for c in before["children"] if c not in after["children"]]
            if gone:
                failures.append(("wrong kill", "ranks %s of the kept server died" % gone))
    else:
        if not restarted:
            failures.append(("stall left", "main %s still runs; reasons %s" % (after["main"], reasons)))
        if REASON[spec["shape"]] not in reasons:
            failures.append(("wrong reason", "expected %s, the role gave %s" % (REASON[spec["shape"]], reasons)))
        elif spec["shape"] == "dead_rank" and now.get("missing_gpus") != gpus[-1:]:
            failures.append(("wrong reason", "missing GPUs %s, the dead rank's is %s" % (now.get("missing_gpus"), gpus[-1])))
        elif spec["shape"] == "dead_rank" and not any("GPU %s" % gpus[-1] in r for r in record.get("reasons") or []):
            failures.append(("wrong reason", "no reason names GPU %s: %s" % (gpus[-1], record.get("reasons"))))
    if after["health"] != 200 or record.get("failure") or not record:
        failures.append(("not serving", "health %s after the run; role failure: %s" % (
            after["health"], (record.get("failure") or "none" if record else "no record"))))
    return failures


# --- the lab side ----------------------------------------------------------------------------


class Soak:
    def __init__(self, node, seed, log=bl.log, trace=None):
        self.node, self.seed, self.log, self.trace = node, seed, log, trace
        self.gpus, self.stranger_gpu = slot_gpus(seed)
        self.host = self.node_record()["ip"]
        self.tmp = tempfile.mkdtemp(prefix="server-soak-")
        self.bystanders = {}

    def node_record(self):
        with open(os.path.join(os.environ.get("LAB_RUN", "/run/gpuops-lab"), "nodes", "%s.json" % self.node)) as f:
            return json.load(f)

    def unit(self, slot):
        return "soak-s%d" % slot

    def node_cgroup(self):
        """The node's cgroup on the host (tests/lab/README.md: gpuopsBASE-NODE)."""
        return "/gpuops%s-%s/" % (os.environ.get("LAB_ADDR_BASE", LAB_DEFAULTS["LAB_ADDR_BASE"]), self.node)

    def exec(self, cmd, timeout=120, check=True):
        return lab("exec", self.node, cmd, timeout=timeout, check=check)

    # -- setup ---------------------------------------------------------------------------------
    def host_vars(self, slot, spec=None):
        tp = SLOT_TP[slot]
        return dict(BASE_VARS, inference_service_name=self.unit(slot), inference_service_gpus=self.gpus[slot],
                    inference_service_port=PORT_BASE + slot,
                    inference_service_env={"FAKESERVE_LOAD_SECONDS": "1",
                                           "FAKESERVE_FAULT_FILE": "%s/%s.fault" % (FAULT_DIR, self.unit(slot))},
                    inference_service_flags={"model_path": "/models/m", "tp_size": tp, "mem_fraction_static": 0.8},
                    inference_service_health_timeout=spec["health_timeout"] if spec else 60,
                    inference_service_generate_timeout=spec["generate_timeout"] if spec else 5)

    def lab_vars(self):
        with open(lab("inventory").strip()) as f:
            text = f.read()
        return text.split("[gpu_nodes:vars]", 1)[1].split("\n[", 1)[0].strip() + "\n"

    def write_inventory(self, specs=None):
        inv = os.path.join(self.tmp, "inventory.ini")
        with open(inv, "w") as f:
            f.write("[soak_servers]\n")
            for slot in range(len(SLOT_TP)):
                f.write("%s ansible_host=%s\n" % (self.unit(slot), self.host))
            # How to reach the node: the lab's own inventory's group vars (user, key, python).
            f.write("\n[soak_servers:vars]\n" + self.lab_vars())
        os.makedirs(os.path.join(self.tmp, "host_vars"), exist_ok=True)
        for slot in range(len(SLOT_TP)):
            spec = (specs or {}).get(slot)
            with open(os.path.join(self.tmp, "host_vars", self.unit(slot) + ".yml"), "w") as f:
                json.dump(self.host_vars(slot, spec), f)
        return inv

    def play(self, specs=None, on_line=None):
        """Run bench/server_soak.yml over every slot; return ({slot: record}, seconds, output)."""
        inv = self.write_inventory(specs)
        out_dir = os.path.join(self.tmp, "out")
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        env = dict(os.environ, PATH=os.path.join(bl.REPO, ".venv", "bin") + os.pathsep + os.environ["PATH"],
                   ANSIBLE_CONFIG=os.path.join(bl.REPO, "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=bl.COLLECTIONS,
                   ANSIBLE_DEPRECATION_WARNINGS="False")
        started = time.monotonic()
        proc = subprocess.Popen([os.path.join(bl.REPO, ".venv", "bin", "ansible-playbook"), PLAYBOOK, "-i", inv,
                                 "-f", str(len(SLOT_TP)), "-e", "soak_out=" + out_dir],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        try:
            for line in proc.stdout:
                lines.append(line)
                if on_line:
                    on_line(line)
            proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        records = {}
        for slot in range(len(SLOT_TP)):
            path = os.path.join(out_dir, self.unit(slot) + ".json")
            if os.path.exists(path):
                with open(path) as f:
                    records[slot] = json.load(f)
        return records, round(time.monotonic() - started, 1), "".join(lines)

    def facts(self):
        spec = {"host": self.host, "bystanders": self.bystanders,
                "slots": [{"unit": self.unit(s) + ".service", "port": PORT_BASE + s} for s in range(len(SLOT_TP))]}
        with open(NODE_SCRIPT, "rb") as f:
            out = lab("exec", self.node, "python3 - facts %s" % shlex_quote(json.dumps(spec)), stdin=f.read())
        return json.loads(out)

    def install(self):
        """The units through the role (one converge), and the bystanders: a monitor with only
        /dev/nvidiactl open, and another user's process holding the GPU no slot has."""
        # A real driver lets every user make a context; the stand-in keeps its books in these.
        self.exec("mkdir -p %s; id -u %d >/dev/null 2>&1 || useradd -u %d -M -N soakuser 2>/dev/null; "
                  "chmod 1777 /var/lib/fakegpu/alloc /var/lib/fakegpu/dead; true" % (FAULT_DIR, STRANGER_UID, STRANGER_UID))
        self.exec("systemctl stop soak-monitor soak-stranger 2>/dev/null; rm -f /tmp/soak-stranger.json; true")
        records, seconds, out = self.play()
        bad = [s for s in range(len(SLOT_TP)) if (records.get(s) or {}).get("failure") or s not in records]
        if bad:
            raise RuntimeError("the first converge failed on slots %s:\n%s" % (bad, out[-4000:]))
        self.log("installed %d servers in %.0f s (GPUs %s; another user's holder on GPU %d)"
                 % (len(SLOT_TP), seconds, self.gpus, self.stranger_gpu))
        self.exec("systemd-run --quiet --collect --unit=soak-monitor bash -c 'exec -a gpu-monitor sleep infinity "
                  "3</dev/nvidiactl'")
        self.exec("systemd-run --quiet --collect --unit=soak-stranger setpriv --reuid=%d --regid=%d --clear-groups "
                  "fakegpu hold --gpu %d:2000 --title 'python3 notebook.py' --ready-file /tmp/soak-stranger.json"
                  % (STRANGER_UID, STRANGER_UID, self.stranger_gpu))
        self.wait("test -s /tmp/soak-stranger.json && systemctl show -p MainPID --value soak-monitor | grep -qv '^0$'",
                  "the bystanders", 30)
        for name in ("monitor", "stranger"):
            pid = int(self.exec("systemctl show -p MainPID --value soak-%s" % name).strip())
            start = int(self.exec("cut -d')' -f2 /proc/%d/stat | awk '{print $20}'" % pid).strip())
            self.bystanders[name] = [pid, start]

    def teardown(self):
        units = " ".join(self.unit(s) for s in range(len(SLOT_TP)))
        self.exec("systemctl stop soak-monitor soak-stranger %s 2>/dev/null; cd /etc/systemd/system && rm -f %s; "
                  "rm -f /etc/gpuops/soak-s*; rm -rf %s /tmp/soak-stranger.json; systemctl daemon-reload; true"
                  % (units, " ".join(u + ".service" for u in units.split()), FAULT_DIR), timeout=120, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def wait(self, cmd, what, timeout):
        deadline = time.monotonic() + timeout
        while True:
            if subprocess.run([LAB, "exec", self.node, cmd], capture_output=True, timeout=60, check=False).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("%s: not within %d s (%s)" % (what, timeout, cmd))
            time.sleep(0.5)

    # -- one batch -----------------------------------------------------------------------------
    def fault_restart(self, slot, fault):
        unit = self.unit(slot)
        self.exec("echo %s > %s/%s.fault && systemctl restart %s" % (shlex_quote(fault), FAULT_DIR, unit, unit))
        return time.monotonic()

    def since_start(self, slot):
        return "journalctl _SYSTEMD_UNIT=%s.service _PID=$(systemctl show -p MainPID --value %s)" % (
            self.unit(slot), self.unit(slot))

    def healthy_cmd(self, slot):
        return "curl -sf -o /dev/null http://%s:%d/health" % (self.host, PORT_BASE + slot)

    def build(self, specs):
        """Bring each slot into its shape; returns when the play may start."""
        started = {}
        by = collections.defaultdict(list)
        for slot, spec in specs.items():
            by[spec["shape"]].append(slot)
        for slot in by["stalled"]:
            started[slot] = self.fault_restart(slot, specs[slot]["fault"])
        for slot in by["dead_rank"]:
            self.fault_restart(slot, "rank-dies")
        for slot in by["generate_hang"]:
            self.fault_restart(slot, "generate-hang")
        for slot in by["paused"]:
            if subprocess.run([LAB, "exec", self.node, self.healthy_cmd(slot)], capture_output=True,
                              timeout=60, check=False).returncode != 0:
                self.fault_restart(slot, "none")
        for slot in by["stalled"]:
            line = "Capture cuda graph begin" if specs[slot]["fault"] == "hang-after-load" else "Loading safetensors checkpoint shards"
            self.wait("%s | grep -q '%s'" % (self.since_start(slot), line), "slot %d stalled" % slot, 60)
        for slot in by["dead_rank"]:
            self.wait("%s | grep -q 'died (SIGKILL)' && %s" % (self.since_start(slot), self.healthy_cmd(slot)),
                      "slot %d's rank dead" % slot, 60)
        for slot in by["generate_hang"] + by["paused"]:
            self.wait(self.healthy_cmd(slot), "slot %d serving" % slot, 60)
        for slot in by["loading"]:
            # Restarted by hand once the play has begun (pauser): serving until then.
            if subprocess.run([LAB, "exec", self.node, self.healthy_cmd(slot)], capture_output=True,
                              timeout=60, check=False).returncode != 0:
                self.fault_restart(slot, "none")
                self.wait(self.healthy_cmd(slot), "slot %d serving" % slot, 60)
        # The stalled ones at their age.
        ready_at = max([started[s] + specs[s]["age_s"] for s in by["stalled"]] + [time.monotonic()])
        time.sleep(max(0.0, ready_at - time.monotonic()))
        return {s: round(time.monotonic() - started[s], 1) for s in by["stalled"]}

    def pauser(self, specs):
        """on_line for the play: as the role reads the unit, restart each loading slot by hand
        (a reboot's or an operator's restart while the timer's run begins: the run meets it
        loading however slow the controller is); at the GPU survey before the probe window,
        SIGSTOP each paused slot's main process (after its pause_after_s), SIGCONT it pause_s
        later."""
        paused = [s for s, spec in specs.items() if spec["shape"] == "paused"]
        loading = [s for s, spec in specs.items() if spec["shape"] == "loading"]
        state = {"fired": False, "threads": [], "done": [], "loading_fired": False, "main": {}}

        def restart(slot):
            self.fault_restart(slot, "slow-load %s" % specs[slot]["load_s"])
            state["main"][slot] = self.facts()["slots"][slot]
            state["done"].append(slot)

        def pause(slot, pid):
            spec = specs[slot]
            time.sleep(spec["pause_after_s"])
            self.exec("kill -STOP %d" % pid, check=False)
            stopped = time.monotonic()
            try:
                time.sleep(max(0.0, spec["pause_s"] - (time.monotonic() - stopped)))
            finally:
                self.exec("kill -CONT %d" % pid, check=False)
            state["done"].append(slot)

        def on_line(line):
            if not state["loading_fired"] and "inference_service : Read the unit's state" in line:
                state["loading_fired"] = True
                for slot in loading:
                    thread = threading.Thread(target=restart, args=(slot,), daemon=True)
                    thread.start()
                    state["threads"].append(thread)
            # The task before the probe window: the pause begins before the probe (the lab test
            # of issue 30 item 2 stops the server one task earlier still) and lasts into it.
            if not state["fired"] and "Survey who holds the server's GPUs" in line:
                state["fired"] = True
                for slot in paused:
                    thread = threading.Thread(target=pause, args=(slot, state["pids"][slot]), daemon=True)
                    thread.start()
                    state["threads"].append(thread)
        return on_line, state

    def batch(self, specs):
        """Run one batch ({slot: spec}); returns the trials' records."""
        try:
            ages = self.build(specs)
        except RuntimeError as exc:
            return [{"spec": spec, "failures": [("infra", str(exc))]} for spec in specs.values()], []
        since = time.monotonic()
        before = self.facts()
        # The slots' processes as the host names them (a target SIGKILLed is gone before the
        # trace's reader can read its /proc; this maps its host PID back).
        host_before = host_processes(self.node_cgroup()) if self.trace else {}
        # And those started during the play (a loading slot's ranks, after its hand restart),
        # read every second: a rank ends at once on SIGTERM, before the trace can read it.
        watching = threading.Event()

        def watch():
            while not watching.wait(1.0):
                host_before.update(host_processes(self.node_cgroup()))
        watcher = threading.Thread(target=watch, daemon=True)
        if self.trace:
            watcher.start()
        on_line, state = self.pauser(specs)
        state["pids"] = {s: (before["slots"][s]["main"] or [0])[0] for s in specs}
        try:
            records, seconds, out = self.play(specs, on_line)
        finally:
            watching.set()
        for thread in state["threads"] + ([watcher] if self.trace else []):
            thread.join(60)
        after = self.facts()
        until = time.monotonic()
        if self.trace:
            host_before.update(host_processes(self.node_cgroup()))
        for slot, main in state["main"].items():
            before["slots"][slot] = main    # a loading slot's server is the one restarted by hand
        trials = []
        for slot, spec in sorted(specs.items()):
            failures = judge(spec, self.gpus[slot], records.get(slot), before["slots"][slot], after["slots"][slot])
            if spec["shape"] in ("paused", "loading") and slot not in state["done"]:
                failures.append(("infra", "the %s did not run (the play's line was not seen)" % spec["shape"]))
            record = records.get(slot) or {}
            signals = []
            if self.trace and failures:
                # The slot's processes: those the trial named, and any in its unit's cgroup (a
                # loading slot's ranks start after the hand restart the trial named it by).
                mine = [before["slots"][slot]["main"]] + before["slots"][slot]["children"]
                signals = [dict(e, said=signal_trace.describe(e)) for e in signal_trace.matching(
                    self.trace.snapshot(), mine, since, until, host_before, "/%s.service" % self.unit(slot))]
            trials.append({"signals": signals, "spec": spec, "failures": failures, "gpus": self.gpus[slot],
                           "age_at_play_s": ages.get(slot), "play_s": seconds,
                           "seen": ((record.get("before") or {}).get("code")), "now": record.get("now"),
                           "probe": record.get("probe"),
                           "server": record.get("server"), "reasons": record.get("reasons"),
                           "role_failure": record.get("failure"),
                           "before": before["slots"][slot], "after": after["slots"][slot]})
        dead = [name for name, alive in after["bystanders"].items() if not alive]
        if dead and self.trace:
            for name in dead:
                for e in signal_trace.matching(self.trace.snapshot(), [self.bystanders[name]], since, until,
                                               host_before, "/soak-%s.service" % name):
                    self.log("bystander %s: signal: %s" % (name, signal_trace.describe(e)))
        if any(t["failures"] for t in trials) or dead:
            trials[0].setdefault("output_tail", out[-6000:])
        return trials, dead


def host_processes(marker):
    """{host PID: {"named": [PID in its namespace, start time], "cgroup": CGROUP}} of the host's
    processes in a cgroup containing `marker` (one lab node's)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        seen = signal_trace.proc(int(name))
        if seen and seen["cgroup"] and marker in seen["cgroup"] and seen["nspid"]:
            out[int(name)] = {"named": [seen["nspid"][-1], seen["start"]], "cgroup": seen["cgroup"]}
    return out


def from_outside(events, node):
    """Signals to a process of the node (its cgroup `node`, as read when the event was read)
    sent by a process outside it: not the node's own processes (systemd, the role, the bench's
    `lab exec`, which runs in the node) nor the node's own supervisor (its nspawn, which ends it
    at `lab down`), or by one gone when the event was read (it cannot be placed: listed so that
    it is looked at). The soak's shapes send none from outside."""
    out = []
    for e in events:
        target = (e["target"].get("now") or {}).get("cgroup") or ""
        sender = (e["sender"].get("now") or {}).get("cgroup") or ""
        if node in target and node not in sender:
            out.append(e)
    return out


def shlex_quote(text):
    import shlex
    return shlex.quote(text)


def batches(n, only=None):
    """The first trial of each batch to run: every batch of trials 0..n-1, or with `only` (trial
    numbers) the batches that hold them."""
    if only:
        return sorted({k - k % len(SLOT_TP) for k in only})
    return list(range(0, n, len(SLOT_TP)))


def soak(node, seed, n, budget, log=bl.log, dealt=False, only=None, trace=None):
    """Install the servers on `node` (up), run trials 0..n-1 of `seed` (or the batches holding
    `only`) in batches of one trial per slot (shapes dealt in turn or drawn: shape()); return
    (trials, bystander wrong kills [(batch, names)], stopped_by_budget)."""
    deadline = time.time() + budget
    runner = Soak(node, seed, log, trace)
    trials, kills = [], []
    if only:
        n = max(only) - max(only) % len(SLOT_TP) + len(SLOT_TP)     # the last batch whole
    firsts = batches(n, only)
    try:
        runner.install()
        for first in firsts:
            if time.time() > deadline:
                break
            specs = {}
            for trial in range(first, min(n, first + len(SLOT_TP))):
                spec = shape(seed, trial, dealt)
                specs[spec["slot"]] = spec
            done, dead = runner.batch(specs)
            if dead:
                kills.append((first // len(SLOT_TP), dead))
            for t in done:
                log("trial %d: slot %d %-13s %s%s" % (
                    t["spec"]["trial"], t["spec"]["slot"], t["spec"]["shape"],
                    "ok" if not t["failures"] else "FAIL " + "; ".join("%s: %s" % f for f in t["failures"]),
                    "" if t.get("seen") is None else " (seen %s%s%s)" % (
                        t["seen"], "" if t.get("age_at_play_s") is None else ", age %s s" % t["age_at_play_s"],
                        "" if t["spec"]["shape"] != "paused" or not t.get("probe") else ", probes %s in %s s" % (
                            t["probe"]["statuses"], t["probe"]["seconds"]))))
                for e in t.get("signals") or []:
                    log("trial %d: signal: %s" % (t["spec"]["trial"], e["said"]))
            if dead:
                log("batch %d: bystanders killed: %s" % (first // len(SLOT_TP), dead))
            trials.extend(done)
    finally:
        runner.teardown()
    return trials, kills, len(trials) < sum(min(n, first + len(SLOT_TP)) - first for first in firsts)


def counts(trials, kills):
    c = collections.Counter()
    for t in trials:
        for name in {f[0] for f in t["failures"]}:
            c[name] += 1
    c["wrong kill"] += sum(len(dead) for _batch, dead in kills)
    return {name: c[name] for name in COUNTED}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=60, help="trials (default 60)")
    parser.add_argument("--seed", type=int, help="seed (default: from the clock, printed)")
    parser.add_argument("--budget", type=float, default=3600, help="seconds for the whole run (default 3600)")
    parser.add_argument("--keep", action="store_true", help="leave the lab node up afterwards")
    parser.add_argument("--dealt", action="store_true", help="deal the shapes in turn instead of drawing them")
    parser.add_argument("--only", help="trials K,... : run only the batches holding them (a replay)")
    parser.add_argument("--trace-signals", action="store_true",
                        help="record SIGTERM/SIGKILL senders on the host (tracefs) beside the results")
    parser.add_argument("--out", default="server_soak.json", help="results file in bench/results (default server_soak.json)")
    args = parser.parse_args()
    if args.n < 1 or args.budget <= 0:
        parser.error("--n %r and --budget %r must be positive" % (args.n, args.budget))
    only = None
    if args.only is not None:
        try:
            only = sorted({int(k) for k in args.only.split(",")})
        except ValueError:
            parser.error("--only %r: trial numbers, comma-separated" % args.only)
        if not only or only[0] < 0:
            parser.error("--only %r: trial numbers from 0" % args.only)
    if os.path.basename(args.out) != args.out or not args.out.endswith(".json"):
        parser.error("--out %r: a file name ending in .json (written in bench/results)" % args.out)
    seed = args.seed if args.seed is not None else int(time.time()) % 100000
    for key, value in LAB_DEFAULTS.items():
        os.environ.setdefault(key, value)
    commit = subprocess.run(["git", "-C", bl.REPO, "describe", "--always", "--dirty"], capture_output=True,
                            text=True, check=False).stdout.strip()
    lab("up", "1", timeout=600)
    started = time.time()
    bl.log("server soak: seed %d, %s, %d slots a batch, at %s" % (
        seed, "trials %s (their batches)" % only if only else "%d trials" % args.n, len(SLOT_TP), commit))
    trace, signals_path = None, None
    if args.trace_signals:
        os.makedirs(bl.RESULTS, exist_ok=True)
        signals_path = os.path.join(bl.RESULTS, args.out[:-len(".json")] + ".signals.jsonl")
        marker = "/gpuops%s-" % os.environ["LAB_ADDR_BASE"]
        trace = signal_trace.SignalTrace(
            "server-soak-%d" % os.getpid(), signals_path,
            keep=lambda e: any(marker in ((p.get("now") or {}).get("cgroup") or "") for p in (e["sender"], e["target"]))
            or e["target"].get("now") is None)
        why = trace.start()
        if why:
            bl.log("no signal trace (the soak runs without it): %s" % why)
            trace, signals_path = None, None
        else:
            bl.log("signal trace: SIGTERM/SIGKILL of %s* into %s" % (marker, signals_path))
    try:
        trials, kills, stopped = soak("node1", seed, args.n, args.budget, dealt=args.dealt, only=only, trace=trace)
    finally:
        if trace:
            if not trace.stop():
                bl.log("the trace instance %s is still there: remove it by hand (rmdir)" % trace.instance)
        if not args.keep:
            lab("down")
    took = time.time() - started
    c = counts(trials, kills)
    shapes = collections.Counter(t["spec"]["shape"] for t in trials if not any(f[0] == "infra" for f in t["failures"]))
    seen = collections.Counter("%s/%s" % (t["spec"]["shape"], t.get("seen")) for t in trials)
    # A pause the probe met: its first /health probe got no 200, or took over a second.
    met = sum(1 for t in trials if t["spec"]["shape"] == "paused" and t.get("probe")
              and (t["probe"]["statuses"][:1] != [200] or t["probe"]["seconds"] > 1.0))
    bl.log("seed %d: %d of %s trials in %.0f s%s; shapes %s" % (
        seed, len(trials), "the %d batches'" % len(batches(args.n, only)) if only else args.n, took, " (budget ended it)" if stopped else "", dict(shapes)))
    bl.log("as first seen by the role: %s; pauses the probe met: %d" % (dict(seen), met))
    bl.log("counts: %s" % ", ".join("%s %d" % kv for kv in c.items()))
    foreign = []
    if trace:
        foreign = from_outside(trace.snapshot(), "/gpuops%s-node1/" % os.environ["LAB_ADDR_BASE"])
        bl.log("signal trace: %d events kept of %d seen; %d SIGTERM/SIGKILL into the node from outside it%s" % (
            len(trace.snapshot()), trace.seen, len(foreign), "" if not foreign else ":"))
        for e in foreign[:20]:
            bl.log("  from outside: %s" % signal_trace.describe(e))
    bl.write_json(args.out, {"seed": seed, "commit": commit, "n": args.n, "only": only, "seconds": round(took),
                             "counts": c, "bystander_kills": kills, "pauses_met": met, "trials": trials,
                             "signals": signals_path, "signals_from_outside": foreign})
    return 1 if any(v for k, v in c.items() if k != "infra") else 0


if __name__ == "__main__":
    sys.exit(main())
