"""gpu_family_container: each container runtime's cgroup layout, recognised as that runtime's
container, from real /proc/PID/cgroup texts. Each case names where its layout comes from: the
runtime's source, its documentation, a public write-up quoting a real host, or this project's
lab (podman 4.3.1 in a lab node)."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

from .observations import CID, V1_ROOTS, own, v1, v2


def test_podman_systemd_driver_v2_as_seen_in_the_lab():
    # Read in this project's lab: podman 4.3.1 (Debian 12) with runc, rootful, cgroup v2,
    # systemd cgroup manager: libpod's scope "libpod-<id>.scope" in machine.slice.
    # The v1 lines are "/" because the node's cgroup namespace roots them there.
    text = V1_ROOTS + "9:name=systemd:/\n" + v2("/machine.slice/libpod-%s.scope" % CID)
    got = own(text)
    assert (got["kind"], got["runtime"], got["id"]) == ("container", "podman", CID)
    assert got["unit"] == "libpod-%s.scope" % CID


def test_podman_crun_payload_subgroup_v2():
    # crun can put the payload in a subgroup of the scope (the run.oci.systemd.subgroup
    # annotation, crun(1)): whatever lies below the container's scope is the container's.
    got = own(v2("/machine.slice/libpod-%s.scope/container" % CID))
    assert (got["kind"], got["runtime"], got["id"]) == ("container", "podman", CID)


def test_podman_cgroupfs_manager_v1():
    # podman --cgroup-manager=cgroupfs: containers/podman libpod (runtime_ctr.go) sets
    # CgroupParent = CgroupfsDefaultCgroupParent, "/libpod_parent"; public detection code
    # quotes a real host: "podman: /libpod_parent/libpod-73a4fb97...".
    got = own(v1("/libpod_parent/libpod-%s" % CID))
    assert (got["kind"], got["runtime"], got["id"]) == ("container", "podman", CID)


def test_podman_conmon_scope_is_not_the_container():
    # conmon runs in "libpod-conmon-<id>.scope" beside the container's scope (podman's
    # systemd cgroup manager); it holds no GPU and stopping it is not stopping the container.
    got = own(v2("/machine.slice/libpod-conmon-%s.scope" % CID))
    assert got["kind"] == "scope" and got["runtime"] is None


def test_docker_systemd_driver_v2():
    # moby/moby cmd/dockerd/daemon_systemd_unix.go newCgroupParent: with the systemd driver
    # the parent is "system.slice:docker:" and runc names the unit "docker-<id>.scope".
    got = own(v2("/system.slice/docker-%s.scope" % CID))
    assert (got["kind"], got["runtime"], got["id"]) == ("container", "docker", CID)
    assert got["unit"] == "docker-%s.scope" % CID


def test_docker_cgroupfs_driver_v1_hybrid():
    # moby/moby newCgroupParent: cgroupfs driver parent "docker" -> "/docker/<id>" in every
    # v1 hierarchy; on a hybrid host the unified line shows the same path.
    got = own(v1("/docker/%s" % CID) + v2("/docker/%s" % CID))
    assert (got["kind"], got["runtime"], got["id"]) == ("container", "docker", CID)


def test_nerdctl_systemd_driver():
    # containerd/nerdctl generateCgroupPath: with the systemd driver the cgroups path is
    # slice + ":nerdctl:" + id, which runc turns into "nerdctl-<id>.scope" in that slice.
    got = own(v2("/system.slice/nerdctl-%s.scope" % CID))
    assert (got["kind"], got["runtime"], got["id"], got["namespace"]) == ("container", "containerd", CID, "default")


def test_containerd_cgroupfs_namespace_parent():
    # containerd oci/spec.go populateDefaultUnixSpec: CgroupsPath = filepath.Join("/", ns, id),
    # the containerd namespace as parent (ctr run, nerdctl with the cgroupfs driver).
    got = own(v2("/default/%s" % CID))
    assert (got["kind"], got["runtime"], got["id"], got["namespace"]) == ("container", "containerd", CID, "default")
