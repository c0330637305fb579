"""The port_owner module against a real docker (Debian's docker.io on a LAB_RUNTIMES=1 node,
test_docker.py's lab, both cgroup drivers): a listener in the unit's own container, as docker
confirms it by the container's full ID (the ID the unit's `docker run --cidfile` writes), is the
unit's (`in_container`); a listener in another container, or one on the node, is not, and
neither is a container named like the service (a name is never the proof). Issue 20's docker
path (branch docker-server) as the module carries it; the squatter in a user's session is
test_security.py's.
"""

import pytest

from . import test_docker

# test_docker's lab node with dockerd on each cgroup driver and the lab's image imported.
docker_node = test_docker.docker_node
CTR = test_docker.CTR
end_container = test_docker.end_container

PORT = 30123
OTHER = "gpuops-t-other"
PIDFILE = "/run/gpuops-t-listener.pid"
# A listener on the host network, as the engines' documented `docker run --network host`.
LISTEN = "python3 -c 'import socket, time; s = socket.socket(); s.bind((\"0.0.0.0\", %d)); s.listen(); time.sleep(600)'"


@pytest.fixture
def dnode(lab, docker_node):
    name = docker_node[0]
    clean(lab, name)
    yield docker_node
    clean(lab, name)


def clean(lab, node):
    end_container(lab, node)
    lab.exec(node, "docker rm -f %s >/dev/null 2>&1; [ -s %s ] && kill -9 $(cat %s); rm -f %s; true"
             % (OTHER, PIDFILE, PIDFILE, PIDFILE), timeout=120)


def on_node(lab, node):
    """The listener as a process of the node (an SSH session's), its PID kept to end it by."""
    lab.exec(node, "setsid -f sh -c 'echo $$ > %s; exec %s' </dev/null >/dev/null 2>&1"
             % (PIDFILE, (LISTEN % PORT).replace("'", "'\\''")))


def listening(lab, node):
    lab.exec(node, "for i in $(seq 100); do grep -q ':%04X 00000000:0000 0A' /proc/net/tcp && exit 0; sleep 0.1; done; "
                   "exit 1" % PORT)


def port_owner(lab, node, cid):
    result = lab.module(node, "gpuops.reclaim.port_owner",
                        {"port": PORT, "unit": "sglang.service", "container": {"runtime": "/usr/bin/docker", "id": cid}})
    assert not result.get("failed"), result.get("msg")
    return result


def test_a_listener_in_the_units_own_container_is_the_units_as_docker_confirms_it(lab, dnode):
    node, image, driver = dnode
    cid = lab.exec(node, "docker run -d --name %s --network host %s %s" % (CTR, image, LISTEN % PORT),
                   timeout=120).stdout.strip().splitlines()[-1]
    listening(lab, node)
    result = port_owner(lab, node, cid)

    container = result["container"]
    assert container["id"] == cid and "error" not in container, container
    assert container["pid"] == int(lab.exec(node, "docker inspect --format '{{.State.Pid}}' %s" % cid).stdout)
    # systemd driver: system.slice/docker-<id>.scope; cgroupfs: /docker/<id>
    assert cid in container["cgroup"] and container["cgroup"].startswith(
        "/system.slice/docker-" if driver == "systemd" else "/docker/"), container
    (listener,) = result["owners"]
    assert listener["pid"] == container["pid"] and listener["cgroup"] == container["cgroup"]
    assert listener["in_container"] is True and listener["in_unit"] is False
    assert listener["reason_code"] == "unit_container"
    assert listener["owner"]["kind"] == "container" and listener["owner"]["id"] == cid


def test_a_listener_in_another_container_or_on_the_node_is_not_the_units(lab, dnode):
    node, image, _driver = dnode
    # The unit's container runs but does not listen; another container, named like nothing of
    # ours, holds the port; then a process of the node does.
    ours = lab.exec(node, "docker run -d --name %s --network host %s sleep 600" % (CTR, image),
                    timeout=120).stdout.strip().splitlines()[-1]
    lab.exec(node, "docker run -d --name %s --network host %s %s" % (OTHER, image, LISTEN % PORT), timeout=120)
    listening(lab, node)
    result = port_owner(lab, node, ours)
    assert "error" not in result["container"], result["container"]
    (listener,) = result["owners"]
    assert listener["owner"]["kind"] == "container" and listener["owner"]["id"] != ours
    assert listener["in_container"] is False and listener["in_unit"] is False and listener["reason_code"] == "outside"

    lab.exec(node, "docker rm -f %s" % OTHER, timeout=120)
    on_node(lab, node)
    listening(lab, node)
    (listener,) = port_owner(lab, node, ours)["owners"]
    assert listener["owner"]["kind"] == "session" and listener["reason_code"] == "outside"


def test_a_container_docker_does_not_know_confirms_nothing_and_is_named(lab, dnode):
    node, _image, _driver = dnode
    on_node(lab, node)
    listening(lab, node)
    unknown = "e" * 64
    result = port_owner(lab, node, unknown)
    assert result["container"]["id"] == unknown
    assert result["container"]["error"].startswith("`docker inspect --type container -- %s` gave nothing" % unknown)
    assert [o["in_container"] for o in result["owners"]] == [False]
