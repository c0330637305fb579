#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: run_metrics
short_description: Write what a run of the reclaim playbook did as node_exporter textfile metrics
version_added: "1.1.0"
description:
  - Writes one file in Prometheus' text format for node_exporter's textfile collector, with
    the run's start, duration and result; what it ended, by lever, and the GPUs it freed, as
    counters that go on from the file the last run left; per GPU, whether it is free, the memory
    in use and the memory no process explains; the GPU health code and the inference server's
    state where the run read them. The README's section C(Metrics for Prometheus, and alert rules) lists every metric.
  - The file is written as a temporary file in the same directory, flushed to disk, then renamed
    over the last one, so node_exporter never reads half a file. It is C(0644), the
    directory is made C(0755) only when missing.
  - A last file that does not read back (a counter that is not a number) is replaced, and its
    counters start again at 0, with a warning. A file at RV(file) that this module did not
    write (or that is not a regular file) is left as it is and nothing is written, with a
    warning naming it.
  - C(playbooks/reclaim.yml) calls it once per host at the end of every run (the reclaim timer
    runs the same playbook), from its C(reclaim_metrics_dir).
  - Labels take values from closed sets only (a GPU index, a lever, a result, a state, a code),
    never a PID, a command line or a name a node's user chose.
author:
  - gpuops.reclaim maintainers (@gpuops)
attributes:
  check_mode:
    support: full
    description: Check mode renders the metrics (RV(metrics)) and writes nothing.
  diff_mode:
    support: none
    description: No diff.
options:
  dir:
    description:
      - The directory node_exporter's textfile collector reads (its C(--collector.textfile.directory)).
        Debian's prometheus-node-exporter reads C(/var/lib/prometheus/node-exporter).
      - An empty string writes nothing.
    type: str
    default: /var/lib/prometheus/node-exporter
  name:
    description: The file's name in O(dir); it must end in C(.prom), which the collector reads.
    type: str
    default: gpuops_reclaim.prom
  started:
    description: When the run started, in seconds since the Unix epoch.
    type: float
    required: true
  duration_s:
    description: How long the run took until now, in seconds.
    type: float
    required: true
  failure:
    description:
      - The run's failure on this host as C(playbooks/reclaim.yml) records it (C(stage) C(reclaim)
        or C(restart)); omitted or null when the host converged.
    type: dict
  reclaims:
    description:
      - The M(gpuops.reclaim.gpu_reclaim) results of the run on this host, in the order they ran;
        each GPU's figures come from the last one that read it. Entries without C(actions) are skipped.
    type: list
    elements: dict
    default: []
  surveys:
    description:
      - M(gpuops.reclaim.gpu_holders) results of the run on this host (the inference_service role's health
        read); each GPU's health code comes from the last read of it here or in O(reclaims).
    type: list
    elements: dict
    default: []
  server:
    description:
      - The inference_service role's C(inference_service_server) fact (C(state), C(code), C(age_s),
        C(time_to_serve_s), C(ttft_s)); omitted when the host has no server.
    type: dict
  free_threshold_mib:
    description: GPU memory no process explains beyond this counts toward RV(metrics)'s C(gpuops_gpu_memory_unexplained_runs).
    type: int
    default: 128
  interval:
    description:
      - The reclaim timer's longest gap between runs as a systemd time span (its interval and its
        randomized delay, C(5min 60s)); exported as C(gpuops_reclaim_timer_interval_seconds), which
        the rule C(GpuopsReclaimNotRunning) reads. Omitted for runs not started by the timer.
    type: str
notes:
  - Only the file at RV(file) and a temporary file beside it are written; the module reads nothing
    else on the host.
seealso:
  - name: node_exporter's textfile collector
    description: How node_exporter reads C(*.prom) files.
    link: https://github.com/prometheus/node_exporter#textfile-collector
"""

EXAMPLES = r"""
- name: Write the run's metrics
  gpuops.reclaim.run_metrics:
    started: "{{ run_started }}"
    duration_s: 42.5
    reclaims: ["{{ gpus_free_result }}"]
  become: true
"""

RETURN = r"""
file:
  description: The metrics file, or null when O(dir) is empty.
  returned: always
  type: str
  sample: /var/lib/prometheus/node-exporter/gpuops_reclaim.prom
written:
  description: Whether the file was written (false in check mode, with O(dir) empty, or beside a file this module did not write).
  returned: always
  type: bool
previous:
  description:
    - "How the last file was found: C(carried) (its counters go on), C(no_file) (counters start at 0),
      C(corrupt) (a file of this module that did not read back: replaced, counters start again at 0),
      C(foreign) (not this module's, or not a regular file: left as it is, nothing written); null when O(dir) is empty."
  returned: always
  type: str
metrics:
  description: The file's text (what was written, or in check mode would be).
  returned: when O(dir) is set
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_metrics_file as metrics_file
from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_metrics_file import (  # noqa: F401 pylint: disable=unused-import
    FOREIGN, MAX_READ, make_dir, param_error, read_last, write_atomic)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dir=dict(type='str', default=metrics_file.DEFAULT_DIR),
            name=dict(type='str', default=metrics_file.DEFAULT_NAME),
            started=dict(type='float', required=True),
            duration_s=dict(type='float', required=True),
            failure=dict(type='dict'),
            reclaims=dict(type='list', elements='dict', default=[]),
            surveys=dict(type='list', elements='dict', default=[]),
            server=dict(type='dict'),
            free_threshold_mib=dict(type='int', default=128),
            interval=dict(type='str'),
        ),
        supports_check_mode=True)
    params = module.params
    error = param_error(params)
    if error:
        module.fail_json(msg='%s. Nothing was written.' % error)
    if not params['dir']:
        module.exit_json(changed=False, file=None, written=False, previous=None)
    try:
        result, warnings = metrics_file.write_run(params, module.check_mode)
    except metrics_file.MetricsError as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    for warning in warnings:
        module.warn(warning)
    # Beside a file this module did not write, nothing changes.
    module.exit_json(changed=result['previous'] != FOREIGN, **result)


if __name__ == '__main__':
    main()
