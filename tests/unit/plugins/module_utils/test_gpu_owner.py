"""gpu_owner: the owner of a process from real /proc/PID/cgroup texts: the walk over every
hierarchy (outermost owner first, a pod anywhere, a user's subtree), systemd's own layout, what a
runtime's `inspect` says, descriptions. Each runtime's, guest's and pod's layout is its family's
(test_gpu_family_container.py, test_gpu_family_guest.py, test_gpu_family_pod.py).

Each case names where its layout comes from: the runtime's source, its documentation, a
public write-up quoting a real host, or this project's lab (podman 4.3.1 in a lab node).
"""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import json

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide as decide
from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner as owner_mod
from ansible_collections.gpuops.reclaim.plugins.modules import gpu_holders, gpu_reclaim

from ..modules.module_run import documented

from .holders import make_holder
from .observations import CID, CTX, FREE_MIB, POD_UID, V1_ROOTS, gpu, own, proc, snap, v1, v2


# --- containers: what the walk decides (each runtime's layout: test_gpu_family_container.py) ---

def test_podman_rootless_user_slice_is_the_users_not_a_container():
    # Rootless podman: the user's systemd instance owns the scope, in user.slice of
    # user@UID.service (runc's "[slice]:[prefix]:[name]" rule, google/gvisor
    # g3doc/user_guide/systemd.md, with the rootless slice user.slice). The user named that
    # scope (any user can mkdir "libpod-<64 hex>.scope" there): it is her cgroup, and its
    # scope a candidate unit of her own manager, never a container root's podman would stop.
    got = own(v2("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-%s.scope" % CID))
    assert (got.kind, got.runtime, got.id) == ("user", None, None)
    assert (got.controlled_by, got.uid) == ("user", 1000)
    assert (got.unit, got.manager) == ("libpod-%s.scope" % CID, "user")


def test_docker_v1_only_in_controllers():
    # A v1 host where name=systemd still shows the session that started dockerd's client
    # and only the controllers show the container: every path is read, the container wins.
    text = ("1:name=systemd:/user.slice/user-0.slice/session-3.scope\n"
            "4:memory:/docker/%s\n3:pids:/docker/%s\n" % (CID, CID))
    got = own(text)
    assert (got.kind, got.runtime, got.id) == ("container", "docker", CID)


# --- Kubernetes pods: a pod in any hierarchy (the layouts: test_gpu_family_pod.py) ----------

def test_pod_wins_over_anything_else_in_another_hierarchy():
    # A process the kubelet owns in any hierarchy is the kubelet's: never treated as a
    # plain container or unit, whatever another line says.
    text = ("1:name=systemd:/system.slice/containerd.service\n"
            "4:memory:/kubepods/pod%s/%s\n" % (POD_UID, CID))
    assert own(text).kind == "pod"


# --- guests: the outermost owner wins (the layouts: test_gpu_family_guest.py) --------------

def test_docker_inside_an_lxc_guest_belongs_to_the_guest():
    # Seen from the Proxmox host, docker's container is inside guest 101: the host's docker
    # CLI cannot reach it, the guest is what this host knows.
    got = own(v2("/lxc/101/ns/system.slice/docker-%s.scope" % CID))
    assert (got.kind, got.runtime, got.id) == ("guest", "proxmox", "101")


# --- systemd units of this host -------------------------------------------------------------

@pytest.mark.parametrize("text, kind, unit", [
    (v2("/system.slice/sglang.service"), "service", "sglang.service"),
    (v1("/system.slice/sglang.service"), "service", "sglang.service"),
    (v2("/user.slice/user-0.slice/session-17.scope"), "session", "session-17.scope"),
    (v2("/system.slice/gpuops-t-tp8.scope"), "scope", "gpuops-t-tp8.scope"),
    # A user's own service is the user manager's unit: not a system service to stop (see
    # test_a_users_service_is_her_managers_unit_not_the_systems for the manager and the stop).
    (v2("/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service"), "user", "vllm.service"),
    (v2("/"), "none", None),
    ("", "none", None),
    (V1_ROOTS, "none", None),
])
def test_units_and_nothing(text, kind, unit):
    got = own(text)
    assert (got.kind, got.unit) == (kind, unit)


def test_a_users_own_service_is_not_a_system_unit_to_stop():
    # A user's own service is the user manager's unit, in the subtree the user controls: the
    # system manager has no such unit (or another one by that name), so it is never stopped.
    holder = proc(10, fds=CTX, maps=CTX,
                  cgroup=v2("/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service"))
    holders, _unused, _unused = decide.classify(snap([gpu(0, used=900, processes=[(10, 900)])], [holder]),
                                                [], set(), {}, FREE_MIB)
    assert [h.pid for h in holders] == [10]
    assert decide.units_to_stop(holders, set()) == []


def test_every_owner_has_every_key():
    keys = set(owner_mod.new_owner("none").as_result())
    assert keys == set(owner_mod.FIELDS)
    for text in (v2("/system.slice/docker-%s.scope" % CID), v2("/lxc/1/ns/init.scope"), "",
                 v2("/kubepods/pod%s/%s" % (POD_UID, CID))):
        assert set(own(text).as_result()) == keys


# --- what `inspect` says ------------------------------------------------------------------

def test_parse_docker_and_podman_inspect():
    # `docker inspect` prints a list; Name has a leading '/' in docker, none in podman.
    docker = json.dumps([{"Name": "/sglang", "HostConfig": {"RestartPolicy": {"Name": "always"}},
                          "Config": {"Labels": {}}}])
    assert owner_mod.parse_inspect("docker", docker) == {"name": "sglang", "restart_policy": "always"}
    podman = json.dumps([{"Name": "hog", "HostConfig": {"RestartPolicy": {"Name": ""}}, "Config": {"Labels": None}}])
    assert owner_mod.parse_inspect("docker", podman) == {"name": "hog", "restart_policy": None}


def test_parse_inspect_reads_pod_labels():
    # CRI runtimes label each container with its pod: io.kubernetes.pod.{namespace,name,uid}
    # (the kubelet's labels; public kubelet code names KubernetesPodNameLabel etc.).
    labels = {"io.kubernetes.pod.namespace": "infer", "io.kubernetes.pod.name": "sglang-0",
              "io.kubernetes.pod.uid": POD_UID}
    crictl = json.dumps({"status": {"metadata": {"name": "server"}, "labels": labels}})
    got = owner_mod.parse_inspect("crictl", crictl)
    assert got["name"] == "server"
    assert got["pod"] == {"namespace": "infer", "name": "sglang-0", "uid": POD_UID}


@pytest.mark.parametrize("style, text", [("docker", "not json"), ("docker", "[]"), ("crictl", "{}"),
                                         ("pct", ""), ("unknown", "{}")])
def test_parse_inspect_bad_output_is_empty(style, text):
    got = owner_mod.parse_inspect(style, text)
    assert got in ({}, {"name": None})


def test_parse_pct_config_hostname():
    assert owner_mod.parse_inspect("pct", "arch: amd64\nhostname: sglang-a01\nmemory: 65536\n") == {"name": "sglang-a01"}


# --- the record (a named record for every shape, as gpu_holder.Holder) -------------------------

def documented_owner_keys():
    """The keys gpu_reclaim's RETURN documents for a holder's owner: its `holders` are the list
    gpu_holders returns, whose RETURN lists `owner`'s keys."""
    assert "M(gpuops.reclaim.gpu_holders)" in " ".join(documented(gpu_reclaim)["holders"]["description"])
    return set(documented(gpu_holders)["holders"]["contains"]["owner"]["contains"])


def test_an_owners_result_has_exactly_the_keys_the_modules_document():
    supervised = owner_mod.new_owner(owner_mod.SUPERVISOR, "/system.slice/supervisor.service",
                                     runtime="supervisord", id="worker", name="worker",
                                     supervisor={"pid": 40, "start_time": 5, "program_pid": 16},
                                     cli_error={"code": owner_mod.CLI_TIMEOUT, "text": "no answer"})
    for owner in (owner_mod.new_owner(owner_mod.NONE), own(v2("/system.slice/docker-%s.scope" % CID)),
                  own(v2("/kubepods/pod%s/%s" % (POD_UID, CID))), supervised,
                  own(v2("/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service"))):
        result = owner.as_result()
        assert isinstance(result, dict) and set(result) == documented_owner_keys()
        assert list(result) == list(owner_mod.FIELDS)
        # Plain data: JSON gives back the same dict, the nested pod and supervisor dicts too.
        assert json.loads(json.dumps(result)) == result
        assert result == dict((field, getattr(owner, field)) for field in owner_mod.FIELDS)
    pod = own(v2("/kubepods/pod%s/%s" % (POD_UID, CID))).as_result()["pod"]
    assert pod == {"namespace": None, "name": None, "uid": POD_UID}
    assert supervised.as_result()["supervisor"] == {"pid": 40, "start_time": 5, "program_pid": 16}


def test_an_owner_cannot_be_changed_in_place():
    owner = own(v2("/system.slice/docker-%s.scope" % CID))
    with pytest.raises(AttributeError):
        owner.confirmed = True
    with pytest.raises(TypeError):
        owner["confirmed"] = True   # the dict it was took this
    with pytest.raises(TypeError):
        assert owner["kind"]        # no dict-style read either: attributes only
    assert not hasattr(owner, "update") and not hasattr(owner, "get")
    # A different value is a new record; the one built stays as it was.
    confirmed = owner._replace(confirmed=True, name="hog")
    assert (owner.confirmed, owner.name) == (None, None) and (confirmed.confirmed, confirmed.name) == (True, "hog")
    # A result changed afterwards never reaches the record it came from.
    pod_owner = own(v2("/kubepods/pod%s/%s" % (POD_UID, CID)))
    pod_owner.as_result()["pod"]["name"] = "changed"
    assert pod_owner.pod["name"] is None


def test_an_owner_field_that_does_not_exist_is_refused_by_name():
    with pytest.raises(TypeError, match="no owner field colour"):
        owner_mod.new_owner(owner_mod.CONTAINER, colour="red")


def test_describe_names_what_a_person_can_act_on():
    pod = own(v2("/kubepods/pod%s/%s" % (POD_UID, CID)))
    pod = pod._replace(pod=dict(pod.pod, namespace="infer", name="sglang-0"))
    assert owner_mod.describe(pod) == "Kubernetes pod infer/sglang-0 (uid %s)" % POD_UID
    ctr = own(v2("/machine.slice/libpod-%s.scope" % CID))._replace(name="hog")
    assert owner_mod.describe(ctr) == "podman container hog (%s)" % CID[:12]
    guest = own(v2("/lxc/101/ns/system.slice/sglang.service"))
    assert owner_mod.describe(guest) == "Proxmox guest 101, unit sglang.service inside it"


# --- the trust boundary (see also test_gpu_trust.py) --------------------------------------


def test_a_users_service_is_her_managers_unit_not_the_systems():
    # The case test_units_and_nothing states: the unit is hers, and nothing system-wide stops it.
    got = own(v2("/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service"))
    assert (got.kind, got.unit, got.manager, got.uid) == ("user", "vllm.service", "user", 1000)
    holder = make_holder(unit=None, owner=got._replace(confirmed=False))
    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_decide
    assert gpu_decide.units_to_stop([holder], set()) == []
    assert gpu_decide.user_units_to_stop([holder]) == []
    holder = holder._replace(owner=holder.owner._replace(confirmed=True))
    assert gpu_decide.units_to_stop([holder], set()) == []
    assert gpu_decide.user_units_to_stop([holder]) == [(1000, "vllm.service")]


def test_describe_escapes_names_users_chose():
    got = own(v2("/user.slice/user-1000.slice/user@1000.service/app.slice/x\x1b[2Jy.service"))
    assert "\x1b" not in owner_mod.describe(got) and "x\\x1b[2Jy.service" in owner_mod.describe(got)


# --- where systemd keeps a process, and the unit root named (the port_owner module's rules;
# before, tests/unit/roles/inference_service/test_port_owner.py proved them of the role's script)

@pytest.mark.parametrize("path, unit", [
    ("/system.slice/sglang.service", "sglang.service"),
    ("/user.slice/user-0.slice/session-4.scope", "session-4.scope"),
    # alice names every directory below her user manager: none of them is a unit root knows.
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/sglang.service", "user@1000.service"),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/docker-" + "a" * 64 + ".scope", "user@1000.service"),
    ("/user.slice/user-1000.slice/user@1000.service/kubepods-besteffort-pod1.slice/x.service", "user@1000.service"),
    ("/", None), (None, None),
])
def test_root_named_unit_never_names_a_unit_inside_a_users_subtree(path, unit):
    assert owner_mod.root_named_unit(path) == unit


def test_root_named_unit_stops_where_a_directory_is_not_roots():
    # A system service with Delegate= to its user: the unit is root's, what its user made below is not.
    path = "/system.slice/sglang.service/evil.service"
    # owners of: the hierarchy's root, system.slice, sglang.service (delegated: its user's), evil.service
    assert owner_mod.root_named_unit(path, [0, 0, 1000, 1000]) == "sglang.service"
    assert owner_mod.root_named_unit(path, [0, 0, 0, 0]) == "evil.service"
    assert owner_mod.root_named_unit(path, [0, 1000, 1000, 1000]) is None    # system.slice not root's


@pytest.mark.parametrize("path, group, inside", [
    ("/system.slice/sglang.service", "/system.slice/sglang.service", True),
    ("/system.slice/sglang.service/worker", "/system.slice/sglang.service", True),
    ("/system.slice/sglang.service-evil", "/system.slice/sglang.service", False),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/sglang.service", "/system.slice/sglang.service", False),
    ("/system.slice/sglang.service", None, False),      # no unit (not loaded): nothing is its
    (None, "/system.slice/sglang.service", False),
])
def test_within_is_the_units_own_control_group_or_below(path, group, inside):
    assert owner_mod.within(path, group) is inside


def test_systemd_path_prefers_the_name_systemd_hierarchy_then_v2():
    hybrid = "9:name=systemd:/system.slice/a.service\n1:cpu:/\n0::/system.slice/b.service\n"
    assert owner_mod.systemd_path(hybrid, unified=False) == "/system.slice/a.service"
    assert owner_mod.systemd_path("0::/system.slice/b.service\n", unified=False) == "/system.slice/b.service"
    assert owner_mod.systemd_path("", unified=False) is None


def test_systemd_path_on_a_unified_host_is_the_v2_line_whatever_name_systemd_says():
    # Read on a lab container node (its own cgroup v2 tree under nspawn, on a hybrid host): the
    # kernel lists the outer host's name=systemd hierarchy as "/" for every process, while the
    # node's systemd keeps the server of a podman unit (--cgroups=split) in the v2 path.
    seen = ("9:name=systemd:/\n8:pids:/\n1:cpu:/\n"
            "0::/system.slice/fakeserve.service/libpod-payload-" + "c" * 64 + "\n")
    assert owner_mod.systemd_path(seen, unified=True) == "/system.slice/fakeserve.service/libpod-payload-" + "c" * 64
    assert owner_mod.within(owner_mod.systemd_path(seen, unified=True), "/system.slice/fakeserve.service")
    assert owner_mod.systemd_path("9:name=systemd:/x.service\n", unified=True) == "/x.service"
