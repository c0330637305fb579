"""roles/inference_service/files/port_owner.py's rules (issue 22 item 4): a cgroup name inside a
user's delegated subtree never names a unit; a listener is the unit's only inside its
ControlGroup. The script itself runs in the lab (tests/integration/test_security.py)."""

import importlib.util
import os
import socket
import subprocess
import sys
import json

import pytest

FILES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "inference_service", "files")
SCRIPT = os.path.join(FILES, "port_owner.py")


def load():
    spec = importlib.util.spec_from_file_location("port_owner", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


port_owner = load()


@pytest.mark.parametrize("path, unit", [
    ("/system.slice/sglang.service", "sglang.service"),
    ("/user.slice/user-0.slice/session-4.scope", "session-4.scope"),
    # alice names every directory below her user manager: none of them is a unit root knows.
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/sglang.service", "user@1000.service"),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/docker-" + "a" * 64 + ".scope", "user@1000.service"),
    ("/user.slice/user-1000.slice/user@1000.service/kubepods-besteffort-pod1.slice/x.service", "user@1000.service"),
    ("/", None), (None, None),
])
def test_unit_of_never_names_a_unit_inside_a_users_subtree(path, unit):
    assert port_owner.unit_of(path) == unit


@pytest.mark.parametrize("path, group, inside", [
    ("/system.slice/sglang.service", "/system.slice/sglang.service", True),
    ("/system.slice/sglang.service/worker", "/system.slice/sglang.service", True),
    ("/system.slice/sglang.service-evil", "/system.slice/sglang.service", False),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/sglang.service", "/system.slice/sglang.service", False),
    ("/system.slice/sglang.service", None, False),      # no unit (not loaded): nothing is its
    (None, "/system.slice/sglang.service", False),
])
def test_in_unit_is_the_units_own_control_group_or_below(path, group, inside):
    assert port_owner.in_unit(path, group) is inside


def test_systemd_path_prefers_the_name_systemd_hierarchy_then_v2():
    hybrid = "9:name=systemd:/system.slice/a.service\n1:cpu:/\n0::/system.slice/b.service\n"
    assert port_owner.systemd_path(hybrid, unified=False) == "/system.slice/a.service"
    assert port_owner.systemd_path("0::/system.slice/b.service\n", unified=False) == "/system.slice/b.service"


def test_systemd_path_on_a_unified_host_is_the_v2_line_whatever_name_systemd_says():
    # Read on a lab container node (its own cgroup v2 tree under nspawn, on a hybrid host): the
    # kernel lists the outer host's name=systemd hierarchy as "/" for every process, while the
    # node's systemd keeps the server of a podman unit (--cgroups=split) in the v2 path.
    seen = ("9:name=systemd:/\n8:pids:/\n1:cpu:/\n"
            "0::/system.slice/fakeserve.service/libpod-payload-" + "c" * 64 + "\n")
    assert port_owner.systemd_path(seen, unified=True) == "/system.slice/fakeserve.service/libpod-payload-" + "c" * 64
    assert port_owner.in_unit(port_owner.systemd_path(seen, unified=True), "/system.slice/fakeserve.service")
    assert port_owner.systemd_path("9:name=systemd:/x.service\n", unified=True) == "/x.service"


def test_a_real_listener_is_found_with_its_uid_and_cgroup_and_is_not_in_a_unit_it_does_not_belong_to():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    try:
        out = json.loads(subprocess.run([sys.executable, SCRIPT, str(port), "127.0.0.1", "no-such-unit.service"],
                                        capture_output=True, text=True, check=True).stdout)
    finally:
        sock.close()
    assert out["listening"] is True
    (me,) = [o for o in out["owners"] if o["pid"] == os.getpid()]
    assert me["uid"] == os.geteuid() and me["in_unit"] is False
    assert me["cgroup"] == port_owner.systemd_path(open("/proc/self/cgroup").read())
