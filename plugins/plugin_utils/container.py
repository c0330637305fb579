# -*- coding: utf-8 -*-
# Copyright: gpuops.reclaim maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run arguments of an inference server in a container (docker or podman).

The logic of the container_run filter (plugins/filter/container_run.py). It turns the role's
container variables into the words after `RUNTIME run`, in groups (one line of the unit each),
always in the same order, so the same inputs give the same unit text and no spurious restart.
What belongs to the systemd unit that wraps the runtime (podman's --cidfile=%t/..., --sdnotify)
is written by the role's template, not here: systemd specifiers must not be quoted.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible.errors import AnsibleFilterError

RUNTIMES = ("docker", "podman")
# How a GPU reaches the container:
#   docker  --gpus '"device=0,1"' (the NVIDIA container toolkit renumbers them 0..n-1 inside)
#   cdi     --device nvidia.com/gpu=N per GPU (podman with NVIDIA's CDI spec; renumbered too)
#   nodes   --device /dev/nvidiaN per GPU plus the control nodes (no toolkit, no CDI spec):
#           nothing renumbers, the driver still lists every GPU, so CUDA_VISIBLE_DEVICES
#           names the host's indices as the systemd unit does
GPU_MODES = ("docker", "cdi", "nodes")
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INDEX = re.compile(r"^[0-9]+$")


def _fail(what, value, hint):
    raise AnsibleFilterError("container_run: bad %s %r: %s" % (what, value, hint))


def container_run(opts):
    """dict -> list of word groups for `RUNTIME run` (before the image).

    opts: runtime, name, gpus, gpu_mode, network ('host' or a network name), host, port,
    ipc ('' leaves the runtime's default), shm_size ('' leaves it), mounts (list of
    'SRC:DST[:OPTS]'), env (dict), args (list of extra words, verbatim).
    """
    runtime = opts.get("runtime")
    if runtime not in RUNTIMES:
        _fail("runtime", runtime, "one of %s" % ", ".join(RUNTIMES))
    name = opts.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        _fail("container name", name, "letters, digits, '_', '.', '-', starting with a letter or digit")
    mode = opts.get("gpu_mode")
    if mode not in GPU_MODES or (mode == "docker") != (runtime == "docker"):
        _fail("GPU mode", mode, "docker for docker; cdi or nodes for podman")
    gpus = [str(g) for g in opts.get("gpus") or []]
    if not gpus or not all(_INDEX.match(g) for g in gpus):
        _fail("GPU list", opts.get("gpus"), "NVML indices, at least one")

    groups = [["--name", name]]
    network = opts.get("network") or "host"
    if network == "host":
        groups.append(["--network", "host"])
    else:
        port = str(opts.get("port"))
        host = opts.get("host") or ""
        publish = "%s:%s:%s" % (host, port, port) if host not in ("", "0.0.0.0", "::") else "%s:%s" % (port, port)
        groups.append(["--network", network, "--publish", publish])
    if opts.get("ipc"):
        groups.append(["--ipc", str(opts["ipc"])])
    if opts.get("shm_size"):
        groups.append(["--shm-size", str(opts["shm_size"])])

    if mode == "docker":
        # The value's own double quotes keep docker's CSV parser from splitting at the comma.
        groups.append(["--gpus", '"device=%s"' % ",".join(gpus)])
    elif mode == "cdi":
        groups.extend(["--device", "nvidia.com/gpu=%s" % g] for g in gpus)
    else:
        groups.extend(["--device", "/dev/nvidia%s" % g] for g in gpus)
        groups.extend(["--device", node] for node in opts.get("control_nodes", CONTROL_NODES))

    env = [("CUDA_DEVICE_ORDER", "PCI_BUS_ID")]
    if mode == "nodes":
        env.append(("CUDA_VISIBLE_DEVICES", ",".join(gpus)))
    user_env = opts.get("env") or {}
    if not isinstance(user_env, dict):
        _fail("environment", user_env, "a mapping of NAME: value")
    for key in sorted(user_env):
        if not isinstance(key, str) or not _ENV.match(key):
            _fail("environment variable name", key, "letters, digits and '_', not starting with a digit")
        if key in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
            _fail("environment variable", key, "the GPUs come from inference_service_gpus")
        env.append((key, str(user_env[key])))
    groups.extend(["--env", "%s=%s" % kv] for kv in env)

    for mount in opts.get("mounts") or []:
        if not isinstance(mount, str) or mount.count(":") not in (1, 2) or not mount.split(":")[1].startswith("/"):
            _fail("mount", mount, "'SRC:DST' or 'SRC:DST:OPTIONS' with an absolute DST")
        groups.append(["--volume", mount])
    extra = opts.get("args") or []
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        _fail("extra run arguments", extra, "a list of strings")
    if extra:
        groups.append(list(extra))
    return groups


# A container runtime's scope for one container (systemd cgroup driver), as the port's owner shows it.
_RUNTIME_SCOPE = re.compile(r"^(docker|libpod)-([0-9a-f]{64})\.scope$")
_SCOPE_RUNTIME = {"docker": "docker", "libpod": "podman"}


def container_takeover(takeover, port_owners, holders, own=""):
    """Split the hand-started servers to adopt into those in a docker or podman container and the rest.

    takeover: server_takeover's result; port_owners: the port_owner module's owners; holders: gpu_holders'
    holders (each with its cgroup `owner`). A container is known only from a GPU holder's owner
    (gpu_holders reads it from the cgroup and the runtime confirms it: `confirmed` false or not yet
    asked leaves it out); a port owner in a runtime's scope belongs to it when the scope names the same container.
    Such a server is stopped through its runtime, never signalled or moved into a scope (its
    restart policy would start it again), and never removed.

    own: the ID of the managed unit's own container (docker: its processes are in docker's cgroup,
    outside the unit; the role reads the ID from the unit's `docker run --cidfile`): its confirmed
    GPU holders are the server's, moved from 'adopt' and 'strays' to 'ours'.

    Returns takeover with 'adopt' less the containers' processes, 'containers':
    [{runtime, id, name, pids, why}], and a port owner in a container that holds none of the
    server's GPUs moved to 'refuse' (nothing confirms which container it is).
    """
    containers, by_pid, ours = {}, {}, set()
    for holder in holders or []:
        owner = holder.get("owner") or {}
        if owner.get("kind") != "container" or owner.get("runtime") not in ("docker", "podman"):
            continue
        # gpu_holders says whether the runtime confirmed the container (sec-owner's `confirmed`);
        # an owner without the field (a collection before it) named the container from `inspect`.
        if not owner.get("id") or owner.get("confirmed", True) is not True:
            continue
        if own and owner["id"] == own:
            ours.add(holder["pid"])
            continue
        by_pid[holder["pid"]] = owner
    scope_of = {}
    for proc in port_owners or []:
        found = _RUNTIME_SCOPE.match(proc.get("unit") or "")
        if found:
            scope_of[proc["pid"]] = (_SCOPE_RUNTIME[found.group(1)], found.group(2))
    known = dict(((o["runtime"], o["id"]), o) for o in by_pid.values())
    result = dict(takeover, adopt=[], containers=[], refuse=list(takeover.get("refuse") or []),
                  strays=[h for h in takeover.get("strays") or [] if h.get("pid") not in ours],
                  ours=sorted(set(takeover.get("ours") or []) | ours))
    for entry in takeover.get("adopt") or []:
        if entry["pid"] in ours or (own and scope_of.get(entry["pid"], ("", ""))[1] == own):
            result["ours"] = sorted(set(result["ours"]) | {entry["pid"]})
            continue
        owner = by_pid.get(entry["pid"])
        if owner is None and entry["pid"] in scope_of:
            owner = known.get(scope_of[entry["pid"]])
            if owner is None:
                runtime, cid = scope_of[entry["pid"]]
                result["refuse"].append(
                    "the port is taken by PID %s (%s) in %s container %s, which holds none of the server's GPUs"
                    % (entry["pid"], entry.get("name"), runtime, cid[:12]))
                continue
        if owner is None:
            result["adopt"].append(entry)
            continue
        key = (owner["runtime"], owner["id"])
        if key not in containers:
            containers[key] = {"runtime": owner["runtime"], "id": owner["id"], "name": owner.get("name"),
                               "pids": [], "why": []}
            result["containers"].append(containers[key])
        containers[key]["pids"].append(entry["pid"])
        containers[key]["why"].append("PID %s %s" % (entry["pid"], entry.get("why")))
    for item in result["containers"]:
        item["why"] = ", ".join(item["why"])
    return result
