#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: reclaim_summary
short_description: Write the JSON summary of a reclaim.yml run on the controller
version_added: "1.0.0"
description:
  - Used by C(playbooks/reclaim.yml) once per run. Runs on the controller (an action plugin). It reads the
    C(gpus_free_result), C(inference_service_*) variables and recorded failure of each host, and writes one JSON file.
  - "Per host: C(status) (ok, failed, no result (unreachable)), C(changed), C(gpus_before) and C(gpus_after)
    (index, memory_used_mib, memory_total_mib, free, holders), C(reclaim_elapsed_s), C(actions) (with C(at_s)),
    C(remaining) PIDs, C(server) (name, flags, max_total_num_tokens, state (the role's inference_service_server), restart_reasons, adoption, container_adoption,
    gpus_reclaim, strays_reclaim) and C(failure) (stage, task, msg)."
  - The top-level GPUs and actions are the stray reclaim's (the GPUs no server is assigned to). On a host whose
    server was converged, C(server.gpus_reclaim) holds the inference_service role's own reclaim of the server's
    GPUs (changed, gpus_before, gpus_after, elapsed_s, actions), and C(server.restart_reasons) why the role
    restarted the server, or in check mode would (empty when it was converged). C(server.adoption) is what the
    role's adoption of a hand-started server ended (scope, stopped, seconds, left, skipped, and each process as an
    action with step C(adopt_stop)), null when it adopted nothing; C(server.container_adoption) the hand-started
    docker or podman containers it stopped through their runtime (each an action with step C(stop_container),
    runtime, container, name, pids, took_s, result), null when none; C(server.strays_reclaim) the strays it freed
    beside a healthy server.
  - C(changed) is true when the stray reclaim changed something or, on a server host, when the role adopted,
    restarted (in check mode, would restart) or reclaimed; a run the role refused before touching anything
    records false. A drift check tests it.
  - The summary is also returned as the run's custom stats (C(ansible_stats), as M(ansible.builtin.set_stats)
    sets them, key C(gpuops_reclaim), not per host); AWX keeps them as the job's artifacts.
  - At the top level, C(check_mode), C(finished) (when the summary was written), C(server_batches_with_failures) (the rollout batches
    that had a failure; when one stopped the rollout, later batches were not converged).
author:
  - gpuops.reclaim maintainers (@gpuops)
attributes:
  check_mode:
    support: full
    description: Writes the summary in check mode too; it is the drift report.
  diff_mode:
    support: none
    description: Nothing on a host changes.
options:
  path:
    description:
      - The file to write (on the controller), replaced atomically. Empty writes no file.
      - A relative path is taken from the playbook's directory (C(playbook_dir)), never from the working
        directory of the process that started the run.
    type: path
    default: ""
  hosts:
    description: The hosts of the run.
    type: list
    elements: str
    required: true
  check_mode:
    description: Whether the run was in check mode, recorded as is.
    type: bool
    default: false
  report:
    description:
      - Also return, as C(msg), every host's before/after table of the stray reclaim (the gpus_free role's
        report of C(reclaim__strays_result), else of C(gpus_free_result); GPUs, holders, each action with
        its time and result), and what a server's adoption ended and the strays freed beside it, each line
        prefixed with the host's name. A host with nothing to do is one line.
      - Built once on the controller for the whole run instead of a report task per host; reclaim.yml
        prints it with one M(ansible.builtin.debug) task.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Write the run's summary
  gpuops.reclaim.reclaim_summary:
    path: /var/lib/gpuops-reclaim/last-run.json
    hosts: "{{ ansible_play_hosts_all }}"
    check_mode: "{{ ansible_check_mode }}"
    report: true
  register: summary
  run_once: true

- name: Print every host's table
  ansible.builtin.debug:
    msg: "{{ summary.msg }}"
  run_once: true
"""

RETURN = r"""
path:
  description: The file written (absolute); null when O(path) is empty.
  returned: always
  type: str
msg:
  description: Every host's before/after table, one line per GPU and per action, each prefixed with the host's name.
  returned: when O(report) is true
  type: list
  elements: str
hosts:
  description: How many hosts it covers.
  returned: always
  type: int
failed_hosts:
  description: Hosts whose status is not ok.
  returned: always
  type: list
  elements: str
ansible_stats:
  description:
    - The run's custom stats, as M(ansible.builtin.set_stats) returns them; Ansible records them for the run
      (AWX's job artifacts, ansible-runner's stats event).
    - C(data.gpuops_reclaim) is the summary (as in the file, plus its C(path)).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(
        argument_spec=dict(path=dict(type='path', default=''),
                           hosts=dict(type='list', elements='str', required=True),
                           check_mode=dict(type='bool', default=False),
                           report=dict(type='bool', default=False)),
        supports_check_mode=True,
    )
    module.fail_json(msg='reclaim_summary runs on the controller through its action plugin; '
                         'this module file only documents it')


if __name__ == '__main__':
    main()
