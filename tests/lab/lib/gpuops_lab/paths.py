"""Where the lab keeps things, and how a node's name maps to its address."""

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))))
LAB_DIR = os.path.join(REPO, "tests", "lab")

# The base tree is expensive (debootstrap), so it lives outside the checkout and is shared.
CACHE = os.environ.get("LAB_CACHE", "/var/cache/gpuops-lab")
BASE = os.path.join(CACHE, "base-bookworm")
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


def node_ip(index):
    # 127.0.0.0/8 is all loopback on Linux: every node gets its own address with no
    # interface configuration, so there is nothing to remove afterwards.
    return f"127.0.0.{10 + index}"


def node_dir(name):
    return os.path.join(NODES_DIR, name)


def record_path(name):
    return os.path.join(RECORDS_DIR, name + ".json")
