"""gpuops.reclaim.gpu_reclaim run for real (Ansible over SSH) on a lab node with wedged GPUs.

Each scenario ends with the GPUs free (or the module failing as it should) and the actions
the ladder took; processes that must survive are checked by PID and start time.
"""

import shlex

import pytest

from . import scenarios as sc

FQCN = "gpuops.reclaim.gpu_reclaim"
# Short ladder: a holder that ignores SIGTERM costs term_timeout; nothing else waits on it.
FAST = {"term_timeout": 1.5, "release_timeout": 5, "nvml_timeout": 5}


def reclaim(lab, node, check_mode=False, **args):
    return lab.module(node, FQCN, dict(FAST, **args), check_mode=check_mode)


def ok(result):
    assert not result.get("failed"), result.get("msg", result)
    return result


def steps(result, step):
    return [a for a in result["actions"] if a["step"] == step]


def signalled(result, step):
    return {a["pid"] for a in steps(result, step) if a["changed"]}


def assert_all_free(lab, node, result, gpus):
    assert result["free"] is True
    after = {g["index"]: g for g in result["after"]}
    for index in gpus:
        assert after[index]["free"] is True, after[index]
        assert after[index]["holders"] == []
        assert sc.gpu_used_mib(lab, node, index) == 0, "GPU %d still used per the stand-in" % index


def test_tp8_orphans_after_parent_sigkill(lab, node):
    children = []
    for rank in range(1, 8):
        children += ["--child", "%d:2000:sglang::scheduler_TP%d" % (rank, rank)]
    rec = sc.hold(lab, node, "tp8", "--gpu", "0:2000", *children)
    sc.kill9_and_wait_reaped(lab, node, rec["pid"])
    orphans = rec["spawned"]
    assert len(orphans) == 7
    for rank in range(1, 8):
        assert sc.gpu_used_mib(lab, node, rank) == 2000

    result = ok(reclaim(lab, node))

    assert result["changed"] is True
    assert {b["index"] for b in result["before"] if not b["free"]} == set(range(1, 8))
    assert signalled(result, "sigterm") == set(orphans)
    assert all(a["code"] == "exited" for a in steps(result, "sigterm")), result["actions"]
    assert not steps(result, "sigkill"), "orphans exit on SIGTERM: no SIGKILL needed"
    assert_all_free(lab, node, result, range(8))
    for proc in rec["processes"]:
        assert not sc.alive(lab, node, proc["pid"], proc["start_time"])


def test_sigterm_ignored_then_sigkill(lab, node):
    rec = sc.hold(lab, node, "noterm", "--gpu", "2:1000", "--ignore-term")
    seen = lab.module(node, "gpuops.reclaim.gpu_holders", {"gpus": ["2"]})
    assert [h["ignores_sigterm"] for h in seen["holders"] if h["pid"] == rec["pid"]] == [True]

    result = ok(reclaim(lab, node, gpus=["2"]))

    order = [(a["step"], a["code"]) for a in result["actions"] if a.get("pid") == rec["pid"]]
    assert [step for step, _unused in order] == ["sigterm", "sigkill"], result["actions"]
    assert order[0][1] == "sent_futile", order
    assert order[1][1] == "exited", order
    term, kill = steps(result, "sigterm")[0], steps(result, "sigkill")[0]
    assert kill["at_s"] >= term["at_s"]
    assert not sc.alive(lab, node, rec["pid"], rec["start_time"])
    assert_all_free(lab, node, result, [2])


def test_namespace_init_without_a_sigterm_handler_gets_sigkill_at_once(lab, node):
    # Issue 32 item 7 (an H100): the kernel drops SIGTERM to a PID namespace's init that has no
    # handler (fakegpu hold is Python: none); before, the ladder waited term_timeout for nothing.
    rec = sc.hold(lab, node, "nsinit", "--gpu", "2:1000", wrap="unshare --pid --fork")
    assert rec["ns_pid"] == 1, rec
    seen = lab.module(node, "gpuops.reclaim.gpu_holders", {"gpus": ["2"]})
    assert [h["sigterm_dropped"] for h in seen["holders"] if h["pid"] == rec["pid"]] == [True]

    result = ok(reclaim(lab, node, gpus=["2"], term_timeout=10))

    order = [(a["step"], a["code"]) for a in result["actions"] if a.get("pid") == rec["pid"]]
    assert order == [("sigterm", "sent_futile"), ("sigkill", "exited")], result["actions"]
    term, kill = steps(result, "sigterm")[0], steps(result, "sigkill")[0]
    assert kill["at_s"] - term["at_s"] < 2.0, "no term_timeout (10 s) waited: %s" % result["actions"]
    assert not sc.alive(lab, node, rec["pid"], rec["start_time"])
    assert_all_free(lab, node, result, [2])


@pytest.mark.parametrize("title", ["sshd-helper", "[kworker/0:2]"])
def test_misleading_name_still_reclaimed(lab, node, title):
    rec = sc.hold(lab, node, "misleading", "--gpu", "3:800", "--title", title)

    result = ok(reclaim(lab, node, gpus=["3"]))

    assert rec["pid"] in signalled(result, "sigterm")
    assert not sc.alive(lab, node, rec["pid"], rec["start_time"])
    assert_all_free(lab, node, result, [3])


def test_restart_always_unit_is_stopped(lab, node):
    rec = sc.start_unit(lab, node, "--gpu", "4:600")

    result = ok(reclaim(lab, node, gpus=["4"]))

    stops = steps(result, "stop_unit")
    assert [a["unit"] for a in stops] == ["gpuhog.service"], result["actions"]
    assert stops[0]["result"].startswith("stopped in ") and stops[0]["changed"] is True, stops
    assert sc.unit_state(lab, node) in ("inactive", "failed")
    assert not sc.alive(lab, node, rec["pid"], rec["start_time"])
    # Nothing came back from Restart=always: no process holds GPU 4 now.
    assert_all_free(lab, node, result, [4])
    listed = lab.module(node, "gpuops.reclaim.gpu_holders", {"gpus": ["4"]})
    assert listed["holders"] == []


def test_inherited_handles_of_dead_owner_freed(lab, node):
    rec = sc.hold(lab, node, "forkinh", "--gpu", "5:700", "--fork-inherit")
    (child,) = rec["forked"]
    child_start = [p["start_time"] for p in rec["processes"] if p["pid"] == child][0]
    sc.kill9_and_wait_reaped(lab, node, rec["pid"])
    assert sc.gpu_used_mib(lab, node, 5) == 700

    result = ok(reclaim(lab, node, gpus=["5"]))

    assert child in signalled(result, "sigterm") | signalled(result, "sigkill")
    assert rec["pid"] not in {a.get("pid") for a in result["actions"]}, "the dead PID NVML lists is never signalled"
    assert not sc.alive(lab, node, child, child_start)
    assert_all_free(lab, node, result, [5])


def test_a_dead_parents_pid_reused_by_a_holder_of_another_gpu_is_never_signalled(lab, node):
    # NVML goes on listing the dead parent's PID on GPU 5 while its forked child keeps the
    # context; a holder of GPU 4 is born with that PID. It holds no node of GPU 5: the reclaim
    # of GPU 5 ends the child and leaves the holder of GPU 4 alone. The parent is a worker, not
    # its session's leader (the kernel keeps a leader's PID while its session lives).
    rec = sc.hold(lab, node, "forkinh3", "--gpu", "5:700", "--fork-inherit",
                  wrap="python3 -c 'import subprocess, sys; subprocess.call(sys.argv[1:])'")
    (child,) = rec["forked"]
    child_start = [p["start_time"] for p in rec["processes"] if p["pid"] == child][0]
    sc.kill9_and_wait_reaped(lab, node, rec["pid"])
    reuser = sc.hold_with_pid(lab, node, "reuser", rec["pid"], "--gpu", "4:500")
    assert reuser["pid"] == rec["pid"]

    result = ok(reclaim(lab, node, gpus=["5"]))

    assert rec["pid"] not in signalled(result, "sigterm") | signalled(result, "sigkill")
    assert sc.alive(lab, node, reuser["pid"], reuser["start_time"])
    assert not sc.alive(lab, node, child, child_start)
    assert_all_free(lab, node, result, [5])
    assert sc.gpu_used_mib(lab, node, 4) == 500


def test_a_live_parent_is_ended_first_and_the_rescan_finds_its_inheriting_child(lab, node):
    # NVML charges the memory to the live parent, so the first survey reads only the PIDs NVML
    # lists and cannot see the child; once the parent is gone NVML charges a dead PID, and the
    # rescan must read every process to find the child that keeps the context.
    rec = sc.hold(lab, node, "forkinh2", "--gpu", "6:700", "--fork-inherit")
    (child,) = rec["forked"]
    child_start = [p["start_time"] for p in rec["processes"] if p["pid"] == child][0]

    result = ok(reclaim(lab, node, gpus=["6"]))

    assert [h["pid"] for h in result["holders"]] == [rec["pid"]], "the first survey saw NVML's PID only"
    ended = signalled(result, "sigterm") | signalled(result, "sigkill")
    assert {rec["pid"], child} <= ended
    assert "rescan" in [a["step"] for a in result["actions"]]
    assert not sc.alive(lab, node, child, child_start)
    assert_all_free(lab, node, result, [6])


def test_protected_and_unselected_untouched(lab, node):
    # nvidia-persistenced as on a real host: the GPU's device node open, no context.
    sc.start_in_scope(lab, node, "persistenced", "bash -c %s" % sc.shlex.quote(
        "exec -a nvidia-persistenced python3 -c \"import os, time; f = os.open('/dev/nvidia1', os.O_RDWR); "
        "open('/run/gpuops-t/persistenced.pid', 'w').write(str(os.getpid())); time.sleep(600)\""))
    sc.wait_until(lab, node, "[ -s /run/gpuops-t/persistenced.pid ]", "nvidia-persistenced stand-in")
    pers_pid = int(lab.exec(node, "cat /run/gpuops-t/persistenced.pid").stdout)
    pers_start = sc.identity(lab, node, pers_pid)[0]
    victim = sc.hold(lab, node, "victim", "--gpu", "1:900")
    other = sc.hold(lab, node, "other", "--gpu", "6:900")

    result = ok(reclaim(lab, node, gpus=["1"]))

    assert signalled(result, "sigterm") == {victim["pid"]}
    touched = {a.get("pid") for a in result["actions"]}
    assert pers_pid not in touched and other["pid"] not in touched
    assert sc.alive(lab, node, pers_pid, pers_start), "nvidia-persistenced was killed"
    assert sc.alive(lab, node, other["pid"], other["start_time"]), "holder of unselected GPU 6 was killed"
    assert not sc.alive(lab, node, victim["pid"], victim["start_time"])
    assert sc.gpu_used_mib(lab, node, 6) == 900
    assert [g["index"] for g in result["after"]] == [1]
    assert_all_free(lab, node, result, [1])


def test_protected_context_on_same_gpu_survives_and_is_reported(lab, node):
    hostengine = sc.hold(lab, node, "hostengine", "--gpu", "1:1000", "--title", "nv-hostengine")
    persistenced = sc.hold(lab, node, "persistenced", "--gpu", "1:100", "--title", "nvidia-persistenced")
    victim = sc.hold(lab, node, "victim", "--gpu", "1:900")

    result = reclaim(lab, node, gpus=["1"])

    assert signalled(result, "sigterm") == {victim["pid"]}
    assert not sc.alive(lab, node, victim["pid"], victim["start_time"])
    for keep in (hostengine, persistenced):
        assert keep["pid"] not in {a.get("pid") for a in result["actions"]}
        assert sc.alive(lab, node, keep["pid"], keep["start_time"])
    # Their contexts keep GPU 1 held: the task fails and says who and why.
    assert result.get("failed") is True
    left = {h["pid"]: h for h in result["remaining"]}
    assert left[hostengine["pid"]]["reason"].startswith("protected")
    assert left[persistenced["pid"]]["reason"].startswith("protected")
    msg = result["msg"]
    assert "GPU 1" in msg and "1100 MiB" in msg and "PID %d" % hostengine["pid"] in msg and "protected" in msg, msg


def test_check_mode_plans_and_sends_nothing(lab, node):
    rec = sc.hold(lab, node, "tp", "--gpu", "0:500", "--child", "1:500:sglang::scheduler_TP1", "--ignore-term")
    unit = sc.start_unit(lab, node, "--gpu", "2:300")
    everyone = [(rec["pid"], rec["start_time"]), (unit["pid"], unit["start_time"])] + [
        (p["pid"], p["start_time"]) for p in rec["processes"]]

    result = ok(reclaim(lab, node, check_mode=True))

    assert result["changed"] is True
    assert {a["code"].split("_")[0] for a in result["actions"]} == {"would"}, result["actions"]
    assert all(a["changed"] for a in result["actions"]), result["actions"]
    assert {a["pid"] for a in steps(result, "sigterm")} == {pid for pid, _unused in everyone}
    assert [a["unit"] for a in steps(result, "stop_unit")] == ["gpuhog.service"]
    for pid, start in everyone:
        assert sc.alive(lab, node, pid, start), "PID %d signalled in check mode" % pid
    assert sc.unit_state(lab, node) == "active"
    assert sc.gpu_used_mib(lab, node, 0) == 500


def test_leak_without_allow_reset_fails_actionably(lab, node):
    lab.exec(node, "fakegpu leak --gpu 7 --mib 3072")

    result = reclaim(lab, node, gpus=["7"])

    assert result.get("failed") is True
    msg = result["msg"]
    assert "GPU 7" in msg and "3072 MiB" in msg and "reset or reboot" in msg, msg
    assert not steps(result, "reset")
    assert sc.gpu_used_mib(lab, node, 7) == 3072


def test_leak_with_allow_reset_frees(lab, node):
    lab.exec(node, "fakegpu leak --gpu 7 --mib 3072")

    result = ok(reclaim(lab, node, gpus=["7"], allow_reset=True))

    assert result["changed"] is True
    assert [(a["gpu"], a["result"]) for a in steps(result, "reset")] == [(7, "ok")], result["actions"]
    assert_all_free(lab, node, result, [7])


def test_hung_nvml_fails_before_any_signal(lab, node):
    rec = sc.hold(lab, node, "hung", "--gpu", "2:500")
    lab.exec(node, "fakegpu hang --calls all --seconds 60")

    result = reclaim(lab, node, nvml_timeout=2)

    assert result.get("failed") is True
    assert "nvml_timeout" in result["msg"] and "no process was signalled" in result["msg"], result["msg"]
    assert sc.alive(lab, node, rec["pid"], rec["start_time"])


def test_second_run_on_free_host_changes_nothing(lab, node):
    sc.hold(lab, node, "once", "--gpu", "3:500")
    first = ok(reclaim(lab, node))
    assert first["changed"] is True

    second = ok(reclaim(lab, node))

    assert second["changed"] is False
    assert second["actions"] == []
    assert second["free"] is True


def test_match_filter_only_signals_matching(lab, node):
    sglang = sc.hold(lab, node, "sglang", "--gpu", "0:500", "--title", "sglang::scheduler_TP0")
    notebook = sc.hold(lab, node, "notebook", "--gpu", "0:400", "--title", "jupyter-kernel")

    result = reclaim(lab, node, gpus=["0"], match=["^sglang::"])

    assert signalled(result, "sigterm") == {sglang["pid"]}
    assert notebook["pid"] not in {a.get("pid") for a in result["actions"]}
    assert sc.alive(lab, node, notebook["pid"], notebook["start_time"])
    assert not sc.alive(lab, node, sglang["pid"], sglang["start_time"])
    left = {h["pid"]: h for h in result["remaining"]}
    assert left[notebook["pid"]]["reason_code"] == "unmatched"
    # GPU 0 is still held by the notebook, so the task fails and says why.
    assert result.get("failed") is True
    assert "match" in result["msg"]


def test_disk_sleep_holder_killed(lab, node):
    pid = sc.start_d_state(lab, node, gpu=4, mib=600)

    # A vfork() parent sleeps killably: D in /proc, but a fatal signal ends it. The vfork
    # child shares its mappings and fds, so it holds GPU 4 too and must go as well.
    result = ok(reclaim(lab, node, gpus=["4"]))

    assert pid in signalled(result, "sigterm") | signalled(result, "sigkill")
    assert_all_free(lab, node, result, [4])


def test_zombie_leader_with_live_thread_reclaimed(lab, node):
    pid = sc.start_zombie_leader(lab, node, gpu=3, mib=800)

    # The thread group still runs and holds the context; SIGKILL to the PID ends the group.
    result = reclaim(lab, node, gpus=["3"])

    assert not result.get("failed"), result.get("msg")
    assert pid in signalled(result, "sigterm") | signalled(result, "sigkill")
    assert_all_free(lab, node, result, [3])


def main_pid(lab, node, unit=sc.UNIT):
    return int(lab.exec(node, "systemctl show -p MainPID --value %s.service" % unit).stdout)


def test_spared_unit_keeps_running_while_its_stray_is_freed(lab, node):
    server = sc.start_unit(lab, node, "--gpu", "0:600")
    stray = sc.hold(lab, node, "stray", "--gpu", "0:400")
    server_pid = main_pid(lab, node)
    assert server_pid == server["pid"]
    listed = lab.module(node, "gpuops.reclaim.gpu_holders", {"gpus": ["0"]})

    result = ok(reclaim(lab, node, gpus=["0"], spare_units=["gpuhog.service"]))

    assert result["free"] is True and result["changed"] is True
    assert signalled(result, "sigterm") == {stray["pid"]}
    assert server["pid"] not in {a.get("pid") for a in result["actions"]}
    assert not steps(result, "stop_unit"), result["actions"]
    assert not sc.alive(lab, node, stray["pid"], stray["start_time"])
    assert main_pid(lab, node) == server_pid and sc.unit_state(lab, node) == "active"
    assert sc.alive(lab, node, server["pid"], server["start_time"])
    assert [(h["pid"], h["unit"]) for h in result["spared"]] == [(server["pid"], "gpuhog.service")]
    assert result["remaining"] == []
    # The server's 600 MiB stay; only the stray's 400 came back.
    assert sc.gpu_used_mib(lab, node, 0) == 600
    assert result["after"][0]["holders"] == [server["pid"]] and result["after"][0]["free"] is True
    # The first survey's holders, as gpu_holders lists them: no second survey needed to decide.
    assert [(h["pid"], h["start_time"]) for h in result["holders"]] == [
        (h["pid"], h["start_time"]) for h in listed["holders"]]


def test_exclude_leaves_gpus_out_and_their_holders_untouched(lab, node):
    victim = sc.hold(lab, node, "victim", "--gpu", "1:500")
    kept = sc.hold(lab, node, "kept", "--gpu", "2:500")

    result = ok(reclaim(lab, node, exclude=["2"]))

    assert 2 not in [g["index"] for g in result["before"] + result["after"]]
    assert [h["pid"] for h in result["holders"]] == [victim["pid"]]
    assert signalled(result, "sigterm") == {victim["pid"]}
    assert sc.alive(lab, node, kept["pid"], kept["start_time"])
    assert sc.gpu_used_mib(lab, node, 2) == 500
    assert_all_free(lab, node, result, [g for g in range(lab.gpus) if g != 2])


# --- issue 10: respawning loops, stopped holders, fail fast ----------------------------------

HOLD_GPU0 = "fakegpu hold --gpu 0:500 --title respawned-holder"
LOOPS = {
    # A shell loop and a Python supervisor, outside systemd, respawning the holder every 0.2 s.
    "bash": "bash -c %s" % shlex.quote(
        "echo $$ > /run/gpuops-t/loop.pid; while true; do %s; sleep 0.2; done" % HOLD_GPU0),
    "python": "python3 -c %s" % shlex.quote(
        "import os, subprocess, time\n"
        "open('/run/gpuops-t/loop.pid', 'w').write(str(os.getpid()))\n"
        "while True:\n"
        "    subprocess.call(%r, shell=False)\n"
        "    time.sleep(0.2)\n" % HOLD_GPU0.split()),
}


def gpu0_used(lab, node):
    return sc.gpu_used_mib(lab, node, 0)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_respawning_loop_is_ended_never_free_while_it_lives(lab, node, loop):
    name = "loop-%s" % loop
    loop_pid, loop_start = start_shape(lab, node, name, LOOPS[loop])

    result = reclaim(lab, node, gpus=["0"], term_timeout=5)

    # The loop is no protected process and holds nothing itself: it is made the target.
    respawner_ended(lab, node, result, loop_pid, loop_start, "the parent becomes the target")
    # Stays free: nothing is left that could bring a holder back. The loop's scope (every
    # process the loop started, and the loop) is empty, so it is gone (it was made --collect).
    scope_empty(lab, node, name)
    assert gpu0_used(lab, node) == 0


# --- issue 19: respawns the way real servers respawn ----------------------------------------
#
# Measured on a real H200 (FIELD_NOTES, third round): a `while :; do python3 worker.py; sleep 0.3;
# done` loop has the new worker 0.3 s after the old one ended, but the worker re-titles itself and
# holds GPU memory again only seconds later. So every restarted process here re-titles itself
# (prctl PR_SET_NAME and its argv rewritten: `--title`) only after IMPORT_S (SGLang titles its
# scheduler once torch is imported), then loads for LOAD_S before it maps anything: 2.5 s in
# all before it takes the GPU again.

IMPORT_S, LOAD_S = 1.5, 1.0
WORKER = "fakegpu hold --gpu 0:500 --title sglang::scheduler_TP0 --import-s %s --load-s %s" % (IMPORT_S, LOAD_S)
HELD = "fakegpu hold --gpu 0:500 --title sglang::scheduler_TP0"
LOOP_PID = "/run/gpuops-t/loop.pid"
# A launcher that starts the worker and exits when it ends, as SGLang's launch_server does when
# a scheduler dies: the loop above it restarts the launcher, so the respawner is the holder's
# grandparent. One written in Python (its worker is spawned, another python3), one in bash.
LAUNCHER_PY = ("import subprocess, sys\n"
               "sys.exit(subprocess.call(%r))\n" % WORKER.split())
RESPAWNERS = {
    # (a) the respawner is the holder's parent
    "parent": "bash -c %s" % shlex.quote(
        "echo $$ > %s; while :; do %s; sleep 0.3; done" % (LOOP_PID, WORKER)),
    # (b) the respawner is the holder's grandparent
    "grandparent-python": "bash -c %s" % shlex.quote(
        "echo $$ > %s; while :; do python3 -c %s; sleep 0.3; done" % (LOOP_PID, shlex.quote(LAUNCHER_PY))),
    "grandparent-bash": "bash -c %s" % shlex.quote(
        "echo $$ > %s; while :; do bash -c %s; sleep 0.3; done"
        % (LOOP_PID, shlex.quote("%s; exit $?" % WORKER))),
}
# (c) bystanders: shells that started the holder but only ever run other programs after it.
BYSTANDERS = {
    # the holder in the background, the shell running `sleep` after `sleep` (an interactive
    # user's shell, watching something)
    "sleep-loop": "bash -c %s" % shlex.quote(
        "echo $$ > %s; %s & while :; do sleep 0.2; done" % (LOOP_PID, HELD)),
    # the holder run once in the foreground, then other commands
    "ran-once": "bash -c %s" % shlex.quote(
        "echo $$ > %s; %s; while :; do sleep 0.2; cat /proc/loadavg >/dev/null; done"
        % (LOOP_PID, HELD)),
}


def start_shape(lab, node, name, command):
    """Start `command` in scope gpuops-t-<name>; wait until GPU 0 holds 500 MiB; return the
    shell's (pid, start time)."""
    sc.start_in_scope(lab, node, name, command)
    sc.wait_until(lab, node, "[ -s %s ] && nvidia-smi --query-gpu=index,memory.used "
                             "--format=csv,noheader,nounits | grep -q '^0, 500$'" % LOOP_PID,
                  "%s holding GPU 0" % name)
    pid = int(lab.exec(node, "cat %s" % LOOP_PID).stdout)
    return pid, sc.identity(lab, node, pid)[0]


def respawner_ended(lab, node, result, loop_pid, loop_start, said):
    """The run was never free while the loop lived, did not fail, named the loop in a respawn
    step whose result says `said`, and signalled it: the loop is gone and the GPUs free."""
    loop_alive = sc.alive(lab, node, loop_pid, loop_start)
    assert not (result["free"] and loop_alive), "free while the loop lives: %s" % result["actions"]
    assert not result.get("failed"), result.get("msg")
    assert result["free"] is True and not loop_alive, result["actions"]
    respawn = [a for a in steps(result, "respawn") if a["pid"] == loop_pid]
    assert respawn and respawn[0]["code"] == "respawner_target" and said in respawn[0]["result"], result["actions"]
    assert loop_pid in signalled(result, "sigterm") | signalled(result, "sigkill")


def scope_empty(lab, node, name):
    """Wait until nothing of scope gpuops-t-<name> is left (no process of the shape, so nothing
    that could bring a holder back)."""
    sc.wait_until(lab, node, "! systemctl is-active --quiet %s%s.scope" % (sc.SCOPE_PREFIX, name),
                  "every process of scope %s%s ended" % (sc.SCOPE_PREFIX, name))


def every_signal(result):
    return {a["pid"] for a in result["actions"] if a["step"] in ("sigterm", "sigkill", "sigstop", "sigcont")}


@pytest.mark.parametrize("shape", sorted(RESPAWNERS))
def test_a_restarted_retitled_slow_holder_is_seen_by_ancestry_and_its_respawner_ended(lab, node, shape):
    name = "respawn-%s" % shape
    loop_pid, loop_start = start_shape(lab, node, name, RESPAWNERS[shape])

    result = reclaim(lab, node, gpus=["0"], term_timeout=5)

    # The loop itself (the holder's parent, or its grandparent) was recognised and ended.
    respawner_ended(lab, node, result, loop_pid, loop_start, "becomes the target")
    # Nothing of the shape is left (no restarted worker escaped, loading), and GPU 0 is free.
    scope_empty(lab, node, name)
    assert gpu0_used(lab, node) == 0


def test_a_respawner_outside_match_is_named_with_its_lever_never_signalled_nor_left_stopped(lab, node):
    name = "respawn-outside-match"
    loop_pid, loop_start = start_shape(lab, node, name, RESPAWNERS["grandparent-python"])

    # `match` covers the worker (by its title) but not the loop that restarts it
    result = reclaim(lab, node, gpus=["0"], term_timeout=5, match=["^sglang::scheduler"])

    assert result.get("failed") is True and result["free"] is False, result["actions"]
    assert loop_pid not in every_signal(result), result["actions"]
    assert "PID %d (bash" % loop_pid in result["msg"], result["msg"]
    assert "`kill %d`" % loop_pid in result["msg"] and "`match`" in result["msg"], result["msg"]
    assert [h["pid"] for h in result["remaining"] if h["kind"] == "respawner"] == [loop_pid]
    identity = sc.identity(lab, node, loop_pid)
    assert identity[0] == loop_start and identity[1] != "T", "the loop runs on, not stopped: %s" % (identity,)


@pytest.mark.parametrize("shape", sorted(BYSTANDERS))
def test_a_bystander_shell_is_watched_within_the_bound_and_never_signalled(lab, node, shape):
    shell_pid, shell_start = start_shape(lab, node, "bystander-%s" % shape, BYSTANDERS[shape])

    result = ok(reclaim(lab, node, gpus=["0"], term_timeout=5))

    assert result["free"] is True
    assert sc.alive(lab, node, shell_pid, shell_start), "the bystander shell was ended"
    assert shell_pid not in every_signal(result), result["actions"]
    assert not steps(result, "respawn"), result["actions"]
    (settle,) = [a for a in steps(result, "settle") if shell_pid in a["pids"]]
    # Watched because it lives above what was ended, and only as long as the bound allows.
    assert settle["code"] == "settle_bound", settle
    assert settle["watched_s"] <= settle["bound_s"] + 0.5, settle
    assert gpu0_used(lab, node) == 0


def test_traced_holder_gets_sigkill_at_once_and_the_failure_names_its_tracer(lab, node):
    # A holder a real strace keeps in tracing stop (state t), its tracer stopped too. It acts on
    # no signal but SIGKILL, so the ladder sends SIGKILL at once, without the grace. SIGKILLed,
    # a tracee stops in its exit (PTRACE_EVENT_EXIT), fds and memory still held, until its
    # tracer resumes it: the run fails naming the tracer as the lever (not a reset), and
    # continuing the tracer is what frees the GPU.
    try:
        rec, tracer = sc.start_traced_stop(lab, node, gpu=3, mib=700)
    except LookupError as exc:
        pytest.skip(str(exc))

    seen = lab.module(node, "gpuops.reclaim.gpu_holders", {"gpus": ["3"]})
    (holder,) = [h for h in seen["holders"] if h["pid"] == rec["pid"]]
    assert (holder["state"], holder["tracer_pid"], holder["tracer_name"]) == ("tracing-stop", tracer, "strace")
    said = [d for d in seen["diagnosis"] if "PID %d" % rec["pid"] in d]
    assert said and "traced by PID %d (strace) and stopped (state t)" % tracer in said[0], seen["diagnosis"]

    result = reclaim(lab, node, gpus=["3"], term_timeout=2)

    assert [a["step"] for a in result["actions"] if a.get("pid") == rec["pid"]][:2] == ["sigterm", "sigkill"]
    term = steps(result, "sigterm")[0]
    assert term["code"] == "sent_futile" and "traced by PID %d (strace)" % tracer in term["result"], result["actions"]
    assert tracer not in signalled(result, "sigterm") | signalled(result, "sigkill")
    assert result.get("failed") is True and result["free"] is False
    assert [(h["pid"], h["reason_code"]) for h in result["remaining"]] == [(rec["pid"], "survived")]
    assert "traced by PID %d (strace) and stays in its exit" % tracer in result["msg"], result["msg"]
    assert "kill -CONT %d" % tracer in result["msg"] and "reboot" not in result["msg"], result["msg"]

    # The lever named is the right one: the tracer, continued, lets the exit complete.
    lab.exec(node, "kill -CONT %d" % tracer)
    sc.wait_until(lab, node, "[ ! -e /proc/%d ] || grep -q '^State:[[:space:]]*Z' /proc/%d/status"
                  % (rec["pid"], rec["pid"]), "the traced holder's exit completed")
    sc.wait_until(lab, node, "fakegpu status | python3 -c 'import json,sys; "
                             "sys.exit(0 if json.load(sys.stdin)[\"gpus\"][3][\"memory_used_mib\"] == 0 else 1)'",
                  "GPU 3 free")


def test_stopped_holder_gets_sigcont_and_exits_on_sigterm_without_waiting_out_the_grace(lab, node):
    rec = sc.hold(lab, node, "stopped", "--gpu", "2:600")
    lab.exec(node, "kill -STOP %d" % rec["pid"])
    sc.wait_until(lab, node, "grep -q '^State:[[:space:]]*T' /proc/%d/status" % rec["pid"], "holder stopped")

    result = ok(reclaim(lab, node, gpus=["2"], term_timeout=10))

    # Continued right after SIGTERM, it exits on it: the SIGTERM step ends with its exit, not
    # with 'still running 10.00 s after SIGTERM', and no SIGKILL follows (a stopped process
    # left stopped would outlive the grace and get one).
    assert [a["step"] for a in result["actions"] if a.get("pid") == rec["pid"]] == ["sigterm", "sigcont"]
    assert steps(result, "sigterm")[0]["code"] == "exited", result["actions"]
    assert not steps(result, "sigkill"), result["actions"]
    assert not sc.alive(lab, node, rec["pid"], rec["start_time"])
    assert_all_free(lab, node, result, [2])


def test_protected_holder_alone_fails_without_waiting_naming_it(lab, node):
    rec = sc.hold(lab, node, "hostengine", "--gpu", "1:700", "--title", "nv-hostengine")

    result = reclaim(lab, node, gpus=["1"], term_timeout=30, release_timeout=60)

    assert result.get("failed") is True
    # Nothing could be signalled and nothing falls, so the ladder waits neither the grace nor
    # release_timeout: its one step is the release wait it skipped.
    assert [(a["step"], a["waited_s"]) for a in result["actions"]] == [("wait_release", 0.0)], result["actions"]
    assert result["actions"][0]["code"] == "not_waited", result["actions"]
    assert [(h["pid"], h["reason_code"]) for h in result["remaining"]] == [(rec["pid"], "protected")]
    assert "PID %d (nv-hostengine)" % rec["pid"] in result["msg"] and "protected" in result["msg"], result["msg"]
    assert not signalled(result, "sigterm") | signalled(result, "sigkill")
    assert sc.alive(lab, node, rec["pid"], rec["start_time"])


@pytest.mark.parametrize("bad,named", [
    ({"term_timeout": -1}, "term_timeout must be 0 or more, got -1"),
    ({"passes": -2}, "passes must be 0 or more, got -2"),
    ({"nvml_timeout": 0}, "nvml_timeout must be greater than 0, got 0"),
    ({"protect": ["(unclosed"]}, "protect: '(unclosed' is not a valid regular expression"),
    ({"match": ["[bad"]}, "match: '[bad' is not a valid regular expression"),
    ({"gpus": ["GPU-nope"]}, "gpus: 'GPU-nope' matches no GPU on this host"),
    ({"exclude": ["9"]}, "exclude: '9' matches no GPU on this host"),
    ({"spare_units": ["sglang.socket"]}, "spare_units: 'sglang.socket' is a socket unit"),
    ({"term_timeout": "soon"}, "term_timeout"),
])
def test_bad_input_fails_naming_it_and_changes_nothing(lab, node, bad, named):
    rec = sc.hold(lab, node, "bystander", "--gpu", "1:700")

    result = reclaim(lab, node, **bad)

    assert result.get("failed") is True
    assert named in result["msg"], result["msg"]
    assert not result.get("actions")
    assert sc.alive(lab, node, rec["pid"], rec["start_time"])
    assert sc.gpu_used_mib(lab, node, 1) == 700
