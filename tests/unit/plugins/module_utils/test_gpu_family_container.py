"""gpu_family_container: each container runtime's cgroup layout, recognised as that runtime's
container, from real /proc/PID/cgroup texts. Each case names where its layout comes from: the
runtime's source, its documentation, a public write-up quoting a real host, or this project's
lab (podman 4.3.1 in a lab node). Its lever in the ladder: a container is stopped through its
runtime before any signal, and never without stop_containers."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_flow import Ladder

from .observations import CID, CTX, V1_ROOTS, gpu, own, proc, runtime_confirms, v1, v2
from .test_gpu_flow import NO_SUCH_PID, ScriptedSurveyor, survey_of


def test_podman_systemd_driver_v2_as_seen_in_the_lab():
    # Read in this project's lab: podman 4.3.1 (Debian 12) with runc, rootful, cgroup v2,
    # systemd cgroup manager: libpod's scope "libpod-<id>.scope" in machine.slice.
    # The v1 lines are "/" because the node's cgroup namespace roots them there.
    text = V1_ROOTS + "9:name=systemd:/\n" + v2("/machine.slice/libpod-%s.scope" % CID)
    got = own(text)
    assert (got.kind, got.runtime, got.id) == ("container", "podman", CID)
    assert got.unit == "libpod-%s.scope" % CID


def test_podman_crun_payload_subgroup_v2():
    # crun can put the payload in a subgroup of the scope (the run.oci.systemd.subgroup
    # annotation, crun(1)): whatever lies below the container's scope is the container's.
    got = own(v2("/machine.slice/libpod-%s.scope/container" % CID))
    assert (got.kind, got.runtime, got.id) == ("container", "podman", CID)


def test_podman_cgroupfs_manager_v1():
    # podman --cgroup-manager=cgroupfs: containers/podman libpod (runtime_ctr.go) sets
    # CgroupParent = CgroupfsDefaultCgroupParent, "/libpod_parent"; public detection code
    # quotes a real host: "podman: /libpod_parent/libpod-73a4fb97...".
    got = own(v1("/libpod_parent/libpod-%s" % CID))
    assert (got.kind, got.runtime, got.id) == ("container", "podman", CID)


def test_podman_conmon_scope_is_not_the_container():
    # conmon runs in "libpod-conmon-<id>.scope" beside the container's scope (podman's
    # systemd cgroup manager); it holds no GPU and stopping it is not stopping the container.
    got = own(v2("/machine.slice/libpod-conmon-%s.scope" % CID))
    assert got.kind == "scope" and got.runtime is None


def test_docker_systemd_driver_v2():
    # moby/moby cmd/dockerd/daemon_systemd_unix.go newCgroupParent: with the systemd driver
    # the parent is "system.slice:docker:" and runc names the unit "docker-<id>.scope".
    got = own(v2("/system.slice/docker-%s.scope" % CID))
    assert (got.kind, got.runtime, got.id) == ("container", "docker", CID)
    assert got.unit == "docker-%s.scope" % CID


def test_docker_cgroupfs_driver_v1_hybrid():
    # moby/moby newCgroupParent: cgroupfs driver parent "docker" -> "/docker/<id>" in every
    # v1 hierarchy; on a hybrid host the unified line shows the same path.
    got = own(v1("/docker/%s" % CID) + v2("/docker/%s" % CID))
    assert (got.kind, got.runtime, got.id) == ("container", "docker", CID)


def test_nerdctl_systemd_driver():
    # containerd/nerdctl generateCgroupPath: with the systemd driver the cgroups path is
    # slice + ":nerdctl:" + id, which runc turns into "nerdctl-<id>.scope" in that slice.
    got = own(v2("/system.slice/nerdctl-%s.scope" % CID))
    assert (got.kind, got.runtime, got.id, got.namespace) == ("container", "containerd", CID, "default")


def test_containerd_cgroupfs_namespace_parent():
    # containerd oci/spec.go populateDefaultUnixSpec: CgroupsPath = filepath.Join("/", ns, id),
    # the containerd namespace as parent (ctr run, nerdctl with the cgroupfs driver).
    got = own(v2("/default/%s" % CID))
    assert (got.kind, got.runtime, got.id, got.namespace) == ("container", "containerd", CID, "default")


def container_held(nspid=None, policy=None):
    cgroup = '0::/machine.slice/libpod-%s.scope\n' % CID
    survey = survey_of([gpu(0, used=5000, processes=[(NO_SUCH_PID, 5000)])],
                       [proc(NO_SUCH_PID, fds=CTX, maps=CTX, nspid=nspid, cgroup=cgroup)],
                       facts=runtime_confirms(cgroup))
    survey.holders = [h._replace(owner=h.owner._replace(name='hog', restart_policy=policy)) for h in survey.holders]
    return survey


def changing(result):
    return [(a['step'], a.get('container'), a.get('runtime'), a['result']) for a in result['actions'] if a['changed']]


def test_check_mode_plans_the_container_stop_before_any_signal():
    result = Ladder(ScriptedSurveyor(container_held(nspid=[NO_SUCH_PID, 1])), check_mode=True).run()
    assert changing(result) == [('stop_container', CID, 'podman', 'would stop it (grace 30.0s)')]
    assert result['actions'][0]['step'] == 'stop_container' and result['changed'] is True


def test_check_mode_plans_nothing_for_a_container_init_without_the_lever():
    result = Ladder(ScriptedSurveyor(container_held(nspid=[NO_SUCH_PID, 1])), check_mode=True,
                    stop_containers=False).run()
    assert changing(result) == [] and result['changed'] is False


def test_without_the_lever_a_restarting_container_is_not_fought():
    result = Ladder(ScriptedSurveyor(container_held(policy='always')), check_mode=True,
                    stop_containers=False).run()
    assert not [a for a in result['actions'] if a['step'].startswith('sig')]
    plain = Ladder(ScriptedSurveyor(container_held(policy=None)), check_mode=True,
                   stop_containers=False).run()
    assert [a['step'] for a in plain['actions'] if a['step'].startswith('sig')][:1] == ['sigterm']
