"""gpu_holders on a busy lab node, over a ping round trip, against fuser (issue 32 item 8).

usage: bench/run holders [--reps 5] [--procs 3000] [--fds 120000] [--before REF] [--keep]

Boots one lab host (`tests/lab/lab up 1`; the private lab of LAB_STATE/LAB_RUN/LAB_ADDR_BASE
when set, else /var/lib/gpuops-lab-bench at base 200) and loads it (bench/holders_node.py load):
PROCS sleeping processes holding about FDS descriptors (bench/fdload.c, built static here), a
TP-2 server, a forked child that inherits its parent's GPU fds and mappings, and a monitor with
only /dev/nvidiactl open. Then, alternating, after one untimed round (the order rotates every rep):

  ping         ansible node1 -m ping                                   (the round trip)
  gpu_holders  ansible node1 -m gpuops.reclaim.gpu_holders              (defaults: every GPU, handles, health)
  fuser        ansible node1 -m command -a 'fuser /dev/nvidia*'         (what people use instead)

(with --before REF also gpu_holders@REF: the collection's plugins as of git commit REF, in the same
alternation), and reports each one's cost over ping (its wall less ping's median) and the ratio gpu_holders/fuser
of those costs, per rep and as medians with their spread.

Then the split, timed on the node itself (holders_node.py split), the same rows without SSH or the
controller: each module's AnsiballZ file as kept from one run (ANSIBLE_KEEP_REMOTE_FILES), and the
import of each module alone from its own payload zip. What gpu_holders pays over ping to load its
code is gpu_holders_load - ping_load; what it pays to read is the rest of gpu_holders - ping.
Writes bench/results/holders.json with every sample. Never fails on a time.
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
NODE_SCRIPT = os.path.join(bl.BENCH, "holders_node.py")
VENV_BIN = os.path.join(bl.REPO, ".venv", "bin")
LAB_DEFAULTS = {"LAB_STATE": "/var/lib/gpuops-lab-bench", "LAB_RUN": "/run/gpuops-lab-bench",
                "LAB_ADDR_BASE": "200"}
FDLOAD_IN_NODE = "/usr/local/bin/bench-fdload"


def ansible_env(extra=None):
    env = dict(os.environ)
    env.update(PATH=VENV_BIN + os.pathsep + env.get("PATH", ""),
               ANSIBLE_CONFIG=os.path.join(bl.REPO, "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=bl.COLLECTIONS, ANSIBLE_DEPRECATION_WARNINGS="False",
               ANSIBLE_NOCOLOR="1", PYTHONWARNINGS="ignore")
    env.update(extra or {})
    return env


def adhoc(inventory, *args, env=None, timeout=600):
    return subprocess.run([os.path.join(VENV_BIN, "ansible"), "node1", "-i", inventory] + list(args),
                          env=ansible_env(env), capture_output=True, text=True, timeout=timeout, check=False)


def on_node(inventory, *args):
    """holders_node.py ARGS on node1; its stdout's last line as JSON (fails loudly)."""
    with tempfile.TemporaryDirectory(prefix="bench-holders-tree-") as tree:
        run = adhoc(inventory, "--tree", tree, "-m", "ansible.builtin.script",
                    "-a", "%s %s executable=/usr/bin/python3" % (NODE_SCRIPT, " ".join(args)))
        with open(os.path.join(tree, "node1")) as handle:
            result = json.load(handle)
    if result.get("rc") != 0:
        why = result.get("stderr") or result.get("msg")
        raise SystemExit("holders_node.py %s failed: %s\n%s" % (" ".join(args), why, run.stdout[-2000:]))
    lines = [line for line in result.get("stdout", "").splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines else None


def timed(argv, env):
    started = time.monotonic()
    proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=600, check=False)
    return time.monotonic() - started, proc.returncode


def spread(values):
    return "%.3f-%.3f" % (min(values), max(values))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--procs", type=int, default=3000)
    parser.add_argument("--fds", type=int, default=120000)
    parser.add_argument("--keep", action="store_true", help="leave the lab host up (and loaded) afterwards")
    parser.add_argument("--before", metavar="REF", help="also time gpu_holders as of git commit REF")
    args = parser.parse_args()
    if args.reps < 1 or args.procs < 0 or args.fds < 0:
        parser.error("--reps must be at least 1, --procs and --fds at least 0")
    for key, value in LAB_DEFAULTS.items():
        os.environ.setdefault(key, value)

    workdir = tempfile.mkdtemp(prefix="bench-holders-")
    fdload = os.path.join(workdir, "fdload")
    subprocess.run(["cc", "-O2", "-static", "-o", fdload, os.path.join(bl.BENCH, "fdload.c")], check=True)
    bl.log("lab up 1 (LAB_STATE=%s LAB_ADDR_BASE=%s)" % (os.environ["LAB_STATE"], os.environ["LAB_ADDR_BASE"]))
    up = subprocess.run([LAB, "up", "1", "--gpus", "4"], capture_output=True, text=True, timeout=900, check=False)
    if up.returncode != 0:
        raise SystemExit("lab up failed:\n%s\n%s" % (up.stdout, up.stderr))
    inventory = up.stdout.strip().splitlines()[-1]
    out = {"reps": args.reps}
    try:
        copy = adhoc(inventory, "-m", "ansible.builtin.copy", "-a", "src=%s dest=%s mode=0755" % (fdload, FDLOAD_IN_NODE))
        if copy.returncode != 0:
            raise SystemExit("copying fdload failed:\n%s" % copy.stdout[-2000:])
        out["load"] = on_node(inventory, "load", str(args.procs), str(args.fds), FDLOAD_IN_NODE)
        bl.log("node1 loaded: %s" % out["load"])
        cmds = {
            "ping": (["-m", "ansible.builtin.ping"], {}),
            "gpu_holders": (["-m", "gpuops.reclaim.gpu_holders"], {}),
            "fuser": (["-m", "ansible.builtin.shell", "-a", "fuser /dev/nvidia[0-9]* /dev/nvidiactl; true"], {}),
        }
        before_env = {}
        if args.before:
            tree = bl.collection_at(args.before, os.path.join(workdir, "before"))
            before_env = {"ANSIBLE_COLLECTIONS_PATH": os.path.dirname(os.path.dirname(os.path.dirname(tree)))}
            cmds["gpu_holders@" + args.before] = (["-m", "gpuops.reclaim.gpu_holders"], before_env)
        base = [os.path.join(VENV_BIN, "ansible"), "node1", "-i", inventory]
        names = list(cmds)
        samples = dict((n, []) for n in names)
        for name in names:      # one untimed round: SSH's control master up, caches warm
            timed(base + cmds[name][0], ansible_env(cmds[name][1]))
        for rep in range(args.reps):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                wall, rc = timed(base + cmds[name][0], ansible_env(cmds[name][1]))
                if rc != 0:
                    raise SystemExit("%s failed (rc %d)" % (name, rc))
                samples[name].append(round(wall, 4))
            bl.log("rep %d: %s" % (rep + 1, "  ".join("%s %.3f s" % (n, samples[n][-1]) for n in names)))
        out["round_trip"] = samples

        # One kept run of each module for the node-side split: REF's first, so that the newest
        # kept gpu_holders is today's (holders_node.py split takes the newest, and the one before
        # it as REF's).
        kept_runs = ([("gpuops.reclaim.gpu_holders", before_env)] if args.before else []) + [
            ("gpuops.reclaim.gpu_holders", {}), ("ansible.builtin.ping", {})]
        on_node(inventory, "forget")
        for module, env in kept_runs:
            kept = adhoc(inventory, "-m", module, env=dict(env, ANSIBLE_KEEP_REMOTE_FILES="1", ANSIBLE_PIPELINING="0"))
            if kept.returncode != 0:
                raise SystemExit("kept run of %s failed:\n%s" % (module, kept.stdout[-2000:]))
            time.sleep(1.1)     # a later mtime for the later file (split orders them by it)
        out["node"] = on_node(inventory, "split", str(args.reps), *(["gpu_holders@" + args.before] if args.before else []))
    finally:
        if not args.keep:
            subprocess.run([LAB, "down"], capture_output=True, timeout=900, check=False)
        shutil.rmtree(workdir, ignore_errors=True)
    report(out)


def report(out):
    rt = out["round_trip"]
    ping = statistics.median(rt["ping"])
    print("\ngpu_holders on a lab node of %(node_procs)d processes (fdload: %(fdload_procs)d processes, "
          "%(fdload_fds)d fds); %(reps)d reps after one untimed round, alternating"
          % dict(out["load"], reps=out["reps"]))
    print("\nThrough Ansible (ad hoc, one host): wall s, median (min-max); cost = wall - ping's median")
    print("%-12s %16s %16s" % ("row", "wall s", "cost over ping"))
    for name in [n for n in rt if n != "fuser"] + ["fuser"]:
        cost = [v - ping for v in rt[name]]
        print("%-12s %7.3f (%s) %7.3f (%s)" % (name, statistics.median(rt[name]), spread(rt[name]),
                                               statistics.median(cost), spread(cost)))
    per_rep = [(h - p) / (f - p) if f > p else float("nan")
               for h, f, p in zip(rt["gpu_holders"], rt["fuser"], rt["ping"])]
    cost_ratio = (statistics.median(rt["gpu_holders"]) - ping) / (statistics.median(rt["fuser"]) - ping)
    print("gpu_holders / fuser, costs over ping: %.2fx (medians); per rep (each with its own ping): %s"
          % (cost_ratio, ", ".join("%.2f" % r for r in per_rep)))
    for name in [n for n in rt if n.startswith("gpu_holders@")]:
        print("%s / fuser, costs over ping: %.2fx (medians)" % (
            name, (statistics.median(rt[name]) - ping) / (statistics.median(rt["fuser"]) - ping)))

    out["summary"] = {"round_trip_cost_ratio": cost_ratio, "per_rep_ratio": per_rep}
    for measure in ("wall", "cpu"):
        node = out["node"][measure]
        med = dict((k, statistics.median(v)) for k, v in node.items())
        print("\nOn the node (no SSH, no controller): %s s, median (min-max)" % measure)
        for name in node:
            print("%-22s %7.3f (%s)" % (name, med[name], spread(node[name])))
        for name in [n for n in node if n.startswith("gpu_holders") and not n.endswith("_load")]:
            over = med[name] - med["ping"]
            load = med[name + "_load"] - med["ping_load"]
            ratio = over / med["fuser"]
            print("%s over ping: %.3f s = loading its code %.3f s + reading (NVML, /proc) and answering %.3f s; "
                  "fuser %.3f s; (%s - ping) / fuser = %.2fx" % (name, over, load, over - load, med["fuser"], name, ratio))
            out["summary"]["%s %s" % (name, measure)] = {
                "over_ping_s": over, "load_s": load, "read_s": over - load, "fuser_s": med["fuser"],
                "ratio": ratio}
    path = bl.write_json("holders.json", out)
    print("\nsamples: %s" % path)


if __name__ == "__main__":
    main()
