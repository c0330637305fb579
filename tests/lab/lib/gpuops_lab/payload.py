"""What goes into a node's tree before it boots: identity, SSH access, the stand-in driver.

Files land in the node's overlay root, which is the node's live "/" once it runs, so the
tools can be refreshed on a running node too. Every replacement is a rename: a process that
has the old libnvidia-ml.so.1 mapped keeps a valid file.
"""

import os
import shutil
import subprocess

from . import paths, ssh

FAKEGPU_DIR = os.path.join(paths.REPO, "tests", "fakegpu")
FAKEGPU_LIB = os.path.join(FAKEGPU_DIR, "build", "libnvidia-ml.so.1")
FAKESERVE_DIR = os.path.join(paths.REPO, "tests", "fakeserve")
NODE_HELPERS = os.path.join(paths.LAB_DIR, "node")

LIB_DEST = "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
OPT = "opt/gpuops-lab"
# Inside the node: the command name on PATH -> (source dir, file in it).
COMMANDS = {
    "fakegpu": (FAKEGPU_DIR, "fakegpu"),
    "nvidia-smi": (FAKEGPU_DIR, "nvidia-smi"),
    "fakeserve": (FAKESERVE_DIR, "fakeserve"),
}
SKIP = shutil.ignore_patterns("build", "__pycache__", "*.pyc", "*.o")

DEVICE_UNIT = """\
[Unit]
Description=Stand-in GPU device files and config (fakegpu setup)
# nspawn gives the node a fresh /dev at every boot: the device files must be made again
# before anything (sshd, tests) can look for them.
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target ssh.service
ConditionPathExists=/usr/local/bin/fakegpu

[Service]
Type=oneshot
RemainAfterExit=yes
Environment=FAKEGPU_ROOT=/
ExecStart=/usr/local/bin/fakegpu setup --gpus {gpus}

[Install]
WantedBy=sysinit.target
"""


def missing_tools():
    """Paths of the stand-in's parts that are not built or written yet."""
    needed = [FAKEGPU_LIB, os.path.join(FAKEGPU_DIR, "fakegpu"), os.path.join(FAKEGPU_DIR, "nvidia-smi")]
    return [p for p in needed if not os.path.isfile(p)]


def _write(root, rel, text, mode=0o644):
    dest = os.path.join(root, rel)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = dest + ".lab-new"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, dest)


def _symlink(root, rel, target):
    dest = os.path.join(root, rel)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = dest + ".lab-new"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, dest)


def write_identity(root, name, ip, gpus):
    _write(root, "etc/hostname", name + "\n")
    _write(root, "etc/hosts", f"127.0.0.1\tlocalhost\n{ip}\t{name}\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    # Nodes share the controller's network: each sshd must take only its own address.
    _write(root, "etc/ssh/sshd_config.d/20-gpuops-lab-listen.conf", f"ListenAddress {ip}\n")
    os.makedirs(os.path.join(root, "root/.ssh"), mode=0o700, exist_ok=True)
    os.chmod(os.path.join(root, "root/.ssh"), 0o700)
    _write(root, "root/.ssh/authorized_keys", ssh.public_key(), mode=0o600)
    _write(root, "etc/environment", "FAKEGPU_ROOT=/\n")
    _write(root, "etc/systemd/system/fakegpu-devices.service", DEVICE_UNIT.format(gpus=gpus))
    _symlink(root, "etc/systemd/system/sysinit.target.wants/fakegpu-devices.service",
             "/etc/systemd/system/fakegpu-devices.service")


def _install_dir(root, src, name):
    """Copy a tool's directory to /opt/gpuops-lab/<name> in one rename."""
    dest = os.path.join(root, OPT, name)
    new, old = dest + ".lab-new", dest + ".lab-old"
    for leftover in (new, old):
        shutil.rmtree(leftover, ignore_errors=True)
    shutil.copytree(src, new, ignore=SKIP, symlinks=True)
    if os.path.exists(dest):
        os.rename(dest, old)
    os.rename(new, dest)
    shutil.rmtree(old, ignore_errors=True)


def install_tools(root):
    """Put the stand-in driver and commands into a node tree; return what was installed."""
    installed = []
    # The lab's own helpers for tests, e.g. lab-reset-gpus.
    for helper in sorted(os.listdir(NODE_HELPERS)):
        dest = os.path.join(root, "usr/local/sbin", helper)
        shutil.copy2(os.path.join(NODE_HELPERS, helper), dest + ".lab-new")
        os.replace(dest + ".lab-new", dest)
    if os.path.isfile(FAKEGPU_LIB):
        dest = os.path.join(root, LIB_DEST)
        shutil.copy2(FAKEGPU_LIB, dest + ".lab-new")
        os.replace(dest + ".lab-new", dest)
        # The node's dynamic loader must find it by soname, as with the real driver.
        subprocess.run(["ldconfig", "-r", root], check=True)
        installed.append("libnvidia-ml.so.1")
    copied = set()
    for command, (src_dir, filename) in COMMANDS.items():
        if not os.path.isfile(os.path.join(src_dir, filename)):
            continue
        dir_name = os.path.basename(src_dir)
        if dir_name not in copied:
            # The whole directory travels, so whatever a command loads from beside itself is there.
            _install_dir(root, src_dir, dir_name)
            copied.add(dir_name)
        _symlink(root, f"usr/local/bin/{command}", f"/{OPT}/{dir_name}/{filename}")
        installed.append(command)
    return installed
