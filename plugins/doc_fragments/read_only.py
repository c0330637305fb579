# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """The attributes of every module that only reads the host (gpu_holders, port_owner)."""

    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
    description: Check mode returns the same result as a normal run.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
"""
