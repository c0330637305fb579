"""The container's run arguments: what follows `docker run` / `podman run` in the unit."""
import importlib.util
import pathlib
import shlex

import pytest
from ansible.errors import AnsibleFilterError

_ROOT = pathlib.Path(__file__).resolve().parents[4]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, _ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


container_run = _load("gpuops_container", "plugins/plugin_utils/container.py").container_run
systemd_quote = _load("gpuops_flags_for_container", "plugins/plugin_utils/flags.py").systemd_quote


def opts(**over):
    base = {"runtime": "podman", "name": "sglang", "gpus": ["2", "3"], "gpu_mode": "cdi", "network": "host",
            "host": "10.0.0.5", "port": 30000, "ipc": "host", "shm_size": "", "mounts": [], "env": {}, "args": []}
    base.update(over)
    return base


def words(groups):
    return [w for g in groups for w in g]


def test_podman_cdi_names_each_gpu_and_sets_no_visible_devices():
    groups = container_run(opts(shm_size="32g", env={"HF_TOKEN": "x", "A": "1"},
                                mounts=["/root/.cache/huggingface:/root/.cache/huggingface"]))
    assert groups == [["--name", "sglang"], ["--network", "host"], ["--ipc", "host"], ["--shm-size", "32g"],
                      ["--device", "nvidia.com/gpu=2"], ["--device", "nvidia.com/gpu=3"],
                      ["--env", "CUDA_DEVICE_ORDER=PCI_BUS_ID"], ["--env", "A=1"], ["--env", "HF_TOKEN=x"],
                      ["--volume", "/root/.cache/huggingface:/root/.cache/huggingface"]]
    # CDI renumbers the container's GPUs 0..n-1: the host's indices must not leak in.
    assert not [w for w in words(groups) if w.startswith("CUDA_VISIBLE_DEVICES")]


def test_podman_device_nodes_keep_host_indices():
    argv = words(container_run(opts(gpu_mode="nodes")))
    assert argv[argv.index("--ipc") + 2:] == [
        "--device", "/dev/nvidia2", "--device", "/dev/nvidia3", "--device", "/dev/nvidiactl",
        "--device", "/dev/nvidia-uvm", "--env", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "--env", "CUDA_VISIBLE_DEVICES=2,3"]


def test_docker_gpus_survive_the_unit_quoting_as_docker_documents_them():
    groups = container_run(opts(runtime="docker", gpu_mode="docker"))
    gpus = [g for g in groups if g[0] == "--gpus"][0]
    assert gpus == ["--gpus", '"device=2,3"']
    # systemd's ExecStart= parser unquotes like a shell: docker gets the value with its quotes,
    # the form `docker run --gpus '"device=2,3"'` gives it.
    assert shlex.split(" ".join(systemd_quote(gpus))) == shlex.split("--gpus '\"device=2,3\"'")


def test_a_published_port_listens_on_the_host_address():
    groups = container_run(opts(network="bridge"))
    assert ["--network", "bridge", "--publish", "10.0.0.5:30000:30000"] in groups
    assert ["--network", "bridge", "--publish", "30000:30000"] in container_run(opts(network="bridge", host="0.0.0.0"))


def test_same_inputs_same_words_whatever_the_env_order():
    a = container_run(opts(env={"B": "2", "A": "1"}))
    b = container_run(opts(env={"A": "1", "B": "2"}))
    assert a == b


def test_empty_ipc_and_shm_leave_the_runtime_default():
    argv = words(container_run(opts(ipc="", shm_size="")))
    assert "--ipc" not in argv and "--shm-size" not in argv


def test_extra_args_come_verbatim_before_the_image():
    groups = container_run(opts(args=["--ulimit", "memlock=-1"]))
    assert groups[-1] == ["--ulimit", "memlock=-1"]


@pytest.mark.parametrize("over, says", [
    ({"runtime": "lxc"}, "bad runtime 'lxc'"),
    ({"name": "a b"}, "bad container name 'a b'"),
    ({"gpu_mode": "docker"}, "bad GPU mode 'docker'"),
    ({"runtime": "docker", "gpu_mode": "cdi"}, "bad GPU mode 'cdi'"),
    ({"gpus": []}, "bad GPU list []"),
    ({"gpus": ["0", "x"]}, "bad GPU list ['0', 'x']"),
    ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "bad environment variable 'CUDA_VISIBLE_DEVICES'"),
    ({"env": {"1X": "0"}}, "bad environment variable name '1X'"),
    ({"mounts": ["/data"]}, "bad mount '/data'"),
    ({"mounts": ["/data:rel"]}, "bad mount '/data:rel'"),
    ({"args": "--privileged"}, "bad extra run arguments '--privileged'"),
])
def test_bad_input_is_refused_naming_it(over, says):
    with pytest.raises(AnsibleFilterError) as err:
        container_run(opts(**over))
    assert says in str(err.value)


container_takeover = _load("gpuops_container_t", "plugins/plugin_utils/container.py").container_takeover
CID = "a" * 64
OTHER = "b" * 64


def holder(pid, owner):
    return {"pid": pid, "gpus": ["0"], "owner": owner}


def ctr(cid=CID, runtime="podman", **more):
    return dict({"kind": "container", "runtime": runtime, "id": cid, "name": "sglang", "unit": "libpod-%s.scope" % cid}, **more)


def test_a_hand_started_container_is_adopted_through_its_runtime_not_signalled():
    takeover = {"ours": [], "refuse": [], "strays": [],
                "adopt": [{"pid": 10, "why": "listens on the port"}, {"pid": 11, "why": "holds GPU 0"},
                          {"pid": 12, "why": "holds GPU 1"}]}
    owners = [{"pid": 10, "unit": "libpod-%s.scope" % CID}]
    holders = [holder(11, ctr()), holder(12, {"kind": "scope", "unit": "session-3.scope"})]
    out = container_takeover(takeover, owners, holders)
    # The launcher (port only) and the rank (GPU) are one container; the session's process stays with service_adopt.
    assert out["containers"] == [{"runtime": "podman", "id": CID, "name": "sglang", "pids": [10, 11],
                                  "why": "PID 10 listens on the port, PID 11 holds GPU 0"}]
    assert [e["pid"] for e in out["adopt"]] == [12]
    assert out["refuse"] == []


def test_a_container_the_runtime_did_not_confirm_is_not_taken_for_one():
    takeover = {"ours": [], "refuse": [], "strays": [], "adopt": [{"pid": 11, "why": "holds GPU 0"}]}
    for confirmed in (False, None):
        out = container_takeover(takeover, [], [holder(11, ctr(confirmed=confirmed))])
        assert out["containers"] == [] and [e["pid"] for e in out["adopt"]] == [11]
    assert container_takeover(takeover, [], [holder(11, ctr(confirmed=True))])["containers"][0]["pids"] == [11]


def test_a_port_owner_in_a_container_holding_no_gpu_of_the_server_is_refused():
    takeover = {"ours": [], "refuse": [], "strays": [], "adopt": [{"pid": 10, "name": "python3", "why": "listens on the port"}]}
    owners = [{"pid": 10, "unit": "docker-%s.scope" % OTHER}]
    out = container_takeover(takeover, owners, [holder(11, ctr())])
    assert out["adopt"] == [] and out["containers"] == []
    assert out["refuse"] == ["the port is taken by PID 10 (python3) in docker container bbbbbbbbbbbb, "
                             "which holds none of the server's GPUs"]


def test_other_runtimes_and_kinds_are_left_to_the_existing_paths():
    takeover = {"ours": [], "refuse": [], "strays": [], "adopt": [{"pid": 11, "why": "holds GPU 0"}]}
    out = container_takeover(takeover, [], [holder(11, ctr(runtime="cri-o"))])
    assert out["containers"] == [] and [e["pid"] for e in out["adopt"]] == [11]


def test_the_units_own_docker_container_is_ours_never_adopted_nor_a_stray():
    # docker: the unit's container sits in docker's scope, outside the unit. Its ID (the unit's
    # --cidfile) makes its confirmed holders and its scope's listener the server's; a container
    # of the same name but another ID (hand-started) is still adopted through docker.
    takeover = {"ours": [], "refuse": [], "strays": [holder(13, ctr(runtime="docker"))],
                "adopt": [{"pid": 10, "why": "listens on the port"}, {"pid": 11, "why": "holds GPU 0"},
                          {"pid": 12, "why": "holds GPU 1"}]}
    owners = [{"pid": 10, "unit": "docker-%s.scope" % CID}]
    holders = [holder(11, ctr(runtime="docker")), holder(13, ctr(runtime="docker")),
               holder(12, ctr(cid=OTHER, runtime="docker"))]
    out = container_takeover(takeover, owners, holders, own=CID)
    assert out["ours"] == [10, 11, 13]
    assert out["strays"] == [] and out["refuse"] == [] and out["adopt"] == []
    assert [(c["id"], c["pids"]) for c in out["containers"]] == [(OTHER, [12])]
    # Unconfirmed, the same ID proves nothing.
    out = container_takeover(takeover, [], [holder(11, ctr(runtime="docker", confirmed=False))], own=CID)
    assert 11 not in out["ours"]
    # Without `own` (podman, systemd) nothing changes.
    assert container_takeover(takeover, owners, holders)["containers"][0]["pids"] == [10, 11]
