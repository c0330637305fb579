"""A real LXC guest (Debian's lxc 5.0) booted inside a lab runtime node (LAB_RUNTIMES=1), for
test_lxc.py (a guest by name) and test_pct.py (a guest named by its Proxmox VMID, reached
through the stand-in `pct`).

The guest boots systemd from the lab's base tree (an overlay over the read-only base the node
has at /opt/gpuops-lab-base, its upper layer on the node's disk directory), shares the
node's network (lxc.net.0.type = none) with its sshd masked (unmasked as it comes, it listens
on [::]:22 of the controller's network), and gets the stand-in driver's device files, config,
state and library bind-mounted from the node, so a process in it holds stand-in memory as a
node process does. Its processes sit under /lxc.payload.NAME on the node.
"""

import pytest

from . import scenarios as sc

CONFIG = """\
lxc.uts.name = {hostname}
lxc.rootfs.path = dir:{dir}/rootfs
lxc.init.cmd = {init}
lxc.net.0.type = none
lxc.mount.auto = proc:mixed sys:ro cgroup:rw
lxc.apparmor.profile = unconfined
lxc.autodev = 1
lxc.tty.max = 0
lxc.log.file = {dir}/lxc.log
lxc.mount.entry = /opt/gpuops-lab opt/gpuops-lab none bind,ro,create=dir 0 0
lxc.mount.entry = /etc/fakegpu etc/fakegpu none bind,ro,create=dir 0 0
lxc.mount.entry = /var/lib/fakegpu var/lib/fakegpu none bind,create=dir 0 0
lxc.mount.entry = /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 none bind,ro,create=file 0 0
"""
START_GUEST = (
    "set -e; d=%(dir)s; mkdir -p $d/upper $d/work $d/rootfs /var/lib/lxc/%(guest)s; "
    "mountpoint -q $d/rootfs || mount -t overlay overlay "
    "-o lowerdir=/opt/gpuops-lab-base,upperdir=$d/upper,workdir=$d/work $d/rootfs; "
    "ln -sfn /dev/null $d/rootfs/etc/systemd/system/ssh.service; "
    "{ cat <<'EOF'\n%(config)sEOF\n"
    "for f in /dev/nvidia*; do echo \"lxc.mount.entry = $f ${f#/} none bind,create=file 0 0\"; done; "
    "} > /var/lib/lxc/%(guest)s/config; "
    "lxc-info -n %(guest)s -s | grep -q RUNNING || lxc-start -n %(guest)s; "
    "lxc-wait -n %(guest)s -s RUNNING -t 30")


def guest_dir(guest):
    """Where the guest's overlay layers live on the node's disk directory."""
    return "/var/lib/gpuops-lab-disk/lxc/%s" % guest


def in_guest(guest, cmd):
    return "lxc-attach -n %s -- %s" % (guest, cmd)


def require_lxc(lab, node):
    """Skip (saying why) unless the node is a runtime node with the stand-in driver."""
    tools = lab.status().get(node, {}).get("tools", [])
    if "lxc" not in tools:
        pytest.skip("the lab nodes have no lxc: run with LAB_RUNTIMES=1 after `tests/lab/lab down` "
                    "(tests/lab/README.md, 'Runtime nodes')")
    if "fakegpu" not in tools:
        pytest.skip("stand-in GPU driver not installed on %s: tests/fakegpu not built" % node)


INIT_SCRIPT = "/usr/local/sbin/gpuops-lab-init"


def boot(lab, node, guest, hostname=None, init=None):
    """Boot the guest `guest` (lxc-start -n GUEST) on `node` and wait until its systemd is up;
    with `init` (a shell script's text), that script is the guest's PID 1 instead of systemd
    (as a guest or container whose init is a loop restarting a server), and the boot is done
    when the guest runs."""
    directory = guest_dir(guest)
    config = CONFIG.format(hostname=hostname or guest, dir=directory,
                           init=INIT_SCRIPT if init else "/lib/systemd/systemd")
    if init:
        lab.exec(node, "set -e; d=%s/upper%s; mkdir -p $(dirname $d); cat > $d <<'EOF'\n%sEOF\n"
                       "chmod 755 $d" % (directory, INIT_SCRIPT, init))
    lab.exec(node, START_GUEST % {"dir": directory, "guest": guest, "config": config}, timeout=120)
    if init:
        return
    up = "%s 2>/dev/null | grep -qE '^(running|degraded)$'" % in_guest(guest, "systemctl is-system-running")
    sc.wait_until(lab, node, up, "systemd of LXC guest %s up" % guest, timeout=60)


def remove(lab, node, guest):
    """Stop the guest and delete everything boot() made for it."""
    directory = guest_dir(guest)
    lab.exec(node, "lxc-stop -n %s -k >/dev/null 2>&1; umount %s/rootfs 2>/dev/null; rm -rf %s /var/lib/lxc/%s; true"
             % (guest, directory, directory, guest), timeout=120)


def end_unit(lab, node, guest, unit):
    lab.exec(node, in_guest(guest, "sh -c 'systemctl stop %s; systemctl reset-failed %s' >/dev/null 2>&1; true"
                            % (unit, unit)), timeout=120)


def start_unit(lab, node, guest, unit, gpu, mib, title):
    """A Restart=always unit `unit` in the guest whose process (titled `title`) holds `mib` on
    `gpu`; its node PID."""
    lab.exec(node, in_guest(guest, "systemd-run --quiet --unit=%s -p Restart=always -p RestartSec=1 "
                                   "/opt/gpuops-lab/fakegpu/fakegpu hold --gpu %d:%d --title %s"
                            % (unit, gpu, mib, title)))
    sc.wait_until(lab, node, "[ \"$(fakegpu status | python3 -c 'import json,sys; "
                  "print([g for g in json.load(sys.stdin)[\"gpus\"] if g[\"index\"] == %d][0][\"memory_used_mib\"])')\" = %d ]"
                  % (gpu, mib), "guest unit holding %d MiB on GPU %d" % (mib, gpu))
    pids = [int(p) for p in lab.exec(node, "pgrep -x %s || true" % title).stdout.split()]
    assert len(pids) == 1, pids
    return pids[0]
