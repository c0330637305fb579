"""The `lab` fixture: real systemd-nspawn hosts for the integration tests.

LAB_NODES (default 2) sets how many nodes; nodes already up in that number are reused.
LAB_KEEP=1 leaves them running after the session (then `tests/lab/lab down`).
Under pytest-xdist (-n N) each worker gets a private lab of its own (worker_lab.py).
"""

import json
import os
import subprocess
import tempfile

import pytest

from . import scenarios, worker_lab

# Before any test module reads LAB_STATE, LAB_RUN, LAB_ADDR_BASE or LAB2_* (at import).
try:
    os.environ.update(worker_lab.worker_env(os.environ))
except worker_lab.WorkerLabError as exc:
    raise pytest.UsageError(str(exc)) from None

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = os.path.join(REPO, "tests", "lab", "lab")
VENV_BIN = os.path.join(REPO, ".venv", "bin")


class NodeCommandError(subprocess.CalledProcessError):
    """A node command failed; the message carries its output so the test report shows it."""

    def __str__(self):
        return f"{super().__str__()}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


class Lab:
    """Handle on the running lab nodes."""

    def __init__(self, nodes, inventory, gpus):
        self.nodes = nodes
        self.inventory = inventory
        self.gpus = gpus

    def status(self):
        """Parsed `lab status`: node name -> the record's columns."""
        out = subprocess.run([LAB, "status"], capture_output=True, text=True, check=True).stdout
        rows = {}
        for line in out.splitlines():
            cols = line.split("\t")
            if len(cols) >= 5:
                rows[cols[0]] = {"ip": cols[1], "state": cols[3], "tools": cols[4].removeprefix("tools: ").split(",")}
        return rows

    def has_fakegpu(self, node):
        return "fakegpu" in self.status().get(node, {}).get("tools", [])

    def exec(self, node, cmd, check=True, timeout=60):
        """Run a shell command line on a node through `lab exec`; text-mode result."""
        result = subprocess.run([LAB, "exec", node, cmd], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise NodeCommandError(result.returncode, f"lab exec {node} {cmd}", result.stdout, result.stderr)
        return result

    def module(self, node, fqcn, args, check_mode=False, timeout=300, task_vars=None):
        """Run one Ansible module on a node over the lab's SSH inventory; return its result dict.

        A failed module comes back as its result (with failed=True), not as an exception;
        only a broken Ansible run (no result at all) raises. `task_vars` go on the task
        (e.g. {"ansible_user": "lab"} to run it as another user than root).
        """
        with tempfile.TemporaryDirectory(prefix="lab-module-") as tmp:
            result_path = os.path.join(tmp, "result.json")
            # JSON is YAML: the play is written as JSON so args need no YAML quoting.
            play = [{
                "hosts": node,
                "gather_facts": False,
                "tasks": [
                    dict({"name": "module under test", fqcn: args, "register": "lab_result",
                          "check_mode": check_mode, "ignore_errors": True, "ignore_unreachable": True},
                         **({"vars": task_vars} if task_vars else {})),
                    {"name": "hand the result to the test",
                     "ansible.builtin.copy": {"content": "{{ lab_result | to_json }}", "dest": result_path},
                     "delegate_to": "localhost", "check_mode": False},
                ],
            }]
            playbook = os.path.join(tmp, "play.json")
            with open(playbook, "w") as f:
                json.dump(play, f)
            run = subprocess.run(
                [os.path.join(VENV_BIN, "ansible-playbook"), "-i", self.inventory, playbook],
                env=ansible_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False,
            )
            if not os.path.exists(result_path):
                raise AssertionError(
                    f"ansible-playbook gave no result for {fqcn} on {node} (rc {run.returncode}):\n"
                    f"{run.stdout}\n{run.stderr}")
            with open(result_path) as f:
                return json.load(f)

    def reset_gpus(self, node):
        """Stop GPU-holding services, kill every holder, reset the stand-in (tests/lab/node/lab-reset-gpus)."""
        return json.loads(self.exec(node, f"lab-reset-gpus --gpus {self.gpus}", timeout=180).stdout)


def ansible_env():
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_CONFIG"] = os.path.join(REPO, "ansible.cfg")
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(REPO, ".build", "collections")
    env.setdefault("ANSIBLE_DEPRECATION_WARNINGS", "False")
    return env


def lab_node_count():
    raw = os.environ.get("LAB_NODES", "2")
    if not raw.isdigit() or int(raw) < 1:
        raise pytest.UsageError(f"LAB_NODES must be a whole number >= 1, got '{raw}'")
    return int(raw)


def lab_up(count):
    """`lab up` (reuses nodes already up in this number); returns the inventory path."""
    up = subprocess.run([LAB, "up", str(count)], capture_output=True, text=True, timeout=900, check=False)
    if up.returncode != 0:
        raise AssertionError(f"lab up {count} failed (rc {up.returncode}):\n{up.stdout}\n{up.stderr}")
    return up.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def lab():
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (it mounts overlays and boots systemd-nspawn containers)")
    if not os.path.exists(os.path.join(VENV_BIN, "ansible-playbook")):
        pytest.skip(f"no {VENV_BIN}/ansible-playbook: run 'make venv'")
    count = lab_node_count()
    inventory = lab_up(count)
    handle = Lab([f"node{i}" for i in range(1, count + 1)], inventory, gpus=8)
    yield handle
    if os.environ.get("LAB_KEEP") != "1":
        subprocess.run([LAB, "down"], check=True, timeout=300)


@pytest.fixture
def clean_gpus(lab):
    """Every node's stand-in GPUs idle and unconfigured before the test."""
    missing = [n for n in lab.nodes if not lab.has_fakegpu(n)]
    if missing:
        pytest.skip(f"stand-in GPU driver not installed on {', '.join(missing)}: "
                    "tests/fakegpu (libnvidia-ml.so.1, fakegpu, nvidia-smi) not built yet")
    for node in lab.nodes:
        lab.reset_gpus(node)
    return lab


@pytest.fixture
def node(lab):
    """The last lab node, with every scenario of tests/integration/scenarios.py ended before
    and after the test."""
    name = lab.nodes[-1]
    if not lab.has_fakegpu(name):
        pytest.skip("stand-in GPU driver not installed on %s: tests/fakegpu not built" % name)
    scenarios.cleanup(lab, name)
    yield name
    scenarios.cleanup(lab, name)


ALICE = "alice"


class User:
    """A real unprivileged user of a lab node who logs in over SSH with the lab key."""

    def __init__(self, lab, node, name, uid):
        self.lab, self.node, self.name, self.uid = lab, node, name, uid

    def exec(self, cmd, check=True, timeout=60):
        """Run a shell command line as this user over SSH (a logind session of theirs)."""
        ip = self.lab.status()[self.node]["ip"]
        key = os.path.join(os.environ.get("LAB_STATE", "/var/lib/gpuops-lab"), "ssh", "id_ed25519")
        argv = ["ssh", "-i", key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
                "%s@%s" % (self.name, ip), cmd]
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise NodeCommandError(result.returncode, "as %s on %s: %s" % (self.name, self.node, cmd),
                                   result.stdout, result.stderr)
        return result


@pytest.fixture
def alice(lab, node):
    """alice (uid 1000 where it is free), an unprivileged user of the node with a lingering user
    manager (user@UID.service, Delegate=yes), as on a shared GPU node. Everything of hers is
    killed after the test."""
    lab.exec(node, (
        "id -u {u} >/dev/null 2>&1 || {{ if getent passwd 1000 >/dev/null; then useradd -m -s /bin/bash {u}; "
        "else useradd -m -u 1000 -s /bin/bash {u}; fi; }}; "
        "install -d -m 700 -o {u} -g {u} /home/{u}/.ssh && "
        "install -m 600 -o {u} -g {u} /root/.ssh/authorized_keys /home/{u}/.ssh/authorized_keys && "
        "loginctl enable-linger {u}").format(u=ALICE))
    uid = int(lab.exec(node, "id -u %s" % ALICE).stdout)
    assert uid != 0
    scenarios.wait_until(lab, node, "systemctl is-active -q user@%d.service" % uid, "alice's user manager")
    user = User(lab, node, ALICE, uid)
    yield user
    # Her linger off and her sessions ended, so that nothing of hers (user manager included)
    # outlives the test; the next test's fixture turns linger on again.
    lab.exec(node, "loginctl disable-linger {u}; loginctl terminate-user {u}; pkill -KILL -u {u}; true"
             .format(u=ALICE), check=False)
    # logind too must be done with her (no user record, so no user@ or user-runtime-dir@ stop still
    # under way): another fixture's `enable-linger` right after (test_trust_boundary's, on the same
    # node under pytest-xdist) then starts a fresh manager instead of meeting this one's stop.
    scenarios.wait_until(lab, node, "! pgrep -u %d >/dev/null && ! loginctl show-user %d >/dev/null 2>&1" % (uid, uid),
                         "every process of alice gone and logind done with her")
    # Her manager killed above ends 'failed': forget it, so that the node is not left degraded
    # (test_lab's boot check) and the next enable-linger starts a manager from a clean unit (the
    # final CI at c16706d: alice's manager did not come up within 30 s for the next 5 tests there).
    lab.exec(node, "systemctl reset-failed user@%d.service user-runtime-dir@%d.service >/dev/null 2>&1; true"
             % (uid, uid), check=False)


# The plain lab's longest tests, started first so that under pytest-xdist no worker begins one
# of them last while the others sit idle (issue 31). From the stage's --durations in the first
# concurrent make test (3 workers, load 15-23): 516 s, 203 s, 177 s, 173 s, 145 s, 133 s, 126 s,
# 111 s; the rest took at most 108 s. The server soak (issue 30 item 8) came later: 309 s in a
# single run at its default SERVER_SOAK_N=10 (-p no:xdist, one other soak beside it and three
# other helpers' labs on the 2-core host, 2026-12-07). Only the order changes.
LONG_FIRST = (
    "test_reclaim_randomised.py::test_random_holders_end_exactly_the_unprotected_ones_on_the_selected_gpus",
    "test_soak.py::test_server_shapes_no_needless_restart_no_stall_left_no_wrong_kill",
    "test_security.py::test_a_squatter_on_the_port_fails_the_restart_naming_its_pid_and_the_rollback_runs",
    "test_reclaim_playbook.py::test_a_converged_server_host_records_both_reclaims_and_a_drift_check_reads_changed",
    "test_reclaim_timer.py::test_timer_fires_and_frees_a_wedged_host_and_a_locked_run_changes_nothing",
    "test_security.py::test_adopting_a_hand_started_server_with_a_command_line_over_128_kib",
    "test_gpu_reclaim.py::test_traced_holder_gets_sigkill_at_once_and_the_failure_names_its_tracer",
    "test_node_prerequisites.py::test_prepare_nodes_playbook_makes_the_modules_read_nvml_through_the_venv",
    "test_soak.py::test_random_owner_shapes_no_wrong_kill_no_early_free_no_unfreed_gpu",
)


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.nodeid.rsplit("/", 1)[-1].split("[", 1)[0]
        return LONG_FIRST.index(name) if name in LONG_FIRST else len(LONG_FIRST)
    items.sort(key=rank)   # stable: every other test keeps its place
