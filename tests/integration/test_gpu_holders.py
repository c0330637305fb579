"""gpuops.reclaim.gpu_holders run for real (Ansible over SSH) on a lab node with wedged GPUs.

Each test starts its scenario in the node (tests/integration/scenarios.py), runs the module
once or twice, and checks what it reports against what the scenario really is.
"""

import pytest

from . import scenarios as sc

FQCN = "gpuops.reclaim.gpu_holders"


def holders_by_pid(result):
    return {h["pid"]: h for h in result["holders"]}


def row(result, index):
    return [g for g in result["gpus"] if g["index"] == index][0]


def run_ok(lab, node, args=None, check_mode=False):
    result = lab.module(node, FQCN, args or {}, check_mode=check_mode)
    assert not result.get("failed"), result.get("msg", result)
    assert result["changed"] is False
    return result


def test_holders_found_whatever_their_name(lab, node):
    kworker = sc.hold(lab, node, "kworker", "--gpu", "2:1000", "--title", "[kworker/2:1]")
    sched = sc.hold(lab, node, "sched", "--gpu", "5:1500", "--title", "sglang::scheduler_TP2")

    result = run_ok(lab, node)

    holders = holders_by_pid(result)
    for rec, gpu, mib, title in ((kworker, 2, 1000, "[kworker/2:1]"),
                                 (sched, 5, 1500, "sglang::scheduler_TP2")):
        holder = holders[rec["pid"]]
        assert holder["start_time"] == rec["start_time"]
        assert holder["cmdline"] == title
        assert holder["name"] == title[:15]
        assert holder["gpus"] == [gpu]
        assert holder["context_gpus"] == [gpu]
        assert holder["gpu_memory_mib"] == {str(gpu): mib}
        assert holder["evidence"] == ["fd", "mmap", "nvml"]
        assert holder["kind"] == "context"
        assert holder["protected"] is False, holder["protected_reason"]
        assert holder["state"] == "sleeping"
        assert holder["user"] == "root"
        assert row(result, gpu)["holders"] == [rec["pid"]]
        assert row(result, gpu)["memory_used_mib"] == mib
        assert row(result, gpu)["free"] is False
    assert len(result["gpus"]) == lab.gpus
    assert all(g["free"] for g in result["gpus"] if g["index"] not in (2, 5))
    assert result["free"] is False
    assert result["backend"] == "nvml"


def test_forked_child_keeps_dead_parents_memory(lab, node):
    rec = sc.hold(lab, node, "forkinh", "--gpu", "3:700", "--fork-inherit")
    (child,) = rec["forked"]
    sc.kill9_and_wait_reaped(lab, node, rec["pid"])
    assert sc.gpu_used_mib(lab, node, 3) == 700, "the stand-in should keep the memory pinned"

    result = run_ok(lab, node, {"gpus": ["3"]})

    holders = holders_by_pid(result)
    assert rec["pid"] not in holders
    holder = holders[child]
    assert "nvml" not in holder["evidence"]
    assert set(holder["evidence"]) == {"fd", "mmap"}
    assert holder["gpu_memory_mib"] is None
    assert holder["kind"] == "context"
    assert holder["gpus"] == [3]
    assert holder["ppid"] != rec["pid"]
    said = [s for s in result["diagnosis"] if "PID %d" % rec["pid"] in s]
    assert said, result["diagnosis"]
    assert "700 MiB" in said[0] and "exited" in said[0] and "PID %d" % child in said[0], said


def test_protected_processes_are_marked(lab, node):
    persistenced = sc.hold(lab, node, "persistenced", "--gpu", "1:200", "--title", "nvidia-persistenced")
    hostengine = sc.hold(lab, node, "hostengine", "--gpu", "1:300", "--title", "nv-hostengine")
    exporter = sc.hold(lab, node, "exporter", "--gpu", "1:400", "--title", "my-gpu-exporter")
    plain = sc.hold(lab, node, "plain", "--gpu", "1:500", "--title", "python3 train.py")

    result = run_ok(lab, node, {"gpus": ["1"], "protect": ["^my-gpu-exporter$"]})

    holders = holders_by_pid(result)
    assert holders[persistenced["pid"]]["protected"] is True
    assert "nvidia-persistenced" in holders[persistenced["pid"]]["protected_reason"]
    assert holders[hostengine["pid"]]["protected"] is True
    assert "nv-hostengine" in holders[hostengine["pid"]]["protected_reason"]
    assert holders[exporter["pid"]]["protected"] is True
    assert "^my-gpu-exporter$" in holders[exporter["pid"]]["protected_reason"]
    assert holders[plain["pid"]]["protected"] is False
    assert holders[plain["pid"]]["protected_reason"] is None
    assert sorted(row(result, 1)["holders"]) == sorted(
        r["pid"] for r in (persistenced, hostengine, exporter, plain))


def test_clients_and_handles_apart(lab, node):
    sc.start_fd_opener(lab, node, "ctl", "/dev/nvidiactl")
    sc.start_fd_opener(lab, node, "handle", "/dev/nvidia4")
    ctl, handle = sc.fd_opener_pid(lab, node, "ctl", "handle")

    result = run_ok(lab, node)

    holders = holders_by_pid(result)
    assert ctl not in holders
    assert ctl in [c["pid"] for c in result["clients"]]
    h = holders[handle]
    assert h["kind"] == "handle"
    assert h["evidence"] == ["fd"]
    assert h["gpus"] == [4]
    assert h["context_gpus"] == []
    assert h["gpu_memory_mib"] is None
    assert handle not in [c["pid"] for c in result["clients"]]
    assert row(result, 4)["holders"] == [] and row(result, 4)["handles"] == [handle]
    # A handle pins no memory and no context: the GPU still counts as free.
    assert row(result, 4)["free"] is True
    assert result["free"] is True


def test_unit_and_its_restart_policy(lab, node):
    rec = sc.start_unit(lab, node, "--gpu", "6:300")

    result = run_ok(lab, node, {"gpus": ["6"]})

    holder = holders_by_pid(result)[rec["pid"]]
    assert holder["unit"] == "gpuhog.service"
    assert holder["unit_restart"] == "always"
    assert holder["unit_active"] == "active"
    said = [s for s in result["diagnosis"] if "gpuhog.service" in s]
    assert said and "Restart=always" in said[0] and "stop_units" in said[0], result["diagnosis"]


def test_leaked_memory_no_process_visible(lab, node):
    lab.exec(node, "fakegpu leak --gpu 7 --mib 2048")

    result = run_ok(lab, node, {"gpus": ["7"]})

    assert result["holders"] == []
    assert row(result, 7)["memory_used_mib"] == 2048
    assert row(result, 7)["free"] is False
    assert result["free"] is False
    said = [s for s in result["diagnosis"] if s.startswith("GPU 7:")]
    assert said and "2048 MiB" in said[0] and "no process visible" in said[0], result["diagnosis"]
    assert "reset" in said[0] and "namespace" in said[0]


def start_in_pid_namespace(lab, node, name, gpu, mib, init_is_holder):
    """A holder in a new PID namespace; returns (outer PID, start time).

    No --ready-file: fakegpu hold reads /proc/<its namespace PID>/stat for it, which is another
    process (or none) in the outer /proc (see the report); readiness is the memory showing.
    """
    title = "gpuops-t-%s" % name
    hold_cmd = "fakegpu hold --gpu %d:%d --title %s" % (gpu, mib, title)
    if init_is_holder:
        cmd = "unshare --pid --fork " + hold_cmd
    else:
        cmd = "unshare --pid --fork sh -c %s" % sc.shlex.quote(hold_cmd + " & wait")
    sc.start_in_scope(lab, node, name, cmd)
    sc.wait_until(lab, node, "pgrep -x %s >/dev/null" % title[:15], "holder %s up" % name)
    sc.wait_until(lab, node, "fakegpu status | grep -q '\"memory_used_mib\": %d'" % mib, "GPU %d memory held" % gpu)
    pid = int(lab.exec(node, "pgrep -x %s" % title[:15]).stdout.split()[0])
    return pid, sc.identity(lab, node, pid)[0]


def test_holder_in_another_pid_namespace(lab, node):
    # A container-like PID namespace: sh is its init, the holder PID 2 inside.
    pid, _unused = start_in_pid_namespace(lab, node, "ns", 5, 900, init_is_holder=False)

    result = run_ok(lab, node, {"gpus": ["5"]})

    # The stand-in NVML, like the real one seen across namespaces, lists no process: used
    # memory with no NVML process. The module still finds the holder by its device files.
    assert row(result, 5)["memory_used_mib"] == 900
    holder = holders_by_pid(result)[pid]
    assert holder["other_pid_namespace"] is True
    assert "nvml" not in holder["evidence"] and holder["kind"] == "context"
    assert holder["gpu_memory_mib"] is None
    assert holder["protected"] is False
    said = [s for s in result["diagnosis"] if "PID %d" % pid in s]
    assert said and "another PID namespace" in said[0], result["diagnosis"]


def test_a_namespace_init_no_runtime_confirms_is_not_protected(lab, node):
    # unshare --fork makes the holder itself PID 1 of its namespace. Any user can do that
    # (unshare -Urpf): without a container runtime confirming the container, being a
    # namespace's init shields nothing (tests/integration/test_trust_boundary.py frees one).
    pid, _unused = start_in_pid_namespace(lab, node, "nsinit", 5, 900, init_is_holder=True)

    result = run_ok(lab, node, {"gpus": ["5"]})

    holder = holders_by_pid(result)[pid]
    assert holder["other_pid_namespace"] is True
    assert holder["protected"] is False and holder["protected_reason"] is None


def test_disk_sleep_holder_is_diagnosed(lab, node):
    pid = sc.start_d_state(lab, node, gpu=4, mib=600)

    result = run_ok(lab, node, {"gpus": ["4"]})

    holder = holders_by_pid(result)[pid]
    assert holder["state"] == "disk-sleep"
    assert holder["gpu_memory_mib"] == {"4": 600}
    said = [s for s in result["diagnosis"] if "PID %d" % pid in s]
    assert said and "uninterruptible sleep" in said[0] and "reset" in said[0], result["diagnosis"]
    # A vfork parent waits in the kernel's clone path (kernel_clone on the lab's 6.18 kernel, read
    # as root from /proc/PID/wchan): the diagnosis names where it sleeps.
    assert holder["wchan"], holder
    assert holder["wchan"] in said[0], said[0]


def test_unreaped_zombie_holds_nothing(lab, node):
    zombie = sc.start_unreaped_child(lab, node, gpu=3, mib=500)[1]

    result = run_ok(lab, node, {"gpus": ["3"]})

    # A zombie has closed its files and dropped its mappings: it holds no GPU memory.
    assert zombie not in holders_by_pid(result)
    assert row(result, 3)["memory_used_mib"] == 0
    assert result["free"] is True


def test_zombie_leader_with_live_thread(lab, node):
    pid = sc.start_zombie_leader(lab, node, gpu=3, mib=800)

    result = run_ok(lab, node, {"gpus": ["3"]})

    holder = holders_by_pid(result)[pid]
    # Z with live threads: nobody can reap it, a signal to the PID reaches the threads.
    assert holder["state"] == "zombie-leader"
    assert holder["gpu_memory_mib"] == {"3": 800}
    said = [s for s in result["diagnosis"] if "PID %d" % pid in s]
    assert said, result["diagnosis"]
    # The PID exists here (as a zombie whose other threads still run): the module must not
    # claim it lives in another namespace, nor send the operator to PID 1 to reap it, which
    # cannot happen while a thread of the group is alive.
    assert not any("no such process exists" in s for s in said), said
    assert not any("must reap it" in s for s in said), said


def test_check_mode_same_result_and_nothing_changes(lab, node):
    tp = sc.hold(lab, node, "tp", "--gpu", "0:400", "--child", "1:400:sglang::scheduler_TP1")
    term = sc.hold(lab, node, "term", "--gpu", "2:300", "--ignore-term")
    procs = [(tp["pid"], tp["start_time"]), (term["pid"], term["start_time"])] + [
        (p["pid"], p["start_time"]) for p in tp["processes"]]

    normal = run_ok(lab, node)
    check = run_ok(lab, node, check_mode=True)

    # Each GPU's health carries how long its reads took (took_ms): a measurement of this run, not
    # a fact of the survey; everything else must be the same.
    for result in (normal, check):
        for gpu in result["gpus"]:
            gpu["health"]["facts"].pop("took_ms")
    for key in ("gpus", "holders", "free", "diagnosis", "backend"):
        assert normal[key] == check[key], key
    assert sorted(normal["clients"], key=lambda c: c["pid"]) == sorted(check["clients"], key=lambda c: c["pid"])
    assert {pid for pid, _unused in procs} <= set(holders_by_pid(normal))
    for pid, start in procs:
        assert sc.alive(lab, node, pid, start), "PID %d changed or died" % pid


@pytest.mark.parametrize("bad", ["9", "GPU-nope"])
def test_unknown_gpu_fails_naming_it(lab, node, bad):
    result = lab.module(node, FQCN, {"gpus": [bad]})

    assert result.get("failed") is True
    msg = result["msg"]
    assert repr(bad) in msg or '"%s"' % bad in msg
    uuids = [u.strip() for u in lab.exec(node, "nvidia-smi --query-gpu=uuid --format=csv,noheader").stdout.split()]
    assert len(uuids) == lab.gpus
    for index, uuid in enumerate(uuids):
        assert uuid in msg, "GPU %d (%s) not named in: %s" % (index, uuid, msg)


def test_exclude_leaves_a_gpu_out(lab, node):
    rec = sc.hold(lab, node, "excluded", "--gpu", "2:500")

    result = run_ok(lab, node, {"exclude": ["2"]})

    assert [g["index"] for g in result["gpus"]] == [i for i in range(lab.gpus) if i != 2]
    assert rec["pid"] not in holders_by_pid(result)
    assert result["free"] is True


def test_minor_permutation_attributes_right_index(lab, node):
    lab.exec(node, "fakegpu setup --gpus 8 --minors 3,0,1,2,4,5,6,7")
    rec = sc.hold(lab, node, "perm", "--gpu", "0:512")
    assert rec["allocations"] == [{"gpu": 0, "minor": 3, "mib": 512}]

    result = run_ok(lab, node)

    holder = holders_by_pid(result)[rec["pid"]]
    assert holder["gpus"] == [0]
    assert holder["gpu_memory_mib"] == {"0": 512}
    assert holder["evidence"] == ["fd", "mmap", "nvml"]
    assert row(result, 0)["minor_number"] == 3
    assert row(result, 0)["holders"] == [rec["pid"]]
    assert row(result, 3)["minor_number"] == 2
    assert row(result, 3)["holders"] == []
    assert all(g["free"] for g in result["gpus"] if g["index"] != 0)


def test_hung_nvml_fails_clearly(lab, node):
    holder = sc.hold(lab, node, "hung", "--gpu", "1:100")
    lab.exec(node, "fakegpu hang --calls all --seconds 60")

    result = lab.module(node, FQCN, {"nvml_timeout": 2})

    assert result.get("failed") is True
    assert "nvml_timeout" in result["msg"] and "2" in result["msg"], result["msg"]
    assert "hung" in result["msg"]
    assert sc.alive(lab, node, holder["pid"], holder["start_time"])


def test_handles_false_reads_only_nvml_pids_when_they_explain_the_memory(lab, node):
    ctx = sc.hold(lab, node, "ctx", "--gpu", "2:1000")
    sc.start_fd_opener(lab, node, "handle2", "/dev/nvidia2")
    handle, = sc.fd_opener_pid(lab, node, "handle2")
    lab.exec(node, "fakegpu leak --gpu 7 --mib 2048")

    full = run_ok(lab, node, {"gpus": ["2"]})
    cheap = run_ok(lab, node, {"gpus": ["2"], "handles": False})
    leaked = run_ok(lab, node, {"handles": False})

    assert full["scan"] == "full" and row(full, 2)["handles"] == [handle]
    assert cheap["scan"] == "listed"
    assert cheap["holders"] == [holders_by_pid(full)[ctx["pid"]]], "the same context holder, nothing else"
    assert row(cheap, 2)["holders"] == [ctx["pid"]] and row(cheap, 2)["handles"] == []
    # GPU 7's memory is charged to nobody: every process is read, the handle is found again
    assert leaked["scan"] == "full" and handle in holders_by_pid(leaked)
