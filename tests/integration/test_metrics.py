"""The run's metrics through Debian's real prometheus-node-exporter on a lab node (issue 33).

node_exporter 1.5.0 comes from Debian's package (tests/prometheus/fetch unpacks the .deb on
the controller: the apt cache, else the mirror once, then .build/prometheus). Its binary is
copied into the node and run as a transient service there, as Debian's unit runs it (user
prometheus is not needed to read a 0644 file, so it runs as nobody), listening on the node's own
address only: the nodes share the controller's network namespace, so a wildcard :9100 would
collide with other labs. Installing the .deb with dpkg -i would start its own service on
*:9100 (its postinst), and adding it to the shared base tree would rebuild every lab's nodes.

playbooks/reclaim.yml ends a stray (fakegpu hold, parent gone) on GPU 0; the test scrapes
node_exporter over HTTP and finds the run's figures there, then runs again with nothing to do
and checks that no counter went back.
"""

import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest

from . import scenarios as sc
from .conftest import REPO, VENV_BIN, ansible_env

PLAYBOOK = os.path.join(REPO, "playbooks", "reclaim.yml")
FETCH = os.path.join(REPO, "tests", "prometheus", "fetch")
NODE_EXPORTER = os.path.join(REPO, ".build", "prometheus", "node_exporter")
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"   # Debian's, the playbook's default
METRICS_FILE = TEXTFILE_DIR + "/gpuops_reclaim.prom"
IN_NODE = "/usr/local/bin/gpuops-t-node-exporter"
UNIT = "gpuops-t-node-exporter"
PORT = 9100
SCRAPE_S = 30       # bound for node_exporter to answer once started (it answers in well under a second)


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(url):
    """{(name, sorted label pairs): value} of what node_exporter serves (read here, not with the
    collection's own reader, so the test does not grade its own parser)."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            match = SAMPLE.match(line)
            assert match, "node_exporter served a line not understood: %r" % line
            labels = tuple(sorted(LABEL.findall(match.group(2) or "")))
            found[(match.group(1), labels)] = float(match.group(3))
    return found


def figure(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


def counters(samples):
    return dict((key, value) for key, value in samples.items() if key[0].startswith("gpuops_") and key[0].endswith("_total"))


@pytest.fixture
def exporter(lab, clean_gpus):
    """node_exporter on the first node, reading Debian's textfile directory; (node, URL)."""
    if not os.access(NODE_EXPORTER, os.X_OK):
        fetched = subprocess.run([FETCH], capture_output=True, text=True, timeout=300, check=False)
        if fetched.returncode != 0:
            pytest.skip("Debian's prometheus-node-exporter could not be fetched (%s): %s"
                        % (FETCH, fetched.stderr.strip()[-300:]))
    node = lab.nodes[0]
    ip = lab.status()[node]["ip"]
    sc.cleanup(lab, node)
    lab.exec(node, "systemctl stop %s 2>/dev/null; rm -rf /var/lib/prometheus" % UNIT, check=False)
    copied = lab.module(node, "ansible.builtin.copy", {"src": NODE_EXPORTER, "dest": IN_NODE, "mode": "0755"})
    assert not copied.get("failed"), copied
    lab.exec(node, "systemd-run --quiet --collect --unit=%s --property=User=nobody -- %s "
                   "--web.listen-address=%s:%d --collector.disable-defaults --collector.textfile "
                   "--collector.textfile.directory=%s" % (UNIT, IN_NODE, ip, PORT, TEXTFILE_DIR))
    url = "http://%s:%d/metrics" % (ip, PORT)
    deadline = time.monotonic() + SCRAPE_S
    while True:
        try:
            scrape(url)
            break
        except OSError:
            if time.monotonic() > deadline:
                status = lab.exec(node, "systemctl status %s --no-pager" % UNIT, check=False)
                raise AssertionError("node_exporter did not answer on %s within %ss\n%s" % (url, SCRAPE_S, status.stdout))
            time.sleep(0.1)
    yield node, url
    lab.exec(node, "systemctl stop %s; rm -f %s; rm -rf /var/lib/prometheus" % (UNIT, IN_NODE), check=False)
    sc.cleanup(lab, node)


def run_playbook(lab, node):
    tmp = tempfile.mkdtemp(prefix="metrics-play-")
    try:
        shutil.copy(lab.inventory, os.path.join(tmp, "inventory.ini"))
        run = subprocess.run(
            [os.path.join(VENV_BIN, "ansible-playbook"), PLAYBOOK, "-i", os.path.join(tmp, "inventory.ini"),
             "-l", node, "-e", "gpus_free_term_timeout=2", "-e", "reclaim_summary_file=" + os.path.join(tmp, "s.json")],
            env=ansible_env(), capture_output=True, text=True, timeout=600, check=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return run


def test_node_exporter_serves_what_a_run_did_and_counters_never_go_back(lab, exporter):
    node, url = exporter
    before = scrape(url)
    assert not [key for key in before if key[0].startswith("gpuops_")]   # nothing of ours yet

    # A stray: a TP rank whose launcher died, holding 3000 MiB on GPU 0.
    record = sc.hold(lab, node, "metrics-stray", "--gpu", "0:3000")
    assert sc.gpu_used_mib(lab, node, 0) >= 3000
    run_playbook(lab, node)
    assert not sc.alive(lab, node, record["pid"], record["start_time"])

    # The file, as the collector wants it: root's, 0644, in a directory made 0755.
    mode = lab.exec(node, "stat -c '%%u %%a' %s %s" % (TEXTFILE_DIR, METRICS_FILE)).stdout.split()
    assert mode == ["0", "755", "0", "644"], mode
    assert lab.exec(node, "ls -A %s" % TEXTFILE_DIR).stdout.split() == ["gpuops_reclaim.prom"]   # no temporary file left

    first = scrape(url)
    assert figure(first, "node_textfile_scrape_error") == 0
    mtimes = [value for (name, labels), value in first.items()
              if name == "node_textfile_mtime_seconds" and dict(labels).get("file", "").endswith("gpuops_reclaim.prom")]
    assert len(mtimes) == 1 and abs(mtimes[0] - time.time()) < 600, first
    assert figure(first, "gpuops_reclaim_last_run_success") == 1
    assert figure(first, "gpuops_reclaim_last_run_result", result="ok") == 1
    assert figure(first, "gpuops_reclaim_runs_total", result="ok") == 1
    assert figure(first, "gpuops_reclaim_ended_total", lever="signal") == 1
    assert figure(first, "gpuops_reclaim_last_run_ended", lever="signal") == 1
    assert figure(first, "gpuops_reclaim_ended_total", lever="unit") == 0
    assert figure(first, "gpuops_reclaim_gpus_freed_total") == 1
    assert figure(first, "gpuops_gpu_free", gpu="0") == 1
    assert figure(first, "gpuops_gpu_memory_unexplained_bytes", gpu="0") == 0
    assert figure(first, "gpuops_gpu_memory_unexplained_runs", gpu="0") == 0
    assert 0 < figure(first, "gpuops_reclaim_last_run_duration_seconds") < 600
    started = figure(first, "gpuops_reclaim_last_run_start_timestamp_seconds")
    assert abs(started - time.time()) < 600
    # Neither the server nor the health read exists in this run: nothing is made up for them.
    assert not [key for key in first if key[0].startswith(("gpuops_inference_server", "gpuops_gpu_health"))]

    # A second run with nothing to do: no counter goes back, the run is counted, nothing ended.
    run_playbook(lab, node)
    second = scrape(url)
    assert figure(second, "gpuops_reclaim_runs_total", result="ok") == 2
    assert figure(second, "gpuops_reclaim_last_run_ended", lever="signal") == 0
    assert figure(second, "gpuops_reclaim_last_run_gpus_freed") == 0
    assert figure(second, "gpuops_reclaim_last_run_start_timestamp_seconds") > started
    went_back = dict((key, (value, counters(second).get(key))) for key, value in counters(first).items()
                     if counters(second).get(key) is None or counters(second)[key] < value)
    assert not went_back, went_back
    assert figure(second, "gpuops_reclaim_ended_total", lever="signal") == 1


def test_a_leak_no_process_explains_counts_runs_in_a_row(lab, exporter):
    """Memory NVML reads used with no process holding it (fakegpu leak: a driver that never
    released a dead context's memory): each run fails naming it, and the runs in a row count up."""
    node, url = exporter
    lab.exec(node, "fakegpu leak --gpu 1 --mib 4000")
    seen = []
    for _ in range(2):
        tmp = tempfile.mkdtemp(prefix="metrics-play-")
        try:
            shutil.copy(lab.inventory, os.path.join(tmp, "inventory.ini"))
            run = subprocess.run(
                [os.path.join(VENV_BIN, "ansible-playbook"), PLAYBOOK, "-i", os.path.join(tmp, "inventory.ini"),
                 "-l", node, "-e", "gpus_free_release_timeout=1", "-e", "reclaim_summary_file=" + os.path.join(tmp, "s.json")],
                env=ansible_env(), capture_output=True, text=True, timeout=600, check=False)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        assert run.returncode != 0, run.stdout[-3000:]     # the GPU is not free: the run fails on this host
        seen.append(scrape(url))
    assert [figure(s, "gpuops_gpu_memory_unexplained_runs", gpu="1") for s in seen] == [1, 2]
    assert figure(seen[-1], "gpuops_gpu_memory_unexplained_bytes", gpu="1") == 4000 * 1024 * 1024
    assert figure(seen[-1], "gpuops_gpu_free", gpu="1") == 0
    assert figure(seen[-1], "gpuops_reclaim_last_run_success") == 0
    assert figure(seen[-1], "gpuops_reclaim_runs_total", result="reclaim_failed") == 2
