"""Fleet benchmark: playbooks/reclaim.yml on N wedged lab hosts beside the ways people do it.

usage: bench/run fleet [--hosts N] [--reps R] [--methods reclaim.yml,module,fuser,ping,check,module-check]
                       [--before REF] [--task-times] [--keep]

Boots N lab hosts in a private lab (LAB_STATE/LAB_RUN/LAB_ADDR_BASE from the environment,
else /var/lib/gpuops-lab-bench, /run/gpuops-lab-bench, base 200), wedges every host like the
seeds (bench/fleet_node.py: 8 orphaned TP ranks, one holder ignoring SIGTERM, one monitor) and
times, alternating, with forks = N:

  reclaim.yml  ansible-playbook playbooks/reclaim.yml (the collection's way)
  module       ansible gpu_nodes -m gpuops.reclaim.gpu_reclaim (the module alone, ad hoc)
  fuser        ansible gpu_nodes -m shell -a 'fuser -k /dev/nvidia*; sleep 1; fuser -k /dev/nvidia*'
               (the seeds' blind way; it kills the monitors too)
  ping         ansible gpu_nodes -m ping (the floor: Ansible reaching every host)
  check        ansible-playbook playbooks/reclaim.yml --check --diff on converged hosts
               (GPUs free, monitor running): the scheduled drift check
  module-check ansible gpu_nodes -m gpuops.reclaim.gpu_reclaim --check on converged hosts: the
               check's own module call ad hoc, the floor of the check's cost
  --before REF adds reclaim.yml@REF, module@REF, check@REF and module-check@REF: the same runs with the
               playbook, roles and modules of git commit REF (git archive into a temporary
               collection tree), so a change is measured against what it replaced in the same
               run (each only when its method is in --methods)
  --task-times also records when each play and task of the playbook methods started
               (bench/callback_plugins/bench_task_times.py) and prints each step's median time:
               a step is the gap to the next one, so the first task of a play includes the play's
               start. The callback adds its own small cost to those runs: compare ratios of runs
               made the same way.

Wall time and controller CPU (user + system of the command and everything it forked and
reaped, from wait4) per run; after every run, whether each host ended free with its monitor
alive (the check must also change nothing). Prints medians and ratios; writes
bench/results/fleet-N.json. Never fails on a time.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import benchlib as bl

LAB = os.path.join(bl.REPO, "tests", "lab", "lab")
NODE_SCRIPT = os.path.join(bl.BENCH, "fleet_node.py")
PLAYBOOK = os.path.join(bl.REPO, "playbooks", "reclaim.yml")
VENV_BIN = os.path.join(bl.REPO, ".venv", "bin")
METHODS = ("reclaim.yml", "module", "fuser", "ping", "check", "module-check")
RECLAIMING = ("reclaim.yml", "module", "fuser")
CHECKING = ("check", "module-check")
PLAYBOOK_METHODS = ("reclaim.yml", "check")   # the methods that run ansible-playbook
BLIND = "fuser -k /dev/nvidia*; sleep 1; fuser -k /dev/nvidia*; true"
LAB_DEFAULTS = {"LAB_STATE": "/var/lib/gpuops-lab-bench", "LAB_RUN": "/run/gpuops-lab-bench",
                "LAB_ADDR_BASE": "200"}


def ansible_env(forks, extra=None):
    env = dict(os.environ)
    env.update(PATH=VENV_BIN + os.pathsep + env.get("PATH", ""),
               ANSIBLE_CONFIG=os.path.join(bl.REPO, "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=bl.COLLECTIONS, ANSIBLE_FORKS=str(forks),
               ANSIBLE_DEPRECATION_WARNINGS="False", ANSIBLE_NOCOLOR="1")
    env.update(extra or {})
    return env


def commands(inventory, before=None):
    """method -> (argv, extra environment)."""
    adhoc = [os.path.join(VENV_BIN, "ansible"), "gpu_nodes", "-i", inventory]
    playbook = [os.path.join(VENV_BIN, "ansible-playbook"), PLAYBOOK, "-i", inventory]
    cmds = {
        "reclaim.yml": (playbook, {}),
        "module": (adhoc + ["-m", "gpuops.reclaim.gpu_reclaim"], {}),
        "fuser": (adhoc + ["-m", "ansible.builtin.shell", "-a", BLIND], {}),
        "ping": (adhoc + ["-m", "ansible.builtin.ping"], {}),
        "check": (playbook + ["--check", "--diff"], {}),
        "module-check": (adhoc + ["-m", "gpuops.reclaim.gpu_reclaim", "--check"], {}),
    }
    if before:
        ref, tree = before
        old = [os.path.join(VENV_BIN, "ansible-playbook"), os.path.join(tree, "playbooks", "reclaim.yml"), "-i", inventory]
        env = {"ANSIBLE_COLLECTIONS_PATH": os.path.dirname(os.path.dirname(os.path.dirname(tree)))}
        cmds["reclaim.yml@" + ref] = (old, env)
        cmds["module@" + ref] = (adhoc + ["-m", "gpuops.reclaim.gpu_reclaim"], env)
        cmds["check@" + ref] = (old + ["--check", "--diff"], env)
        cmds["module-check@" + ref] = (adhoc + ["-m", "gpuops.reclaim.gpu_reclaim", "--check"], env)
    return cmds


def timed(argv, env, log):
    """Run argv; return (wall s, controller CPU s of it and its reaped descendants, rc)."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            cwd=bl.REPO)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def on_nodes(inventory, forks, what):
    """Run fleet_node.py WHAT on every node at once; return {host: stdout} (fails loudly)."""
    with tempfile.TemporaryDirectory(prefix="bench-fleet-tree-") as tree:
        run = subprocess.run([os.path.join(VENV_BIN, "ansible"), "gpu_nodes", "-i", inventory, "--tree", tree,
                              "-m", "ansible.builtin.script",
                              "-a", "%s %s executable=/usr/bin/python3" % (NODE_SCRIPT, what)],
                             env=ansible_env(forks), capture_output=True, text=True, timeout=600, check=False)
        hosts = {}
        for host in os.listdir(tree):
            with open(os.path.join(tree, host)) as handle:
                hosts[host] = json.load(handle)
    bad = {h: r.get("msg") or r.get("stderr") for h, r in hosts.items() if r.get("rc") != 0}
    if bad or not hosts:
        raise SystemExit("fleet_node.py %s failed (rc %d) on %s\n%s" % (
            what, run.returncode, json.dumps(bad, indent=1) if bad else "every host (no result)", run.stdout[-2000:]))
    return {h: r["stdout"] for h, r in hosts.items()}


def end_state(inventory, forks):
    states = {h: json.loads(out) for h, out in on_nodes(inventory, forks, "verify").items()}
    return {"free": sum(1 for s in states.values() if s["free"]),
            "monitor_alive": sum(1 for s in states.values() if s["monitor_alive"]),
            "hosts": states}


def recap_changed(log_path):
    """Hosts the play recap (or an ad hoc run's `HOST | CHANGED` line) shows changed, for the
    checks, which must change nothing."""
    changed = []
    with open(log_path) as handle:
        for line in handle:
            if " : ok=" in line and "changed=" in line:
                host = line.split()[0]
                if int(line.split("changed=")[1].split()[0]) > 0:
                    changed.append(host)
            elif " | CHANGED" in line:
                changed.append(line.split()[0])
    return changed


def step_times(path):
    """[(play or task name, seconds to the next event)] from a bench_task_times file; a name that
    comes back (a task of a later play, an included task per host) is numbered on."""
    with open(path) as handle:
        events = [json.loads(line) for line in handle]
    steps, seen = [], {}
    for event, following in zip(events, events[1:]):
        name = "%s: %s" % (event["kind"], event["name"])
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = "%s (%d)" % (name, seen[name])
        steps.append([name, round(following["t"] - event["t"], 3)])
    return steps


def report_steps(methods, timed_samples):
    for m in methods:
        runs = [s["steps"] for s in timed_samples[m] if s.get("steps")]
        if not runs:
            continue
        print("\n%s: median seconds of each step over %d runs (a step: to the next play or task)" % (m, len(runs)))
        for name in [name for name, _seconds in runs[0]]:
            values = [dict(run).get(name) for run in runs]
            values = [v for v in values if v is not None]
            print("  %6.3f  %s" % (statistics.median(values), name))


def lab(*args, timeout=900):
    run = subprocess.run([LAB] + list(args), capture_output=True, text=True, timeout=timeout, check=False)
    if run.returncode != 0:
        raise SystemExit("lab %s failed (rc %d):\n%s\n%s" % (" ".join(args), run.returncode, run.stdout, run.stderr))
    return run.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--keep", action="store_true", help="leave the lab hosts up afterwards")
    parser.add_argument("--before", metavar="REF", help="also time reclaim.yml, module and check as of git commit REF")
    parser.add_argument("--task-times", action="store_true",
                        help="record each play and task's time in the playbook methods and print the medians")
    args = parser.parse_args()
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        parser.error("--methods: unknown %s (known: %s)" % (", ".join(unknown), ", ".join(METHODS)))
    if not 1 <= args.hosts <= 20 or args.reps < 1:
        parser.error("--hosts must be 1..20 and --reps at least 1, got %d and %d" % (args.hosts, args.reps))
    for key, value in LAB_DEFAULTS.items():
        os.environ.setdefault(key, value)

    bl.log("lab up %d (LAB_STATE=%s LAB_ADDR_BASE=%s)" % (args.hosts, os.environ["LAB_STATE"], os.environ["LAB_ADDR_BASE"]))
    inventory = lab("up", str(args.hosts)).strip().splitlines()[-1]
    logdir = tempfile.mkdtemp(prefix="bench-fleet-")
    before = (args.before, bl.collection_at(args.before, logdir)) if args.before else None
    cmds = commands(inventory, before)
    if before:
        methods += [m + "@" + args.before for m in ("reclaim.yml", "module", "check", "module-check") if m in methods]
    samples = {m: [] for m in methods}
    try:
        on_nodes(inventory, args.hosts, "converged")
        # One untimed round first: SSH control masters and the controller's caches warm.
        schedule = [(m, True) for m in methods]
        for rep in range(args.reps):   # rotate the order each rep so no method always runs first
            schedule += [(m, False) for m in methods[rep % len(methods):] + methods[:rep % len(methods)]]
        for method, warm in schedule:
            kind = method.split("@")[0]
            prepare = "wedge" if kind in RECLAIMING else "converged" if kind in CHECKING else None
            if prepare:
                on_nodes(inventory, args.hosts, prepare)
            log_path = os.path.join(logdir, "%s-%d.log" % (method, len(samples[method])))
            with open(log_path, "w") as log:
                argv, extra_env = cmds[method]
                if kind in PLAYBOOK_METHODS and "@" not in method:
                    # The run's summary is part of its cost; written beside the log, not in the checkout.
                    argv = argv + ["-e", "reclaim_summary_file=%s.summary.json" % log_path]
                times_path = log_path + ".tasks.jsonl"
                if args.task_times and kind in PLAYBOOK_METHODS:
                    extra_env = dict(extra_env, BENCH_TASK_TIMES=times_path, ANSIBLE_CALLBACKS_ENABLED="bench_task_times",
                                     ANSIBLE_CALLBACK_PLUGINS=os.path.join(bl.BENCH, "callback_plugins"))
                wall, cpu, rc = timed(argv, ansible_env(args.hosts, extra_env), log)
            sample = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "rc": rc}
            if os.path.exists(times_path):
                sample["steps"] = step_times(times_path)
            if prepare:
                state = end_state(inventory, args.hosts)
                sample.update(free=state["free"], monitor_alive=state["monitor_alive"])
                if kind in CHECKING:
                    sample["changed_hosts"] = recap_changed(log_path)
            if warm:
                sample["warm"] = True
            samples[method].append(sample)
            bl.log("%-18s %6.2f s wall %6.2f s cpu rc %d %s" % (
                method, wall, cpu, rc, "" if not prepare else "free %d/%d monitor %d/%d%s" % (
                    sample["free"], args.hosts, sample["monitor_alive"], args.hosts,
                    " changed on %s" % sample["changed_hosts"] if sample.get("changed_hosts") else "")))
            if rc != 0 and method not in ("fuser",):
                with open(log_path) as handle:
                    bl.log("%s rc %d, log tail:\n%s" % (method, rc, handle.read()[-3000:]))
    finally:
        if not args.keep:
            lab("down")
        shutil.rmtree(logdir, ignore_errors=True)
    report(args, methods, samples)


def report(args, methods, samples):
    timed_samples = {m: [s for s in samples[m] if not s.get("warm")] for m in methods}
    med = {m: statistics.median(s["wall_s"] for s in timed_samples[m]) for m in methods}
    cpu = {m: statistics.median(s["cpu_s"] for s in timed_samples[m]) for m in methods}
    print("\nFleet: %d hosts, forks %d, %d reps after one warm-up round, alternating; medians"
          % (args.hosts, args.hosts, args.reps))
    print("%-18s %8s %8s %8s %12s %s" % ("method", "wall s", "vs fuser", "vs ping", "cpu s/host", "end state (every rep)"))
    for m in methods:
        state = ""
        kind = m.split("@")[0]
        if kind in RECLAIMING or kind in CHECKING:
            runs = timed_samples[m]
            state = "free %s, monitor alive %s" % (
                "/".join(str(s["free"]) for s in runs), "/".join(str(s["monitor_alive"]) for s in runs))
            if kind in CHECKING:
                state += ", changed hosts %s" % "/".join(str(len(s["changed_hosts"])) for s in runs)
        print("%-18s %8.2f %8s %8s %12.3f %s" % (
            m, med[m], "%.2fx" % (med[m] / med["fuser"]) if "fuser" in med else "-",
            "%.2fx" % (med[m] / med["ping"]) if "ping" in med else "-", cpu[m] / args.hosts, state))
    report_steps(methods, timed_samples)
    path = bl.write_json("fleet-%d.json" % args.hosts, {
        "hosts": args.hosts, "reps": args.reps, "samples": samples,
        "median_wall_s": med, "median_cpu_s": cpu,
        "cpu_per_host_s": {m: cpu[m] / args.hosts for m in methods}})
    print("\nsamples: %s" % path)


if __name__ == "__main__":
    main()
