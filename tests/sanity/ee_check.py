"""Create the Execution Environment's build context and check it (make ee-check).

    .venv/bin/python tests/sanity/ee_check.py [execution-environment.yml]

Runs `ansible-builder create` on the repository's execution-environment.yml (no container
runtime, no network: building the image is `ansible-builder build`), in a scratch
directory, and fails unless the context:
- builds FROM awx-ee, with the interpreter awx-ee runs Ansible on (/usr/bin/python3.11, not
  its /usr/bin/python3, which is 3.9);
- installs ansible-core 2.17 or later (community.proxmox's pct connection needs it);
- installs this collection from the tarball `make build` writes for galaxy.yml's version, the
  very file, and community.proxmox;
- installs paramiko (the pct connection's transport) and an SSH client.
"""

import filecmp
import os
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check(context, tarball_name, tarball):
    problems = []
    containerfile = next((os.path.join(context, name) for name in ('Containerfile', 'Dockerfile')
                          if os.path.exists(os.path.join(context, name))), None)
    if containerfile is None:
        return ['no Containerfile or Dockerfile in the context']
    with open(containerfile) as handle:
        text = handle.read()
    base = re.search(r'^ARG EE_BASE_IMAGE="([^"]*)"', text, re.M)
    if not base or not base.group(1).startswith('quay.io/ansible/awx-ee:'):
        problems.append('the base image is not awx-ee: %s' % (base and base.group(1)))
    pycmd = re.search(r'^ARG PYCMD="([^"]*)"', text, re.M)
    if not pycmd or pycmd.group(1) != '/usr/bin/python3.11':
        problems.append('the Python is %s, not awx-ee\'s /usr/bin/python3.11' % (pycmd and pycmd.group(1)))
    core = re.search(r'^ARG ANSIBLE_INSTALL_REFS="([^"]*)"', text, re.M)
    if not core or not re.search(r'ansible-core>=2\.(1[7-9]|[2-9]\d)', core.group(1)):
        problems.append('ansible-core is not pinned to 2.17 or later: %s' % (core and core.group(1)))
    build = os.path.join(context, '_build')
    with open(os.path.join(build, 'requirements.yml')) as handle:
        collections = yaml.safe_load(handle).get('collections') or []
    names = [entry['name'] if isinstance(entry, dict) else entry for entry in collections]
    if 'collections/' + tarball_name not in names:
        problems.append('the collection is not installed from %s: %s' % (tarball_name, names))
    if 'community.proxmox' not in names:
        problems.append('community.proxmox (the pct route) is not installed: %s' % names)
    copied = os.path.join(build, 'collections', tarball_name)
    if not os.path.exists(copied) or not filecmp.cmp(copied, tarball, shallow=False):
        problems.append('the context does not hold %s as make build wrote it' % tarball_name)
    with open(os.path.join(build, 'requirements.txt')) as handle:
        python = [line.strip().lower() for line in handle if line.strip() and not line.startswith('#')]
    if not any(re.match(r'paramiko\b', line) for line in python):
        problems.append('paramiko (the pct connection\'s transport) is not installed: %s' % python)
    with open(os.path.join(build, 'bindep.txt')) as handle:
        if 'openssh-clients' not in handle.read():
            problems.append('no SSH client in bindep.txt')
    return problems


def main(definition):
    with open(os.path.join(ROOT, 'galaxy.yml')) as handle:
        galaxy = yaml.safe_load(handle)
    tarball_name = '%s-%s-%s.tar.gz' % (galaxy['namespace'], galaxy['name'], galaxy['version'])
    tarball = os.path.join(ROOT, '.build', 'dist', tarball_name)
    if not os.path.exists(tarball):
        print('ee_check: %s is missing: run make build first' % tarball)
        return 1
    builder = os.path.join(os.path.dirname(sys.executable), 'ansible-builder')
    with tempfile.TemporaryDirectory(prefix='gpuops-ee-') as scratch:
        context = os.path.join(scratch, 'context')
        created = subprocess.run([builder, 'create', '-f', definition, '--context', context], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
        if created.returncode != 0:
            print(created.stdout)
            print('ee_check: ansible-builder create failed (exit %d)' % created.returncode)
            return 1
        problems = check(context, tarball_name, tarball)
    for problem in problems:
        print('ee_check: ' + problem)
    if not problems:
        print('ee_check: %s: the build context installs %s on awx-ee\'s python3.11 with community.proxmox and '
              'paramiko' % (os.path.relpath(definition, ROOT), tarball_name))
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main(os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, 'execution-environment.yml'))))
