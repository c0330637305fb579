"""Holders owned by a real docker container (Debian's docker.io 20.10: dockerd, containerd, runc,
run by the node's systemd) on a lab node booted with LAB_RUNTIMES=1 (tests/lab/README.md,
'Runtime nodes').

The image is made in the node with no registry: `docker import` of the lab's base tree (bound
read-only into the node) plus the stand-in driver's files; the stand-in's device files and
state are bind-mounted from the node (they are regular files, so --device cannot take them),
so the container's process holds stand-in memory exactly as a node process does.

Both cgroup drivers run: systemd (docker's default on a cgroup v2 host: the container in
system.slice/docker-<id>.scope) and cgroupfs (the container in /docker/<id>).
"""

import json

import pytest

from . import scenarios as sc

FAST = {"term_timeout": 1.5, "release_timeout": 5, "nvml_timeout": 5}
CTR = "gpuops-t-docker"
DAEMON_JSON = "/etc/docker/daemon.json"
# The stand-in's files go into the image beside the base tree: a tag per their content, so a
# node kept between runs (LAB_KEEP=1) imports again only when the stand-in changed.
STAND_IN = ("opt/gpuops-lab usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 "
            "usr/local/bin/fakegpu usr/local/bin/nvidia-smi usr/local/bin/fakeserve")
IMPORT_IMAGE = (
    "set -e; tag=$(cd / && find %s -type f -print0 | sort -z | xargs -0 cat | sha256sum | cut -c1-12); "
    "img=localhost/gpuops-lab-base:$tag; "
    "docker image inspect \"$img\" >/dev/null 2>&1 || "
    "tar -C /opt/gpuops-lab-base -c . -C / %s | docker import - \"$img\" >/dev/null; echo \"$img\""
    % (STAND_IN, STAND_IN))


def reclaim(lab, node, check_mode=False, **args):
    return lab.module(node, "gpuops.reclaim.gpu_reclaim", dict(FAST, **args), check_mode=check_mode)


def steps(result, step):
    return [a for a in result["actions"] if a["step"] == step]


def set_cgroup_driver(lab, node, driver):
    """Restart dockerd with `driver` (native.cgroupdriver) unless it runs with it already."""
    config = json.loads(lab.exec(node, "cat %s" % DAEMON_JSON).stdout)
    config["exec-opts"] = ["native.cgroupdriver=%s" % driver]
    lab.exec(node, "cat > %s <<'EOF'\n%s\nEOF" % (DAEMON_JSON, json.dumps(config, indent=2)))
    if lab.exec(node, "docker info --format '{{.CgroupDriver}}'").stdout.strip() != driver:
        lab.exec(node, "systemctl restart docker.service", timeout=120)
    assert lab.exec(node, "docker info --format '{{.CgroupDriver}}'").stdout.strip() == driver


@pytest.fixture(scope="module", params=["systemd", "cgroupfs"])
def docker_node(request, lab):
    """(node, image, cgroup driver): the last lab node with dockerd on that driver and the
    lab's image imported once per module."""
    name = lab.nodes[-1]
    tools = lab.status().get(name, {}).get("tools", [])
    if "docker" not in tools:
        pytest.skip("the lab nodes have no docker: run with LAB_RUNTIMES=1 after `tests/lab/lab down` "
                    "(tests/lab/README.md, 'Runtime nodes')")
    if "fakegpu" not in tools:
        pytest.skip("stand-in GPU driver not installed on %s: tests/fakegpu not built" % name)
    set_cgroup_driver(lab, name, request.param)
    image = lab.exec(name, IMPORT_IMAGE, timeout=300).stdout.strip().splitlines()[-1]
    return name, image, request.param


@pytest.fixture
def dnode(lab, docker_node):
    name = docker_node[0]
    end_container(lab, name)
    sc.cleanup(lab, name)
    yield docker_node
    end_container(lab, name)
    sc.cleanup(lab, name)


def end_container(lab, node):
    lab.exec(node, "docker rm -f -t 0 %s >/dev/null 2>&1; docker rm -f %s >/dev/null 2>&1; true" % (CTR, CTR),
             timeout=120)


def run_container(lab, node, image, gpu, mib, init=False, restart="always"):
    """A container whose process holds `mib` on `gpu`; returns its id once the memory is held.

    Without `init` the holder is the container's PID 1 (`docker run` without --init, the
    engines' documented way); with it, docker-init (tini) is PID 1 and the holder its child.
    """
    binds = " ".join("-v %s:%s" % (dev, dev) for dev in lab.exec(node, "ls /dev/nvidia*").stdout.split())
    argv = ("docker run -d --name %s --restart=%s --network host %s %s "
            "-v /var/lib/fakegpu:/var/lib/fakegpu -v /etc/fakegpu:/etc/fakegpu:ro "
            "%s fakegpu hold --gpu %d:%d --title sglang-ctr"
            % (CTR, restart, "--init" if init else "", binds, image, gpu, mib))
    cid = lab.exec(node, argv, timeout=120).stdout.strip().splitlines()[-1]
    wait_held(lab, node, gpu, mib, "container holding %d MiB on GPU %d" % (mib, gpu))
    return cid


def wait_held(lab, node, gpu, mib, what):
    sc.wait_until(lab, node, "[ \"$(fakegpu status | python3 -c 'import json,sys; "
                  "print([g for g in json.load(sys.stdin)[\"gpus\"] if g[\"index\"] == %d][0][\"memory_used_mib\"])')\" = %d ]"
                  % (gpu, mib), what)


def container_state(lab, node):
    out = lab.exec(node, "docker inspect --format '{{.State.Status}} {{.RestartCount}} {{.State.Pid}}' %s" % CTR)
    status, restarts, pid = out.stdout.split()
    return status, int(restarts), int(pid)


def holder_pid(lab, node, cid):
    """The node PID of the process holding a stand-in GPU inside the container."""
    out = lab.exec(node, "for p in $(pgrep -x sglang-ctr); do grep -q %s /proc/$p/cgroup 2>/dev/null && echo $p; done; true"
                   % cid)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 1, out.stdout
    return pids[0], sc.identity(lab, node, pids[0])[0]


def kill_and_wait_restart(lab, node, cid):
    """SIGKILL the holder from the node and wait until docker's restart policy has started the
    container again and its new holder took the GPU: the respawn the lever must prevent is real."""
    pid, _start = holder_pid(lab, node, cid)
    before = container_state(lab, node)[1]
    lab.exec(node, "kill -9 %d" % pid)
    sc.wait_until(lab, node, "[ \"$(docker inspect --format '{{.RestartCount}} {{.State.Status}}' %s)\" = '%d running' ]"
                  % (CTR, before + 1), "docker restarting the container")
    return holder_pid(lab, node, cid)


def node_clock(lab, node):
    return lab.exec(node, "date +%s.%N").stdout.strip()


def events_since(lab, node, since, cid):
    """docker's own event log for the container from `since` until now: its start, die, stop,
    restart... (`docker events` returns at --until)."""
    out = lab.exec(node, "docker events --since %s --until $(date +%%s.%%N) --filter container=%s "
                         "--format '{{.Action}}'" % (since, cid), timeout=60)
    return out.stdout.split()


@pytest.mark.parametrize("init", [False, True], ids=["holder-is-pid1", "holder-under-docker-init"])
def test_restart_always_container_is_stopped_through_docker_never_removed_and_stays_down(lab, dnode, init):
    node, image, driver = dnode
    cid = run_container(lab, node, image, 3, 1500, init=init)
    kill_and_wait_restart(lab, node, cid)
    wait_held(lab, node, 3, 1500, "the restarted container holding GPU 3 again")
    pid, start = holder_pid(lab, node, cid)
    restarts_before = container_state(lab, node)[1]

    holders = lab.module(node, "gpuops.reclaim.gpu_holders", {"gpus": ["3"]})
    holder = [h for h in holders["holders"] if h["pid"] == pid][0]
    owner = holder["owner"]
    assert (owner["kind"], owner["runtime"], owner["id"], owner["name"], owner["restart_policy"]) == (
        "container", "docker", cid, CTR, "always")   # name and policy from `docker inspect`
    if driver == "systemd":
        assert owner["unit"] == "docker-%s.scope" % cid and owner["cgroup"].endswith("/docker-%s.scope" % cid)
    else:
        assert owner["cgroup"] == "/docker/%s" % cid, owner
    assert holder["protected"] is (not init)   # the container's PID 1 is never signalled
    since = node_clock(lab, node)

    result = reclaim(lab, node, gpus=["3"])

    assert not result.get("failed"), result.get("msg", result)
    assert [(a["container"], a["runtime"], a["code"]) for a in steps(result, "stop_container")] == [
        (cid, "docker", "container_stopped")], result["actions"]
    assert not steps(result, "sigterm") and not steps(result, "sigkill"), "stopped through docker, not signalled"
    assert result["free"] is True
    assert not sc.alive(lab, node, pid, start)
    # Never removed: `docker ps -a` still lists it, exited, with the restart count it had.
    listed = lab.exec(node, "docker ps -a --no-trunc --filter name=^/%s$ --format '{{.ID}} {{.State}}'" % CTR).stdout.split()
    assert listed == [cid, "exited"], listed
    assert container_state(lab, node)[1] == restarts_before
    # Stays down: nothing holds GPU 3 when asked again, and docker's own event log from before
    # the run until after that question has the stop and no start or restart.
    again = lab.module(node, "gpuops.reclaim.gpu_holders", {"gpus": ["3"]})
    assert again["free"] is True and again["holders"] == []
    assert sc.gpu_used_mib(lab, node, 3) == 0
    events = events_since(lab, node, since, cid)
    assert "stop" in events and "start" not in events and "restart" not in events, events


def test_without_the_container_lever_the_restarting_docker_container_is_named(lab, dnode):
    node, image, _driver = dnode
    cid = run_container(lab, node, image, 4, 1000, init=True)
    pid, start = kill_and_wait_restart(lab, node, cid)

    result = reclaim(lab, node, gpus=["4"], stop_containers=False)

    assert result.get("failed") is True
    assert "docker container %s (%s)" % (CTR, cid[:12]) in result["msg"], result["msg"]
    assert "restart policy always" in result["msg"] and "stop_containers: true" in result["msg"]
    # Killing it would only start it again: it is left alone, and so is the container.
    assert not [a for a in result["actions"] if a.get("pid") == pid and a["changed"]], result["actions"]
    assert sc.alive(lab, node, pid, start)
    assert container_state(lab, node)[0] == "running"
