# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.reclaim contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's module_utils, compiled once per version on a managed host and kept.

AnsiballZ runs a module from a zip of its sources, and zipimport compiles every file it imports
at every run: it neither reads nor writes bytecode. gpu_reclaim compiles about 400 KB of this
collection's sources that way, 47 ms of its 79 ms on a lab node (cProfile, issue 31 item 5), on
every host of every run. `install()` puts a finder first on sys.meta_path that, only for this
collection's module_utils and only when they come from a zip, loads the code compiled by an
earlier run of the same source under the same Python, else compiles it and keeps it.

What is kept is run as root, so it is trusted only from where only root can write: a directory
owned by root with no group or other access (made so when missing, under a parent owned by
root that no one else may write), files owned by root that no one else may write, opened without
following a link. Anything else (not root, another owner, a link, a read or write that fails)
falls back to compiling, as zipimport does; nothing here can make an import fail that would
not fail anyway. The key is a hash of the Python's bytecode magic, the module's name and its
source, so another version of the collection or of Python never reads a stale entry. Entries
not used for 30 days are removed when a new one is written.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import importlib.machinery
import importlib.util
import marshal
import os
import stat
import sys
import time
import zipimport

PACKAGE = 'ansible_collections.gpuops.reclaim.plugins.module_utils.'
CACHE_DIR = '/var/cache/gpuops-reclaim/bytecode'
MAX_AGE_S = 30 * 86400
SUFFIX = '.code'


def _root_only(info, mode):
    """A root-owned object of kind `mode` that only root may write (and, for a directory we made
    ours, only root may read or enter)."""
    return info.st_uid == 0 and stat.S_IFMT(info.st_mode) == mode and not info.st_mode & 0o022


def cache_dir(path=CACHE_DIR):
    """`path` when it is a directory only root may use (made so, with root's parents, when
    missing), else None. Only for a process running as root."""
    if os.geteuid() != 0:
        return None
    parent = os.path.dirname(path)
    try:
        if not os.path.lexists(path):
            if not os.path.lexists(parent):
                os.makedirs(parent, 0o755)
            if not _root_only(os.lstat(parent), stat.S_IFDIR):
                return None
            os.mkdir(path, 0o700)
        info = os.lstat(path)
    except OSError:
        return None
    if not _root_only(info, stat.S_IFDIR) or info.st_mode & 0o077:
        return None
    if not _root_only(os.lstat(parent), stat.S_IFDIR):
        return None
    return path


class Cache(object):
    """Code objects by key in one directory (see the module's docstring)."""

    def __init__(self, directory):
        self.directory = directory
        self.pruned = False

    def key(self, name, source):
        digest = hashlib.sha256(importlib.util.MAGIC_NUMBER)
        digest.update(name.encode('utf-8', 'surrogateescape') + b'\0')
        digest.update(source.encode('utf-8', 'surrogateescape'))
        return digest.hexdigest()

    def load(self, key):
        try:
            fd = os.open(os.path.join(self.directory, key + SUFFIX), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if not _root_only(info, stat.S_IFREG):
                return None
            with os.fdopen(fd, 'rb') as handle:
                fd = None
                return marshal.loads(handle.read())
        except (OSError, ValueError, EOFError, TypeError):
            return None
        finally:
            if fd is not None:
                os.close(fd)

    def store(self, key, code):
        path = os.path.join(self.directory, key + SUFFIX)
        tmp = '%s.%d.tmp' % (path, os.getpid())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, 'wb') as handle:
                handle.write(marshal.dumps(code))
            os.replace(tmp, path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        if not self.pruned:     # once per run: a new version's first run stores every file
            self.pruned = True
            self.prune(keep=path)

    def prune(self, keep, now=None):
        """Remove entries not used (read or written) for MAX_AGE_S."""
        now = time.time() if now is None else now
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            path = os.path.join(self.directory, name)
            if path == keep or not name.endswith((SUFFIX, '.tmp')):
                continue
            try:
                info = os.lstat(path)
                if now - max(info.st_atime, info.st_mtime) > MAX_AGE_S:
                    os.unlink(path)
            except OSError:
                continue

    def code(self, name, source):
        """The code of module `name` (dotted) from `source`. Named by its path in the collection,
        not by where this run's zip is: AnsiballZ unpacks each run's zip in a new temporary
        directory, so that path would never be the same twice (nor exist after the run)."""
        key = self.key(name, source)
        found = self.load(key)
        if found is not None:
            return found
        code = compile(source, name.replace('.', '/') + '.py', 'exec', dont_inherit=True)
        self.store(key, code)
        return code


class _Loader(object):
    """Runs a module whose source the zip holds, from the cache's code."""

    def __init__(self, inner, cache):
        self.inner = inner
        self.cache = cache

    def create_module(self, spec):
        return None     # the default module object

    def exec_module(self, module):
        source = self.inner.get_source(module.__name__)
        if source is None:
            raise ImportError('no source for %s' % module.__name__, name=module.__name__)
        exec(self.cache.code(module.__name__, source), module.__dict__)  # pylint: disable=exec-used

    def get_source(self, fullname):
        return self.inner.get_source(fullname)


class Finder(object):
    """A meta path finder for this collection's module_utils loaded from a zip."""

    def __init__(self, cache):
        self.cache = cache

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(PACKAGE) or '.' in fullname[len(PACKAGE):]:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, zipimport.zipimporter) or spec.submodule_search_locations:
            return None
        spec.loader = _Loader(spec.loader, self.cache)
        return spec


def install():
    """Put the finder first on sys.meta_path (once), when a root-only cache directory is there
    or can be made. Returns the Finder, or None."""
    for finder in sys.meta_path:
        if isinstance(finder, Finder):
            return finder
    directory = cache_dir()
    if directory is None:
        return None
    finder = Finder(Cache(directory))
    sys.meta_path.insert(0, finder)
    return finder


# Imported from a zip, this is AnsiballZ running a module on a managed host: the modules import
# this file before the rest of the collection's module_utils, so that those come from the cache.
# Imported from a directory (tests, a checkout), it does nothing.
if __spec__ is not None and isinstance(__spec__.loader, zipimport.zipimporter):
    install()
