"""The lab's SSH key and the ssh command line that reaches a node as root."""

import os
import shlex
import subprocess

from . import paths

SSH_OPTIONS = [
    "-o", "BatchMode=yes",
    # Every node is rebuilt from one tree and reuses addresses: host keys mean nothing here.
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR",
    "-o", "ConnectTimeout=5",
]


def ensure_key():
    """Create the lab key pair once; return the private key path."""
    if not os.path.exists(paths.SSH_KEY):
        os.makedirs(os.path.dirname(paths.SSH_KEY), mode=0o700, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuops-lab", "-f", paths.SSH_KEY],
            check=True,
        )
    return paths.SSH_KEY


def public_key():
    with open(ensure_key() + ".pub") as f:
        return f.read()


def remote_command(argv):
    """One argument is a shell command line; several are an argument vector to quote."""
    if len(argv) == 1:
        return argv[0]
    return " ".join(shlex.quote(a) for a in argv)


def ssh_argv(ip, command):
    return ["ssh", "-i", paths.SSH_KEY, *SSH_OPTIONS, f"root@{ip}", command]


def answers(ip, timeout=10):
    try:
        result = subprocess.run(
            ssh_argv(ip, "true"), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, timeout=timeout, check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0
