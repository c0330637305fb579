"""Offline stand-in for the get-pip.py bootstrap script ansible-test downloads.

ansible-test (2.19) builds one virtual environment per sanity test, creates it
without pip, and then runs a bootstrap script it downloads from
ci-files.testing.ansible.com, cached as ~/.ansible/test/cache/get_pip_<ver>.py.
That host is unreachable here and on CI, so tests/sanity/run installs this file
at the cache path instead.  ansible-test runs it (through its quiet_pip.py
wrapper, via runpy) as:

    <venv python> get_pip_24_2.py --disable-pip-version-check pip==24.2 \
        --no-setuptools --no-wheel

What this does instead of unpacking an embedded pip:
1. bootstrap some pip into the venv with the stdlib ``ensurepip`` (it ships a
   bundled wheel, so it needs no network);
2. run ``pip install`` with the remaining arguments, which brings pip to the
   exact version ansible-test asked for from the machine's normal index.

ensurepip deliberately points PIP_CONFIG_FILE at /dev/null and removes the
other PIP_* variables while it runs; if that leaked into step 2, pip would lose
this machine's index, find-links and certificate settings.  So ensurepip runs
in a child process and step 2 gets the caller's environment with any
/dev/null PIP_CONFIG_FILE removed.

Only stdlib is used: this runs inside a bare venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

# get-pip.py options that are not `pip install` options; real get-pip.py
# consumes them itself (they mean "do not also install setuptools/wheel").
# Here nothing but pip is ever installed, so they are simply dropped.
GET_PIP_ONLY_OPTIONS = frozenset(('--no-setuptools', '--no-wheel'))


def clean_environment():
    """Return the caller's environment without ensurepip's /dev/null config."""
    env = dict(os.environ)
    if env.get('PIP_CONFIG_FILE') in (os.devnull, '/dev/null'):
        del env['PIP_CONFIG_FILE']
    return env


def have_pip():
    """Tell whether pip is importable by this interpreter (a fresh process)."""
    probe = subprocess.run([sys.executable, '-c', 'import pip'],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=False)
    return probe.returncode == 0


def bootstrap_with_ensurepip(env):
    """Put the bundled pip wheel into this venv; False when ensurepip is absent."""
    # Debian's own python3.11 ships without ensurepip unless python3.11-venv is
    # installed, so its absence is a normal case with a fallback, not an error.
    result = subprocess.run([sys.executable, '-m', 'ensurepip', '--default-pip'],
                            env=env, stdout=subprocess.DEVNULL, check=False)
    return result.returncode == 0


def outside_pip():
    """Find a pip outside this venv that can install into it with --python."""
    # `make sanity` puts the project's .venv/bin first on PATH; pip >= 22.3
    # can install into another interpreter's environment with --python.
    for name in ('pip3', 'pip'):
        path = shutil.which(name)
        if path:
            return path
    return None


def main(argv):
    env = clean_environment()
    # --quiet: real get-pip.py prints little; pip still reports any failure.
    install_args = ['--quiet'] + [arg for arg in argv if arg not in GET_PIP_ONLY_OPTIONS]

    if have_pip() or bootstrap_with_ensurepip(env):
        command = [sys.executable, '-m', 'pip', 'install'] + install_args
    else:
        pip = outside_pip()
        if pip is None:
            sys.stderr.write('get-pip stand-in: this Python has no ensurepip and no pip was '
                             'found on PATH to install into it (install python3-venv)\n')
            return 1
        command = [pip, '--python', sys.executable, 'install'] + install_args

    return subprocess.run(command, env=env, check=False).returncode


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
