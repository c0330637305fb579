"""Holders owned by a real podman container, by a pod-shaped cgroup and by a guest's systemd,
on a lab node (podman 4.3 from Debian, runc, in a node booted with LAB_CONTAINERS=1).

The container's image is made in the node with no registry: `podman import` of a tarball
holding only the directories and /usr-merge links of a root; the stand-in driver and its
state are bind-mounted from the node (/usr, /opt/gpuops-lab, /etc/fakegpu, /var/lib/fakegpu,
each /dev/nvidia* file), so the container's process holds stand-in memory exactly as a node
process does.
"""


import pytest

from . import scenarios as sc

FAST = {"term_timeout": 1.5, "release_timeout": 5, "nvml_timeout": 5}
IMAGE = "localhost/gpuops-lab-base:1"
CTR = "gpuops-t-ctr"
POD_UID = "74c13223-5a00-11e9-b385-42010a80018d"
POD_CID = "34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376"
# The cgroup (v2) a kubelet with the cgroupfs driver gives a BestEffort pod's container.
POD_CGROUP = "/sys/fs/cgroup/kubepods/besteffort/pod%s/%s" % (POD_UID, POD_CID)

IMPORT_IMAGE = (
    "podman image exists %s || { d=$(mktemp -d) && cd \"$d\" && "
    "mkdir -p usr etc proc sys dev tmp run var/lib/fakegpu opt/gpuops-lab etc/fakegpu && "
    "ln -s usr/bin bin && ln -s usr/lib lib && ln -s usr/lib64 lib64 && ln -s usr/sbin sbin && "
    "tar -c . | podman import -q - %s >/dev/null && cd / && rm -rf \"$d\"; }" % (IMAGE, IMAGE))


def reclaim(lab, node, check_mode=False, **args):
    return lab.module(node, "gpuops.reclaim.gpu_reclaim", dict(FAST, **args), check_mode=check_mode)


def steps(result, step):
    return [a for a in result["actions"] if a["step"] == step]


def end_containers(lab, node):
    lab.exec(node, "podman rm -f -a -t 0 >/dev/null 2>&1; "
                   "for d in $(find /sys/fs/cgroup/kubepods -depth -type d 2>/dev/null); do "
                   "for p in $(cat $d/cgroup.procs); do kill -9 $p; done; rmdir $d 2>/dev/null; done; true",
             timeout=120)


@pytest.fixture
def pnode(lab):
    """The last lab node, with podman, no container and idle stand-in GPUs before and after."""
    name = lab.nodes[-1]
    status = lab.status().get(name, {})
    if "podman" not in status.get("tools", []):
        pytest.skip("the lab nodes have no podman: run with LAB_CONTAINERS=1 after `tests/lab/lab down` "
                    "(tests/lab/README.md, 'Container nodes')")
    if "fakegpu" not in status.get("tools", []):
        pytest.skip("stand-in GPU driver not installed on %s: tests/fakegpu not built" % name)
    end_containers(lab, name)
    sc.cleanup(lab, name)
    lab.exec(name, IMPORT_IMAGE, timeout=120)
    yield name
    end_containers(lab, name)
    sc.cleanup(lab, name)


def run_container(lab, node, gpu, mib, init=False, restart="always"):
    """A container whose process holds `mib` on `gpu`; returns its id once the memory is held.

    Without `init` the holder is the container's PID 1 (`docker run` without --init, the
    engines' documented way); with it, catatonit is PID 1 and the holder its child.
    """
    devices = " ".join("-v %s:%s" % (dev, dev) for dev in
                       lab.exec(node, "ls /dev/nvidia*").stdout.split())
    argv = ("podman run -d --name %s --restart=%s %s -v /usr:/usr:ro -v /opt/gpuops-lab:/opt/gpuops-lab:ro "
            "-v /etc/fakegpu:/etc/fakegpu:ro -v /etc/ld.so.cache:/etc/ld.so.cache:ro "
            "-v /var/lib/fakegpu:/var/lib/fakegpu %s %s fakegpu hold --gpu %d:%d --title sglang-ctr"
            % (CTR, restart, "--init" if init else "", devices, IMAGE, gpu, mib))
    cid = lab.exec(node, argv, timeout=120).stdout.strip().splitlines()[-1]
    wait_holding(lab, node, gpu, mib)
    return cid


def wait_holding(lab, node, gpu, mib):
    sc.wait_until(lab, node, "[ \"$(fakegpu status | python3 -c 'import json,sys; "
                  "print([g for g in json.load(sys.stdin)[\"gpus\"] if g[\"index\"] == %d][0][\"memory_used_mib\"])')\" = %d ]"
                  % (gpu, mib), "container holding %d MiB on GPU %d" % (mib, gpu))


def container_state(lab, node):
    out = lab.exec(node, "podman inspect --format '{{.State.Status}} {{.RestartCount}} {{.State.Pid}}' %s" % CTR)
    status, restarts, pid = out.stdout.split()
    return status, int(restarts), int(pid)


def holder_pid(lab, node):
    """The node PID of the process holding a stand-in GPU inside the container."""
    out = lab.exec(node, "for p in $(pgrep -f 'fakegpu hold'); do "
                         "grep -q libpod /proc/$p/cgroup 2>/dev/null && echo $p; done; true")
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 1, out.stdout
    return pids[0], sc.identity(lab, node, pids[0])[0]


def test_holders_names_the_podman_container_and_protects_its_init(lab, pnode):
    cid = run_container(lab, pnode, 3, 1500)

    result = lab.module(pnode, "gpuops.reclaim.gpu_holders", {"gpus": ["3"]})

    holder = [h for h in result["holders"] if 3 in h["context_gpus"]][0]
    owner = holder["owner"]
    assert (owner["kind"], owner["runtime"], owner["id"]) == ("container", "podman", cid)
    assert owner["name"] == CTR and owner["restart_policy"] == "always"   # from `podman inspect`
    assert owner["unit"] == "libpod-%s.scope" % cid
    assert holder["protected"] and holder["protected_reason"] == "init of a container's PID namespace"
    said = [d for d in result["diagnosis"] if "PID %d" % holder["pid"] in d and "podman container" in d]
    assert said and "stop_containers: true" in said[0] and "podman stop" in said[0], result["diagnosis"]


def test_container_init_holding_a_gpu_is_stopped_through_podman_and_stays_down(lab, pnode):
    cid = run_container(lab, pnode, 3, 1500)
    restarts_before = container_state(lab, pnode)[1]

    plan = reclaim(lab, pnode, check_mode=True, gpus=["3"])
    assert [(a["step"], a["container"], a["code"]) for a in steps(plan, "stop_container")] == [
        ("stop_container", cid, "would_stop_container")], plan["actions"]
    assert container_state(lab, pnode)[0] == "running", "check mode stopped the container"

    result = reclaim(lab, pnode, gpus=["3"])

    assert not result.get("failed"), result.get("msg", result)
    stops = steps(result, "stop_container")
    assert [(a["container"], a["runtime"], a["code"]) for a in stops] == [(cid, "podman", "container_stopped")]
    assert not steps(result, "sigterm") and not steps(result, "sigkill"), "the init is never signalled"
    assert result["free"] is True
    # Stays down: the restart policy does not apply to a container stopped through its runtime,
    # and nothing holds GPU 3 when asked again after the run.
    status, restarts, _pid = container_state(lab, pnode)
    assert status == "exited" and restarts == restarts_before
    again = lab.module(pnode, "gpuops.reclaim.gpu_holders", {"gpus": ["3"]})
    assert again["free"] is True and again["holders"] == []
    assert sc.gpu_used_mib(lab, pnode, 3) == 0
    assert lab.exec(pnode, "podman container exists %s" % CTR, check=False).returncode == 0, "never removed"


def test_without_the_container_lever_the_restarting_container_is_named(lab, pnode):
    cid = run_container(lab, pnode, 4, 1000, init=True)
    pid, start = holder_pid(lab, pnode)
    # The respawn is real: SIGKILL of the holder from the node ends the container and podman
    # starts it again (restart policy always) with a new holder.
    lab.exec(pnode, "kill -9 %d" % pid)
    sc.wait_until(lab, pnode, "[ \"$(podman inspect --format '{{.RestartCount}}' %s)\" -ge 1 ] && "
                  "[ \"$(podman inspect --format '{{.State.Status}}' %s)\" = running ]" % (CTR, CTR),
                  "podman restarting the container")
    # The respawned process holds the GPU only once it has mapped its memory, a moment after it
    # starts: a survey before that would find GPU 4 free, with nothing to name.
    wait_holding(lab, pnode, 4, 1000)
    pid, start = holder_pid(lab, pnode)

    result = reclaim(lab, pnode, gpus=["4"], stop_containers=False)

    assert result.get("failed") is True
    assert "podman container %s (%s)" % (CTR, cid[:12]) in result["msg"], result["msg"]
    assert "restart policy always" in result["msg"] and "stop_containers: true" in result["msg"]
    # Killing it would only start it again: it is left alone, and so is the container.
    assert not [a for a in result["actions"] if a.get("pid") == pid and a["changed"]]
    assert sc.alive(lab, pnode, pid, start)
    assert container_state(lab, pnode)[0] == "running"


def test_a_pod_shaped_cgroup_gets_the_pod_message_and_no_signal(lab, pnode):
    rec = sc.hold(lab, pnode, "podlike", "--gpu", "5:800")
    lab.exec(pnode, "mkdir -p %s && echo %d > %s/cgroup.procs" % (POD_CGROUP, rec["pid"], POD_CGROUP))
    assert "/kubepods/besteffort/pod%s/%s" % (POD_UID, POD_CID) in lab.exec(
        pnode, "cat /proc/%d/cgroup" % rec["pid"]).stdout

    result = reclaim(lab, pnode, gpus=["5"], force=True)

    assert result.get("failed") is True
    assert "Kubernetes pod uid %s" % POD_UID in result["msg"], result["msg"]
    assert "delete or evict the pod" in result["msg"]
    assert not [a for a in result["actions"] if a.get("pid") == rec["pid"]], result["actions"]
    assert sc.alive(lab, pnode, rec["pid"], rec["start_time"])
    holder = [h for h in result["remaining"] if h["pid"] == rec["pid"]][0]
    assert holder["owner"]["kind"] == "pod" and holder["owner"]["pod"]["uid"] == POD_UID
