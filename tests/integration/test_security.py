"""Issue 22 on a lab node, with a real unprivileged user: alice (uid 1000 where free), who logs in
over SSH and whose user manager lingers, as on a shared GPU node. What she controls (files in
world-writable directories, a free port, her process titles and command lines) may describe
what she runs; it never blocks a reclaim, never passes for the server, never forges output.

- the host lock: she holds the old lock path and cannot reach the new one; gpu_reclaim runs;
- the squatter: she binds the server's port while a restart loads; the restart fails naming
  her PID and rolls back, the last good flags kept;
- the adoption of a hand-started server whose command line is over 128 KiB;
- the forged table line: her holder's title holds a newline and an ESC sequence.
(The reclaim timer's run lock: tests/integration/test_reclaim_timer.py.)
"""

import json
import os
import shlex
import shutil
import subprocess
import tempfile

import pytest

from . import scenarios as sc
from .conftest import VENV_BIN, ansible_env

RECLAIM = "gpuops.reclaim.gpu_reclaim"
FAST = {"term_timeout": 1.5, "release_timeout": 3, "nvml_timeout": 5}
OLD_LOCK = "/run/lock/gpuops-gpu-reclaim.lock"
LOCK = "/run/gpuops/gpu-reclaim.lock"


def flock_held(path):
    """Shell test: some process holds a flock on PATH (read from /proc/locks: looking takes nothing)."""
    return "ino=$(stat -c %%i %s 2>/dev/null) && grep -q \":$ino \" /proc/locks" % shlex.quote(path)


# --- item 3: the host lock -------------------------------------------------------------------------

def test_alice_can_neither_hold_nor_replace_the_host_lock_and_gpu_reclaim_runs(lab, node, alice):
    rec = sc.hold(lab, node, "lockvictim", "--gpu", "5:600")
    lab.exec(node, "rm -rf /run/gpuops")          # as after a boot: /run is a fresh tmpfs
    # What she could do before: hold the lock file in the world-writable /run/lock for ever.
    alice.exec("setsid -f flock %s sleep 600 </dev/null >/dev/null 2>&1" % OLD_LOCK)
    sc.wait_until(lab, node, flock_held(OLD_LOCK), "alice's flock(1) holds the old lock path")
    # The new one is out of her reach, whether root made it yet or not: she can neither make the
    # directory first, nor open (even read-only) the file in it, nor put a link there.
    for attempt in ("mkdir /run/gpuops", "flock -n %s true" % LOCK, "flock -n -s %s true" % LOCK,
                    "ln -s /tmp/mine %s" % LOCK):
        tried = alice.exec(attempt, check=False)
        assert tried.returncode != 0 and ("Permission denied" in tried.stderr or "No such file" in tried.stderr), \
            (attempt, tried.returncode, tried.stderr)

    result = lab.module(node, RECLAIM, dict(FAST, gpus=["5"], lock_timeout=2))

    assert not result.get("failed"), result.get("msg")
    assert result["free"] is True and not sc.alive(lab, node, rec["pid"], rec["start_time"])
    assert result["host_lock"] == {"path": LOCK, "waited_s": result["host_lock"]["waited_s"], "waited_for": None}
    assert result["host_lock"]["waited_s"] < 1, result["host_lock"]
    assert lab.exec(node, "stat -c '%U %a %F' /run/gpuops").stdout.split() == ["root", "700", "directory"]
    # Now that root made it, she still cannot enter it.
    for attempt in ("flock -n %s true" % LOCK, "ls /run/gpuops", "ln -s /tmp/mine /run/gpuops/x"):
        tried = alice.exec(attempt, check=False)
        assert tried.returncode != 0 and "Permission denied" in tried.stderr, (attempt, tried.stderr)


def test_a_lock_directory_that_is_not_roots_alone_fails_naming_it_and_signals_nothing(lab, node):
    rec = sc.hold(lab, node, "lockdir", "--gpu", "5:600")
    try:
        # As if it were made by someone else, or opened up: root-owned but group/world-enterable.
        lab.exec(node, "mkdir -p /run/gpuops && chmod 0755 /run/gpuops")
        result = lab.module(node, RECLAIM, dict(FAST, gpus=["5"], lock_timeout=2))
        assert result["failed"] is True
        assert result["msg"].startswith("the host lock /run/gpuops directory is owned by uid 0 with mode 0755 "
                                        "(it must be uid 0, mode 0700)"), result["msg"]
        assert "signalled nothing" in result["msg"] and result["actions"] == []
        assert sc.alive(lab, node, rec["pid"], rec["start_time"])
        # A link there is not followed.
        lab.exec(node, "rm -rf /run/gpuops && mkdir -p -m 0700 /root/elsewhere && ln -s /root/elsewhere /run/gpuops")
        result = lab.module(node, RECLAIM, dict(FAST, gpus=["5"], lock_timeout=2))
        assert result["msg"].startswith("the host lock /run/gpuops directory is a symbolic link"), result["msg"]
        assert lab.exec(node, "ls -A /root/elsewhere").stdout == ""
        assert sc.alive(lab, node, rec["pid"], rec["start_time"])
    finally:
        lab.exec(node, "rm -f /run/gpuops; rm -rf /root/elsewhere /run/gpuops", check=False)


# --- item 6: a holder's title cannot forge a line of the printed table -------------------------------

# alice's GPU job (the stand-in's context, made the way `fakegpu hold` makes it), which then names
# itself (prctl PR_SET_NAME: any bytes but NUL, 15 at most) with what argv[2] spells in escapes.
ALICE_HOLDER = r"""
import ctypes, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.realpath('/usr/local/bin/fakegpu')))
from fakegpulib import config
from fakegpulib.gpumem import Context
ctx = Context(6, config.gpu_by_index(config.load(), 6)["minor"], 500)
ctypes.CDLL(None).prctl(15, sys.argv[2].encode().decode('unicode_escape').encode('latin-1'), 0, 0, 0)
with open(sys.argv[1] + '.tmp', 'w') as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + '.tmp', sys.argv[1])
time.sleep(600)
"""
FORGED = "GPU 6: 0 free"


def alice_holder(lab, node, alice, title):
    """alice's holder of 500 MiB on GPU 6, titled `title` (Python escapes); returns its PID."""
    # The stand-in keeps its registry in root's directories; on a real node any user may take a GPU.
    lab.exec(node, "chmod 1777 /var/lib/fakegpu/alloc /var/lib/fakegpu/dead")
    lab.exec(node, "cat > /home/alice/holder.py <<'EOF'\n%s\nEOF\nchown alice: /home/alice/holder.py" % ALICE_HOLDER)
    alice.exec("rm -f ~/h.pid; setsid -f python3 ~/holder.py ~/h.pid %s </dev/null >~/h.log 2>&1" % shlex.quote(title))
    sc.wait_until(lab, node, "[ -s /home/alice/h.pid ]", "alice's GPU holder")
    return int(lab.exec(node, "cat /home/alice/h.pid").stdout)


def test_a_title_with_a_newline_and_an_esc_cannot_forge_a_line_of_the_printed_table(lab, node, clean_gpus, alice):
    pid = alice_holder(lab, node, alice, "x\\n" + FORGED)      # comm: 'x', newline, 'GPU 6: 0 free'
    assert lab.exec(node, "cat /proc/%d/comm" % pid).stdout == "x\n%s\n" % FORGED
    with tempfile.TemporaryDirectory(prefix="forge-") as tmp:
        play = os.path.join(tmp, "play.json")
        with open(play, "w") as f:
            json.dump([{"hosts": node, "gather_facts": False, "roles": [
                {"role": "gpuops.reclaim.gpus_free", "gpus_free_gpus": ["6"], "gpus_free_term_timeout": 2}]}], f)
        # The YAML result format (a common operator setting) prints a multi-line string as lines.
        env = dict(ansible_env(), ANSIBLE_CALLBACK_RESULT_FORMAT="yaml")
        run = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", lab.inventory, play],
                             env=env, capture_output=True, text=True, timeout=300, check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    lines = [line.strip().lstrip("- ").lstrip("'\"") for line in out.splitlines()]   # YAML may quote an item
    assert "GPU 6: 500/" in out, out                                   # the table was printed
    assert not [line for line in lines if line.startswith(FORGED)], out
    # Her title, escaped, is inside the table's one line for GPU 6 (whatever the escape's spelling).
    (row,) = [line for line in lines if line.startswith("GPU 6: 500/")]
    assert "x\\" in row and FORGED in row, row
    assert "\x1b" not in out
    # (An ESC sequence alone is written as \e by the YAML and JSON result formats themselves;
    # the table's own escaping of it is tested in tests/unit/plugins/filter/test_gpu_report.py.)


# --- item 4: a squatter on the port while the server loads ------------------------------------------

# alice's squatter: tries to bind the server's port every 50 ms until it is free (the old server
# stopped, the new one still loading), then answers 200 to every GET, /health included.
SQUATTER = r"""
import http.server, os, sys, time
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"max_total_num_tokens": 1}'
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
while True:
    try:
        server = http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), Answer)
        break
    except OSError:
        time.sleep(0.05)
with open(sys.argv[3] + '.tmp', 'w') as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[3] + '.tmp', sys.argv[3])
server.serve_forever()
"""


@pytest.fixture
def server_node(lab, node, clean_gpus):
    from .test_reclaim_playbook import GOOD_SERVER, SERVER_RESET, playbook_dir
    lab.exec(node, SERVER_RESET)
    tmp = playbook_dir(lab, {node: GOOD_SERVER})
    yield node, tmp, GOOD_SERVER
    lab.exec(node, SERVER_RESET, check=False)
    shutil.rmtree(tmp, ignore_errors=True)


def test_a_squatter_on_the_port_fails_the_restart_naming_its_pid_and_the_rollback_runs(lab, server_node, alice):
    from .test_reclaim_playbook import run_playbook, write_host_vars
    node, tmp, server = server_node
    run, summary = run_playbook(tmp, [node])
    assert run.returncode == 0, run.stdout + run.stderr
    last_good = "/etc/gpuops/sglang.last-good.json"
    assert sc.read_json(lab, node, last_good)["flags"]["mem_fraction_static"] == 0.8

    ip = lab.status()[node]["ip"]
    lab.exec(node, "cat > /home/alice/squat.py <<'EOF'\n%s\nEOF\nchown alice: /home/alice/squat.py" % SQUATTER)
    alice.exec("rm -f ~/squat.pid; setsid -f python3 ~/squat.py %s 30000 ~/squat.pid </dev/null >~/squat.log 2>&1" % ip)
    # New flags, and a server that loads for a while (the port stays closed meanwhile, as SGLang's).
    write_host_vars(tmp, node, dict(server, inference_service_env={"FAKESERVE_LOAD_SECONDS": "20"},
                                    inference_service_flags=dict(server["inference_service_flags"],
                                                                 mem_fraction_static=0.7)))
    run, summary = run_playbook(tmp, [node])
    out = run.stdout + run.stderr

    squatter = int(lab.exec(node, "cat /home/alice/squat.pid").stdout)
    assert lab.exec(node, "stat -c %%U /proc/%d" % squatter).stdout.strip() == "alice"
    assert run.returncode != 0, out
    failure = summary["hosts"][node]["failure"]["msg"]
    assert "is held by PID %d (uid %d, " % (squatter, alice.uid) in failure, failure
    assert "not by sglang.service" in failure, failure
    # The rollback ran: the last good unit was put back (and failed on the same squatter).
    assert "ROLLBACK to /etc/gpuops/sglang.last-good.service failed too" in failure, failure
    assert "--mem-fraction-static 0.8" in lab.exec(node, "cat /etc/systemd/system/sglang.service").stdout
    # The squatter's answers were never taken for the server's: the new flags were not kept.
    assert sc.read_json(lab, node, last_good)["flags"]["mem_fraction_static"] == 0.8
    assert lab.exec(node, "kill -0 %d" % squatter, check=False).returncode == 0, "alice's process is not ours to stop"


# --- item 5: adoption passes no command line through a shell ----------------------------------------

# A server started by hand whose command line is over 128 KiB (a long prompt template or a
# model list in its flags): the kernel takes it in argv, 1,500 words of 100 bytes; one
# argument (a `sh -c` line holding it) may not exceed 128 KiB (MAX_ARG_STRLEN).
BIG_LISTENER = ("import socket, sys, time\n"
                "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                "s.bind((sys.argv[1], 30000)); s.listen()\n"
                "open('/run/gpuops-t/big.pid', 'w').write(str(__import__('os').getpid()))\n"
                "time.sleep(600)\n")


def test_adopting_a_hand_started_server_with_a_command_line_over_128_kib(lab, server_node):
    from .test_reclaim_playbook import run_playbook
    node, tmp, _server = server_node
    ip = lab.status()[node]["ip"]
    lab.exec(node, "mkdir -p /run/gpuops-t && rm -f /run/gpuops-t/big.pid && setsid -f python3 -c %s %s "
                   "-m sglang.launch_server --chat-template $(seq -f '%%0100g' 1500) </dev/null >/dev/null 2>&1"
             % (shlex.quote(BIG_LISTENER), ip))
    sc.wait_until(lab, node, "[ -s /run/gpuops-t/big.pid ]", "the hand-started listener")
    pid = int(lab.exec(node, "cat /run/gpuops-t/big.pid").stdout)
    size = int(lab.exec(node, "wc -c < /proc/%d/cmdline" % pid).stdout)
    assert size > 128 * 1024, size
    start_time = sc.identity(lab, node, pid)[0]

    try:
        run, summary = run_playbook(tmp, [node])
    finally:
        if sc.alive(lab, node, pid, start_time):       # the test's own listener, when adoption failed
            lab.exec(node, "kill -9 %d" % pid, check=False)
    out = run.stdout + run.stderr

    assert run.returncode == 0, out[-6000:]
    assert summary["hosts"][node]["status"] == "ok", summary["hosts"][node]
    assert "adopting PID %d (python3 -c import socket" % pid in out, out[-6000:]
    assert "adopted " in out and "sglang-adopted-" in out, out[-6000:]
    assert not sc.alive(lab, node, pid, start_time), "the adopted server still runs"
    assert lab.exec(node, "systemctl is-active sglang.service").stdout.strip() == "active"
