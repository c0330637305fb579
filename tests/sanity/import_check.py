"""Import the built collection tarball with galaxy-importer, as Galaxy and Automation Hub do.

    .venv/bin/python tests/sanity/import_check.py .build/dist/gpuops-reclaim-X.Y.Z.tar.gz

Runs `python -m galaxy_importer.main` with tests/sanity/galaxy-importer.cfg (Hub's settings:
version 1.0.0 or later, a required tag, ansible-doc, the changelog, flake8, ansible-lint
offline; no ansible-test container) in a scratch directory, outside this checkout's Ansible
environment (a fresh Ansible configuration, as the importer has). Fails on:
- an import that does not complete, or any ERROR or WARNING line in its log;
- a content item listed twice (the listing Galaxy shows);
- a plugin of a documented kind (module, filter, lookup, ...) without its documentation,
  or a role without a README Galaxy can render.
Prints the listing on success.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, 'galaxy-importer.cfg')
# Content kinds that carry no documentation of their own (shared code; an action plugin's
# documentation is the module stub of the same name, listed as a module).
UNDOCUMENTED_KINDS = ('module_utils', 'plugin_utils', 'doc_fragments', 'action', 'playbook')


def problems_in(result):
    """The listing's problems: duplicates, plugins without docs, roles without a README."""
    found = []
    seen = set()
    for item in result['docs_blob']['contents']:
        key = (item['content_type'], item['content_name'])
        if key in seen:
            found.append('%s %s is listed twice' % key)
        seen.add(key)
        if item['content_type'] == 'role':
            if not item.get('readme_html'):
                found.append('role %s has no README Galaxy shows' % item['content_name'])
        elif item['content_type'] not in UNDOCUMENTED_KINDS and not item.get('doc_strings'):
            found.append('%s %s has no documentation' % key)
    return found


def main(tarball):
    tarball = os.path.abspath(tarball)
    env = dict(os.environ, GALAXY_IMPORTER_CONFIG=CONFIG)
    # ansible-doc, ansible-lint and flake8 from the same environment as the importer.
    env['PATH'] = os.path.dirname(sys.executable) + os.pathsep + env.get('PATH', '')
    # The importer runs ansible-doc and ansible-lint on its own extracted copy: this
    # checkout's collection path and ansible.cfg must not stand in for it.
    for name in ('ANSIBLE_COLLECTIONS_PATH', 'ANSIBLE_COLLECTIONS_PATHS', 'ANSIBLE_CONFIG'):
        env.pop(name, None)
    with tempfile.TemporaryDirectory(prefix='gpuops-import-') as scratch:
        env['GALAXY_IMPORTER_ANSIBLE_LOCAL_TMP'] = os.path.join(scratch, 'ansible-tmp')
        env['GALAXY_IMPORTER_TMP_ROOT_DIR'] = scratch
        proc = subprocess.run([sys.executable, '-m', 'galaxy_importer.main', tarball], cwd=scratch, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
        log = proc.stdout
        result_path = os.path.join(scratch, 'importer_result.json')
        result = None
        if os.path.exists(result_path):
            with open(result_path) as handle:
                result = json.load(handle)
    flagged = [line for line in log.splitlines() if line.startswith(('ERROR', 'WARNING', 'CRITICAL'))]
    if proc.returncode != 0 or result is None or flagged:
        sys.stdout.write(log)
        print('import_check: galaxy-importer %s (exit %s), %d error/warning line(s):'
              % ('did not complete' if result is None else 'complained', proc.returncode, len(flagged)))
        for line in flagged:
            print('  ' + line)
    found = problems_in(result) if result else []
    if result and not flagged:
        for item in result['docs_blob']['contents']:
            print('  %-14s %s' % (item['content_type'], item['content_name']))
    if found:
        print('import_check: the listing Galaxy would show is wrong:')
        for problem in found:
            print('  ' + problem)
    if proc.returncode != 0 or result is None or flagged or found:
        return 1
    print('import_check: %s imports with Automation Hub\'s settings, no error or warning; %d items, each once, '
          'documented' % (os.path.basename(tarball), len(result['docs_blob']['contents'])))
    return 0


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
