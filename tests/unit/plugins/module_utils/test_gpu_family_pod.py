"""gpu_family_pod: a Kubernetes pod's cgroup layouts (the kubelet's systemd and cgroupfs drivers),
recognised as the pod and its container, from real /proc/PID/cgroup texts."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

from .observations import CID, CID2, POD_UID, own, v1, v2


def test_pod_systemd_driver_containerd_burstable():
    # kubelet (pkg/kubelet/cm, the systemd cgroup driver): kubepods.slice /
    # kubepods-<qos>.slice / kubepods-<qos>-pod<uid, '-' as '_'>.slice; containerd's CRI
    # getCgroupsPath joins "<slice>:cri-containerd:<id>" -> "cri-containerd-<id>.scope".
    path = ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/"
            "cri-containerd-%s.scope" % (POD_UID.replace("-", "_"), CID))
    got = own(v2(path))
    assert got.kind == "pod"
    assert got.pod["uid"] == POD_UID
    assert (got.runtime, got.id) == ("cri-containerd", CID)


def test_pod_guaranteed_crio():
    # Guaranteed pods sit directly under kubepods.slice (no QoS slice); CRI-O names the
    # container's scope "crio-<id>.scope" (its conmon's "crio-conmon-<id>.scope").
    path = "/kubepods.slice/kubepods-pod%s.slice/crio-%s.scope" % (POD_UID.replace("-", "_"), CID)
    got = own(v2(path))
    assert (got.kind, got.runtime, got.pod["uid"]) == ("pod", "cri-o", POD_UID)


def test_pod_cgroupfs_driver_v1():
    # kubelet cgroupfs driver: /kubepods/<qos>/pod<uid>/<container id>; this exact path is a
    # real GKE node's, from Qard/container-info test/fixtures.
    path = "/kubepods/besteffort/pod%s/%s" % (POD_UID, CID2)
    got = own(v1(path))
    assert (got.kind, got.id, got.pod["uid"]) == ("pod", CID2, POD_UID)
