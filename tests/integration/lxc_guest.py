"""A real LXC guest (Debian's lxc 5.0) booted inside a lab runtime node (LAB_RUNTIMES=1) by the
node's `lab-lxc-guest` (tests/lab/node/lab-lxc-guest: the guest's config and overlay, its
systemd up), for test_lxc.py (a guest by name) and test_pct.py (a guest named by its Proxmox
VMID, reached through the stand-in `pct`). Its processes sit under /lxc.payload.NAME on the node.
"""

import shlex

import pytest

from . import scenarios as sc


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


def boot(lab, node, guest, hostname=None, init=None):
    """Boot the guest `guest` (lxc-start -n GUEST) on `node`, its systemd up; with `init` (a
    shell script's text), that script is the guest's PID 1 instead of systemd (a guest or
    container whose init is a loop restarting a server), and the boot is done when it runs."""
    args = [guest] + (["--hostname", hostname] if hostname else [])
    if init:
        path = "%s.init" % guest_dir(guest)
        lab.exec(node, "mkdir -p $(dirname %s) && cat > %s <<'EOF'\n%sEOF" % (path, path, init))
        args += ["--init-file", path]
    lab.exec(node, "lab-lxc-guest up " + " ".join(shlex.quote(a) for a in args), timeout=150)


def remove(lab, node, guest):
    """Stop the guest and delete everything boot() made for it."""
    lab.exec(node, "lab-lxc-guest down %s; rm -f %s.init" % (shlex.quote(guest), guest_dir(guest)), timeout=150)


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
