"""README "Prepare the GPU nodes", run exactly as written on a stock-like Debian 12 node.

The node is a fresh one of a second private lab (LAB2_*: see test_lab_isolation), with the
lab's preinstalled nvidia-ml-py and psutil removed, so that only what the playbook installs
can make the modules read NVML.
"""

import json
import os
import subprocess

import pytest

from .conftest import REPO, VENV_BIN, ansible_env
from .test_lab_isolation import LAB2, run_lab

VENV_PYTHON = "/opt/gpuops-reclaim/venv/bin/python"
STRIP_PREINSTALLED = ("rm -rf /usr/lib/python3/dist-packages/pynvml.py /usr/lib/python3/dist-packages/nvidia_ml_py*"
                      " && dpkg -r python3-psutil >/dev/null"
                      " && ! python3 -c 'import pynvml' 2>/dev/null && ! python3 -c 'import psutil' 2>/dev/null")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def ansible(argv, inventory, timeout=900):
    env = dict(ansible_env(), **LAB2)
    return subprocess.run([os.path.join(VENV_BIN, argv[0]), *argv[1:], "-i", inventory], env=env, cwd=REPO,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False)


def holders_backend(inventory, *extra):
    run = ansible(["ansible", "node1", "-m", "gpuops.reclaim.gpu_holders", "-a", "gpus=0", *extra], inventory)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.split("=>", 1)[1])["backend"]


def test_prepare_nodes_playbook_makes_the_modules_read_nvml_through_the_venv():
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    try:
        up = run_lab("up", "1", env=LAB2)
        assert up.returncode == 0, up.stderr
        inventory = up.stdout.strip().splitlines()[-1]
        stripped = run_lab("exec", "node1", STRIP_PREINSTALLED, env=LAB2)
        assert stripped.returncode == 0, stripped.stdout + stripped.stderr
        # This controller reaches PyPI through a TLS proxy whose CA only its own bundle
        # holds; a site like that gives its nodes the same pip setting. Nothing else is added.
        with open(CA_BUNDLE, "rb") as bundle:
            trusted = subprocess.run(
                [os.path.join(REPO, "tests", "lab", "lab"), "exec", "node1",
                 "cat > /etc/ssl/certs/controller-ca-bundle.crt && "
                 "printf '[global]\\ncert = /etc/ssl/certs/controller-ca-bundle.crt\\n' > /etc/pip.conf"],
                env=dict(os.environ, **LAB2), stdin=bundle, capture_output=True, timeout=60, check=False)
        assert trusted.returncode == 0, trusted.stderr
        # Without the playbook the modules have no NVML bindings: they fall back to nvidia-smi.
        assert holders_backend(inventory) == "nvidia-smi"

        first = ansible(["ansible-playbook", "gpuops.reclaim.prepare_nodes", "-l", "gpu_nodes"], inventory)
        assert first.returncode == 0, first.stdout + first.stderr
        assert f"ansible_python_interpreter={VENV_PYTHON}" in first.stdout
        again = ansible(["ansible-playbook", "gpuops.reclaim.prepare_nodes", "-l", "gpu_nodes"], inventory)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "changed=0" in again.stdout, again.stdout

        assert holders_backend(inventory, "-e", f"ansible_python_interpreter={VENV_PYTHON}") == "nvml"
    finally:
        run_lab("down", env=LAB2)
