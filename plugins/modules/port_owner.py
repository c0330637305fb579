#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: port_owner
short_description: Name every process listening on a TCP port, and say whether each is a unit's own server
version_added: "1.1.0"
description:
  - Reads the LISTEN sockets on O(port) from C(/proc/net/tcp) and C(/proc/net/tcp6) (no C(ss) or
    C(lsof) needed), the processes holding them from C(/proc/PID/fd), and each one's owner from
    C(/proc/PID/cgroup).
  - A listener clashes with O(host) unless both name different specific addresses (a wildcard
    bind clashes with every address).
  - With O(unit), RV(owners[].in_unit) says whether the listener is that unit's own server; the
    C(inference_service) role counts a health answer only when every listener is. A free port is
    anyone's, so a process counts only by facts root controls, never by its title or command line
    - its cgroup, where systemd keeps it, is the unit's C(ControlGroup) as C(systemctl show)
    reports it, or below it;
  - or, with O(container), it is in the cgroup of that docker or podman container, the unit's
    own (the ID its C(docker run --cidfile) wrote), as the runtime confirms it - its inspect
    gives the container's init PID, and the kernel puts that PID in that very container's
    cgroup. A container's name is never the proof.
  - A cgroup name counts only where root named it. Inside a user's delegated subtree
    (C(user@UID.service)) the user names every directory, C(sglang.service) included, so such a
    process's RV(owners[].unit) is that C(user@UID.service), never a name below it.
  - Written for the C(gpuops.reclaim.inference_service) role (its preflight and its health
    check); usable on its own. Read-only.
  - Not internal to the role - a module of the collection like the others, its options and
    return values under the collection's semantic versioning.
author:
  - gpuops.reclaim maintainers (@gpuops)
options:
  port:
    description: The TCP port.
    type: int
    required: true
  host:
    description:
      - The address the server binds. C(0.0.0.0), C(::) or an empty string is every address.
    type: str
    default: 0.0.0.0
  unit:
    description:
      - The systemd system unit whose server should listen (C(sglang.service)); sets
        RV(owners[].in_unit). A name systemd's grammar refuses (a glob) is refused.
    type: str
  container:
    description:
      - The docker or podman container that O(unit) runs its server in; a listener in it, as
        its runtime confirms, is the unit's (RV(owners[].in_container)).
    type: dict
    suboptions:
      runtime:
        description: C(docker) or C(podman), or the path of one of them (C(/usr/bin/docker)).
        type: str
        required: true
      id:
        description: The container's full ID (64 hex digits), as C(docker run --cidfile) writes it.
        type: str
        required: true
requirements:
  - Linux C(/proc); root (C(become)) to see every process's descriptors.
extends_documentation_fragment:
  - gpuops.reclaim.read_only
notes:
  - A socket in another network namespace (a container with its own network) is not listed; one
    whose holder this host cannot see (another PID namespace) makes RV(listening) true with no
    RV(owners).
seealso:
  - module: gpuops.reclaim.service_adopt
  - module: gpuops.reclaim.gpu_holders
"""

EXAMPLES = r"""
- name: Who listens on the server's port
  gpuops.reclaim.port_owner:
    port: 30000
    host: 10.0.0.5
  become: true
  register: listen

- name: Fail unless every listener is sglang.service's own server
  gpuops.reclaim.port_owner:
    port: 30000
    unit: sglang.service
  become: true
  register: listen
  failed_when: listen.owners | rejectattr('in_unit') | list | length > 0

- name: The same for a unit whose docker run wrote its container's ID to /run/sglang.cid
  gpuops.reclaim.port_owner:
    port: 30000
    unit: sglang.service
    container:
      runtime: docker
      id: "{{ lookup('ansible.builtin.file', '/run/sglang.cid') }}"
  become: true
"""

RETURN = r"""
port:
  description: The port asked for.
  returned: always
  type: int
  sample: 30000
host:
  description: The address asked for.
  returned: always
  type: str
  sample: 0.0.0.0
listening:
  description: Some socket listens on the port (clashing with O(host)).
  returned: always
  type: bool
unit:
  description: O(unit), or null.
  returned: always
  type: str
unit_cgroup:
  description: The unit's C(ControlGroup) as systemd reports it; null without O(unit), or when it has none (not running).
  returned: always
  type: str
  sample: /system.slice/sglang.service
container:
  description:
    - With O(container), the container as its runtime confirmed it - C(id), C(pid) (its init as the
      host sees it) and C(cgroup) (where its processes are) - or C(id), C(error) naming what did not
      confirm it (then no listener is in it). Null without O(container).
  returned: always
  type: dict
  sample: {id: 3f2a..., pid: 4242, cgroup: /system.slice/docker-3f2a....scope}
unreadable:
  description: Descriptor tables this run could not read (C(PID N fd reason)); run as root to read them all.
  returned: always
  type: list
  elements: str
owners:
  description: Each process holding a listening socket on the port.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Its PID.
      type: int
    start_time:
      description: Its start time (clock ticks after boot, C(/proc/PID/stat) field 22); with the PID, its identity.
      type: int
    uid:
      description: Its real uid.
      type: int
    user:
      description: Its user's name (the uid where it has none).
      type: str
    name:
      description: Its C(comm) (the process's own title; its user's text).
      type: str
    cmdline:
      description: Its command line, or its name where it has none (its user's text, not escaped).
      type: str
    unit:
      description:
        - The innermost systemd service or scope of its cgroup that root named; in a user's
          delegated subtree, that C(user@UID.service). Null when none.
      type: str
      sample: sglang.service
    cgroup:
      description: Its cgroup path where systemd keeps it (the v2 line on a unified host, else C(name=systemd)).
      type: str
    in_unit:
      description: It is in O(unit)'s control group or below it (RV(owners[].reason_code) V(in_unit)).
      type: bool
    in_container:
      description: It is in O(container), as its runtime confirmed it (RV(owners[].reason_code) V(unit_container)).
      type: bool
    reason_code:
      description:
        - V(in_unit) (in the unit's control group or below it), V(unit_container) (in O(container),
          as its runtime confirms), V(outside), or V(no_unit) (neither O(unit) nor O(container) gave a cgroup).
      type: str
      choices: [in_unit, unit_container, outside, no_unit]
    owner:
      description:
        - Its owner from its cgroup (as in M(gpuops.reclaim.gpu_holders)) - C(kind) (pod,
          container, guest, user, service, session, scope, none), C(runtime), C(id), C(unit),
          C(controlled_by) (who named the cgroup - root, user, unknown), C(uid).
      type: dict
    label:
      description: One line naming it for a message, its command line and cgroup escaped.
      type: str
      sample: "PID 4242 (uid 1000, python3 /home/alice/squat.py 10.0.0.5 30000, cgroup /user.slice/user-1000.slice/session-7.scope)"
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_listen, gpu_owner

FULL_ID = re.compile(r'^[0-9a-f]{64}$')


def main():
    module = AnsibleModule(argument_spec=dict(port=dict(type='int', required=True),
                                              host=dict(type='str', default='0.0.0.0'),
                                              unit=dict(type='str'),
                                              container=dict(type='dict', options=dict(
                                                  runtime=dict(type='str', required=True),
                                                  id=dict(type='str', required=True)))),
                           supports_check_mode=True)
    params = module.params
    if not 1 <= params['port'] <= 65535:
        module.fail_json(msg='port %r is not a TCP port (1-65535); nothing was read' % params['port'])
    if params['unit'] is not None and not gpu_owner.valid_unit_name(params['unit']):
        module.fail_json(msg='unit %r is not a systemd service or scope name (systemd\'s grammar, no glob); '
                             'nothing was read' % params['unit'])
    container = None
    if params['container']:
        runtime = os.path.basename(params['container']['runtime'])
        if runtime not in gpu_listen.CONTAINER_RUNTIMES:
            module.fail_json(msg='container runtime %r is neither docker nor podman; nothing was read'
                                 % params['container']['runtime'])
        if not FULL_ID.match(params['container']['id']):
            module.fail_json(msg='container id %r is not a full container ID (64 hex digits, as docker run '
                                 '--cidfile writes it); nothing was read' % params['container']['id'])
        container = (runtime, params['container']['id'])
    result = gpu_listen.listeners(params['port'], params['host'], unit=params['unit'], container=container)
    module.exit_json(changed=False, **result)


if __name__ == '__main__':
    main()
