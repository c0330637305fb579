"""reclaim.yml as AWX runs it, and what it says, from the collection as a new user installs it.

The collection is built into a tarball and installed with `ansible-galaxy collection install`
into a directory of its own (not this checkout's link); no ansible.cfg of this repository is
read. Each run goes through ansible-runner, the library AWX's jobs run with: a private data
dir with an inventory (the lab's, with host_vars) and a project whose playbook imports
gpuops.reclaim.reclaim, as an AWX project does. The test reads what AWX keeps: the run's
custom stats (the stats event's artifact_data, which AWX stores as the job's artifacts), the
job events (the failing task) and the artifacts directory (the summary file).

Runs: orphaned TP ranks on a host without a server (strays freed, play 1); a hand-started
TP-8 server whose launcher was SIGKILLed, adopted by the inference_service role; a misspelled
flag, refused before anything is touched; and a reclaim_hosts that matches no host.
"""

import glob
import json
import os
import shutil
import subprocess

import pytest

from . import scenarios as sc
from .conftest import REPO, VENV_BIN
from .test_reclaim_playbook import GOOD_SERVER, SERVER_RESET, orphan_on_gpu3

ansible_runner = pytest.importorskip("ansible_runner", reason="ansible-runner is in requirements-dev.txt: run 'make venv'")

# A hand-started stand-in SGLang server over the eight lab GPUs (as on the seed hosts).
HAND_FLAGS = "--model-path /models/m --tp-size 8 --mem-fraction-static 0.85"
EIGHT = [str(gpu) for gpu in range(8)]
ADOPTING_SERVER = dict(GOOD_SERVER, inference_service_gpus=EIGHT,
                       inference_service_flags={"model_path": "/models/m", "tp_size": 8, "mem_fraction_static": 0.9},
                       inference_service_adopt_extra_patterns=["(^|/)fakeserve( |$)"])


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The built tarball, installed as a user installs it; the collections path holding it."""
    tmp = tmp_path_factory.mktemp("installed")
    env = dict(os.environ)
    for name in ("ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH"):
        env.pop(name, None)
    galaxy = os.path.join(VENV_BIN, "ansible-galaxy")
    subprocess.run([galaxy, "collection", "build", "--output-path", str(tmp / "dist"), REPO], env=env, cwd=str(tmp),
                   check=True, capture_output=True, text=True)
    tarball, = glob.glob(str(tmp / "dist" / "gpuops-reclaim-*.tar.gz"))
    subprocess.run([galaxy, "collection", "install", "--offline", "-p", str(tmp / "collections"), tarball], env=env,
                   cwd=str(tmp), check=True, capture_output=True, text=True)
    assert os.path.isfile(str(tmp / "collections" / "ansible_collections" / "gpuops" / "reclaim" / "MANIFEST.json"))
    return str(tmp / "collections")


@pytest.fixture
def job(lab, clean_gpus, installed, tmp_path, monkeypatch):
    """run(host_vars, **extravars) -> (runner, summary from the artifacts or None), on node1."""
    node = lab.nodes[0]
    sc.cleanup(lab, node)
    lab.exec(node, SERVER_RESET)
    # This checkout's Ansible settings must not reach the job: it has only the installed collection.
    for name in ("ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", VENV_BIN + os.pathsep + os.environ.get("PATH", ""))

    def run(host_vars, **extravars):
        private = tmp_path / ("job%d" % len(list(tmp_path.iterdir())))
        (private / "project").mkdir(parents=True)
        (private / "inventory" / "host_vars").mkdir(parents=True)
        shutil.copy(lab.inventory, str(private / "inventory" / "hosts"))
        (private / "inventory" / "host_vars" / (node + ".yml")).write_text(json.dumps(host_vars))
        (private / "project" / "reclaim.yml").write_text(
            "- name: Reclaim GPUs and converge inference servers\n"
            "  ansible.builtin.import_playbook: gpuops.reclaim.reclaim\n")
        runner = ansible_runner.run(private_data_dir=str(private), playbook="reclaim.yml", quiet=True, timeout=600,
                                    extravars=extravars, envvars={"ANSIBLE_COLLECTIONS_PATH": installed})
        stats = [e for e in runner.events if e["event"] == "playbook_on_stats"]
        assert stats, "no stats event (status %s)\n%s" % (runner.status, runner.stdout.read())
        artifact = stats[-1]["event_data"].get("artifact_data", {}).get("gpuops_reclaim")
        return runner, artifact

    yield node, run
    lab.exec(node, SERVER_RESET)
    sc.cleanup(lab, node)


def output(runner):
    runner.stdout.seek(0)
    return runner.stdout.read()


def failed_events(runner):
    return [e for e in runner.events if e["event"] == "runner_on_failed" and not e["event_data"].get("ignore_errors")]


def test_strays_freed_the_summary_is_in_the_jobs_artifacts_and_its_file_in_the_artifacts_dir(job, lab):
    node, run = job
    orphan = orphan_on_gpu3(lab, node)
    runner, summary = run({})
    out = output(runner)
    assert runner.status == "successful", out
    host = summary["hosts"][node]
    assert host["status"] == "ok" and host["changed"] is True, host
    assert ("sigterm", orphan["pid"]) in [(a["step"], a.get("pid")) for a in host["actions"]], host["actions"]
    assert [g["free"] for g in host["gpus_after"] if g["index"] == 3] == [True], host["gpus_after"]
    assert "%s: == GPUs reclaimed in " % node in out, out
    # The file: in the job's artifacts directory, the same summary; none in the project or here.
    written = glob.glob(os.path.join(runner.config.artifact_dir, "gpuops-reclaim-*.json"))
    assert written == [summary["path"]], (written, summary.get("path"))
    with open(written[0]) as f:
        assert json.load(f)["hosts"] == summary["hosts"]
    project = os.path.join(os.path.dirname(os.path.dirname(runner.config.artifact_dir)), "project")
    assert not glob.glob(os.path.join(project, "gpuops-reclaim-*.json"))
    assert not glob.glob(os.path.join(os.getcwd(), "gpuops-reclaim-*.json"))


def test_an_adopting_run_says_what_adoption_ended(job, lab):
    node, run = job
    # Lab nodes share the controller's network namespace: the server listens on the node's address.
    launcher = lab.exec(node, "FAKESERVE_LOAD_SECONDS=1 setsid nohup /usr/local/bin/fakeserve %s --host %s "
                              "--port %d </dev/null >/root/hand-server.log 2>&1 & echo $!"
                        % (HAND_FLAGS, lab.status()[node]["ip"], GOOD_SERVER["inference_service_port"])).stdout.strip()
    sc.wait_until(lab, node, "[ $(pgrep -c -P %s) -ge 8 ]" % launcher, "8 ranks")
    ranks = sorted(int(p) for p in lab.exec(node, "pgrep -P %s" % launcher).stdout.split())
    sc.wait_until(lab, node, "[ $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l) -ge 8 ]",
                  "the 8 ranks on the GPUs")
    # The seeds' state: the launcher SIGKILLed, its ranks re-parented to PID 1, holding every GPU.
    lab.exec(node, "kill -KILL %s" % launcher)
    sc.wait_until(lab, node, "! kill -0 %s 2>/dev/null" % launcher, "the launcher gone")
    runner, summary = run(ADOPTING_SERVER)
    out = output(runner)
    assert runner.status == "successful", out
    host = summary["hosts"][node]
    adoption = host["server"]["adoption"]
    assert adoption is not None, host
    ended = sorted(a["pid"] for a in adoption["actions"] if a["result"].startswith("ended by the stop of "))
    assert set(ranks) <= set(ended), (ranks, adoption)
    assert host["changed"] is True and host["actions"] == [], host
    # The table: what the stray reclaim had to do (nothing outside the server's GPUs) and what adoption ended.
    assert "no GPU to free" not in out, out
    assert "%s: == no GPU outside sglang's (GPU %s) to free ==" % (node, ",".join(EIGHT)) in out, out
    assert "%s: == sglang: adopted a hand-started server, %d process(es) ended by stopping " % (node, len(ended)) in out
    for pid in ranks:
        assert "%s:   adopt_stop PID %d " % (node, pid) in out, out


def test_a_refused_flag_changes_nothing_and_says_so_cleanly(job, lab):
    node, run = job
    misspelled = dict(GOOD_SERVER, inference_service_flags=dict(GOOD_SERVER["inference_service_flags"],
                                                                mem_fracton_static=0.9))
    runner, summary = run(misspelled)
    assert runner.status == "failed", output(runner)
    host = summary["hosts"][node]
    assert host["status"] == "failed" and host["changed"] is False, host
    assert host["server"]["gpus_reclaim"] is None and host["server"]["adoption"] is None, host
    msg = host["failure"]["msg"]
    assert msg.startswith("sglang at /usr/local/bin/fakeserve "), msg
    assert ("--mem-fracton-static (inference_service_flags.mem_fracton_static; closest it knows: "
            "--mem-fraction-static). Nothing was changed.") in msg, msg
    assert "  " not in msg and "?." not in msg, msg
    # The job's events name the failing task: the host failed at the end with the role's refusal.
    # The job's events name the failing task (the role's refusal, rescued and recorded), then the
    # host failed at the end of the run with it.
    failed = failed_events(runner)
    assert [(e["event_data"]["host"], e["event_data"]["task"]) for e in failed] == [
        (node, "Refuse flags the engine does not know"), (node, "Fail with what went wrong")], output(runner)
    assert failed[-1]["event_data"]["res"]["msg"].endswith(msg), failed[-1]["event_data"]["res"]
    assert "inactive" in lab.exec(node, "systemctl is-active sglang || true").stdout


def test_a_run_that_matches_no_host_fails_naming_the_pattern(job):
    _node, run = job
    runner, summary = run({}, reclaim_hosts="no_such_group")
    assert runner.status == "failed" and summary is None
    failed = failed_events(runner)
    assert [e["event_data"]["task"] for e in failed] == ["Fail when reclaim_hosts matches no host"], output(runner)
    msg = failed[0]["event_data"]["res"]["msg"]
    assert "'no_such_group' (reclaim_hosts) matches no host of the inventory" in msg, msg
    assert "-e reclaim_hosts=GROUP" in msg and "extra variables" in msg, msg
    # Nothing else ran: no play reached a GPU node.
    assert not [e for e in runner.events if e["event"] == "runner_on_ok" and e["event_data"].get("host") != "localhost"]
