"""Where the lab keeps things, and how a node's name maps to its address."""

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))))
LAB_DIR = os.path.join(REPO, "tests", "lab")

# The base tree is expensive (debootstrap), so it lives outside the checkout and is shared.
CACHE = os.environ.get("LAB_CACHE", "/var/cache/gpuops-lab")
BASE = os.path.join(CACHE, "base-bookworm")
# LAB_CONTAINERS=1: nodes also get the podman layer (tests/lab/build-podman-layer) and a
# cgroup v2 tree; other labs' nodes stay without both.
CONTAINERS = os.environ.get("LAB_CONTAINERS") == "1"
PODMAN_LAYER = os.path.join(CACHE, "podman-bookworm")
# LAB_RUNTIMES=1: nodes get the runtimes layer instead (tests/lab/build-runtimes-layer:
# docker.io, supervisor, runit, lxc) and a cgroup v2 tree.
RUNTIMES = os.environ.get("LAB_RUNTIMES") == "1"
RUNTIMES_LAYER = os.path.join(CACHE, "runtimes-bookworm")
# Each layer: its directory, the script that builds it, and the tools a node booted from it
# has (the node's record lists them; tests skip on nodes without theirs).
LAYERS = {
    "LAB_CONTAINERS": (PODMAN_LAYER, "build-podman-layer", ["podman"]),
    "LAB_RUNTIMES": (RUNTIMES_LAYER, "build-runtimes-layer", ["docker", "supervisord", "runit", "lxc"]),
}
LAYER_TOOLS = {tool for _dir, _build, tools in LAYERS.values() for tool in tools}
if CONTAINERS and RUNTIMES:
    # Both layers install into the base's dpkg database: stacked, one would hide the other's.
    raise SystemExit("lab: error: LAB_CONTAINERS=1 and LAB_RUNTIMES=1 are separate labs; set one of them")
LAYER = LAYERS["LAB_CONTAINERS"] if CONTAINERS else LAYERS["LAB_RUNTIMES"] if RUNTIMES else None
# Node layers and the SSH key survive a reboot of the controller; records of running nodes
# must not, so they live on /run.
STATE = os.environ.get("LAB_STATE", "/var/lib/gpuops-lab")
NODES_DIR = os.path.join(STATE, "nodes")
SSH_KEY = os.path.join(STATE, "ssh", "id_ed25519")
RUN = os.environ.get("LAB_RUN", "/run/gpuops-lab")
RECORDS_DIR = os.path.join(RUN, "nodes")
INVENTORY = os.path.join(RUN, "inventory.ini")
LOCK = os.path.join(RUN, "lock")

MAX_NODES = 20
MAX_GPUS = 64
DEFAULT_GPUS = 8

NODE_NAME = re.compile(r"^node([1-9][0-9]*)$")


def node_name(index):
    return f"node{index}"


# A second lab beside the default one (another developer's, on the same controller) needs
# its own LAB_STATE, LAB_RUN and addresses: LAB_ADDR_BASE=100 puts nodeI on 127.0.0.(100+I).
_addr_base = os.environ.get("LAB_ADDR_BASE", "10")
if not _addr_base.isdigit() or not 1 <= int(_addr_base) <= 254 - MAX_NODES:
    raise SystemExit(f"lab: error: LAB_ADDR_BASE must be a whole number from 1 to {254 - MAX_NODES}, got '{_addr_base}'")
ADDR_BASE = int(_addr_base)


def machine_name(name):
    """The nspawn machine name of a node: unique per lab, since nspawn keeps runtime state
    under /run/systemd/nspawn/*/MACHINE and `down` finds orphans by it."""
    return f"gpuops{ADDR_BASE}-{name}"


def node_from_machine(machine):
    """The node name of one of this lab's machine names, or None for another lab's."""
    prefix = f"gpuops{ADDR_BASE}-"
    return machine[len(prefix):] if machine.startswith(prefix) else None


def node_ip(index):
    # 127.0.0.0/8 is all loopback on Linux: every node gets its own address with no
    # interface configuration, so there is nothing to remove afterwards.
    return f"127.0.0.{ADDR_BASE + index}"


def node_dir(name):
    return os.path.join(NODES_DIR, name)


def record_path(name):
    return os.path.join(RECORDS_DIR, name + ".json")
