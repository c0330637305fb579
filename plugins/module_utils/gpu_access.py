# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Can this module see every process? Without it, "memory used, no process" proves nothing.

Reading another process's fds and maps (and, under `hidepid`, even seeing its /proc entry)
takes a ptrace read check, which root passes through CAP_SYS_PTRACE. A module without that
capability sees only its own user's processes: memory it cannot explain is then most likely
held by a process it cannot see, never a reason to reset a GPU or reboot.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import pwd

CAP_SYS_PTRACE = 19


class ProcAccess(object):
    """What this process may read under /proc."""

    def __init__(self, euid, user, can_read_all, hidepid):
        self.euid = euid
        self.user = user
        self.can_read_all = can_read_all     # CAP_SYS_PTRACE in the effective set
        self.hidepid = hidepid               # the hidepid= mount option of /proc, or None

    @property
    def blind(self):
        """Other users' processes may be unreadable or invisible to this module."""
        return not self.can_read_all

    def sentence(self):
        """The first diagnosis sentence when blind, else None (gpu_say.blind writes it; imported
        here, so that this module needs the standard library only)."""
        from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_say
        return gpu_say.blind(self)


def parse_cap_eff(status_text):
    """The effective capability mask from /proc/self/status text (0 when absent)."""
    for line in status_text.splitlines():
        if line.startswith('CapEff:'):
            return int(line.split()[1], 16)
    return 0


def parse_hidepid(mountinfo_text, proc='/proc'):
    """The hidepid= option of the mount at `proc`, from /proc/self/mountinfo text, or None."""
    found = None
    for line in mountinfo_text.splitlines():
        fields = line.split(' - ', 1)
        left = fields[0].split()
        if len(left) < 5 or left[4] != proc or len(fields) < 2:
            continue
        right = fields[1].split()
        options = (right[2] if len(right) > 2 else '').split(',') + left[5].split(',')
        found = None     # the last mount on that path is the one in effect
        for option in options:
            if option.startswith('hidepid='):
                found = option.split('=', 1)[1]
    return found


def _read_text(path):
    try:
        with open(path, 'rb') as handle:
            return handle.read().decode('utf-8', 'replace')
    except (IOError, OSError):
        return ''


def read_access(proc='/proc'):
    euid = os.geteuid()
    try:
        user = pwd.getpwuid(euid).pw_name
    except KeyError:
        user = str(euid)
    caps = parse_cap_eff(_read_text('%s/self/status' % proc))
    return ProcAccess(euid=euid, user=user, can_read_all=bool(caps & (1 << CAP_SYS_PTRACE)),
                      hidepid=parse_hidepid(_read_text('%s/self/mountinfo' % proc), proc))
