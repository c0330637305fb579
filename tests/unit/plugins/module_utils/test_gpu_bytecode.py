"""gpu_bytecode: module_utils imported from a zip (as AnsiballZ runs a module) load their code from a
root-only cache when an earlier run compiled the same source, else compile it and keep it. A cache
that is not root's alone is never read; a broken entry is compiled again; another source never
reads a stale entry; what is not imported from a zip is left to Python."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import marshal
import os
import sys
import time
import zipfile

import pytest

from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_bytecode

PKG = 'gpuops_bytecode_t'

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason='the cache is used only by root (ownership checks)')


def make_zip(path, value):
    with zipfile.ZipFile(str(path), 'w') as z:
        z.writestr(PKG + '/__init__.py', '')
        z.writestr(PKG + '/mod.py', 'VALUE = %d\n\ndef where():\n    raise ValueError("here")\n' % value)
    return str(path)


@pytest.fixture
def finder(tmp_path, monkeypatch):
    """A Finder for PKG's modules over a fresh root-only cache; PKG forgotten afterwards."""
    monkeypatch.setattr(gpu_bytecode, 'PACKAGE', PKG + '.')
    directory = tmp_path / 'cache'
    directory.mkdir(mode=0o700)
    found = gpu_bytecode.Finder(gpu_bytecode.Cache(str(directory)))
    sys.meta_path.insert(0, found)
    path_before = list(sys.path)
    yield found
    sys.meta_path.remove(found)
    sys.path[:] = path_before
    forget()


def forget():
    for name in [n for n in sys.modules if n == PKG or n.startswith(PKG + '.')]:
        del sys.modules[name]
    sys.path_importer_cache.clear()


def import_mod():
    forget()
    __import__(PKG + '.mod')
    return sys.modules[PKG + '.mod']


@needs_root
def test_a_second_import_runs_the_kept_code_without_compiling(tmp_path, finder, monkeypatch):
    sys.path.insert(0, make_zip(tmp_path / 'a.zip', 41))
    first = import_mod()
    assert first.VALUE == 41 and isinstance(first.__loader__, gpu_bytecode._Loader)
    entries = os.listdir(finder.cache.directory)
    assert len(entries) == 1 and entries[0].endswith(gpu_bytecode.SUFFIX)
    info = os.stat(os.path.join(finder.cache.directory, entries[0]))
    assert info.st_uid == 0 and info.st_mode & 0o777 == 0o600

    def no_compile(*args, **kwargs):
        raise AssertionError('compiled again')
    monkeypatch.setattr(gpu_bytecode, 'compile', no_compile, raising=False)   # the module's builtin
    again = import_mod()
    assert again.VALUE == 41 and again is not first
    # A traceback names the file by its path in the collection, not a run's temporary zip.
    with pytest.raises(ValueError) as caught:
        again.where()
    assert str(caught.traceback[-1].path) == PKG + '/mod.py'


@needs_root
def test_another_source_never_reads_a_stale_entry(tmp_path, finder):
    sys.path.insert(0, make_zip(tmp_path / 'a.zip', 41))
    assert import_mod().VALUE == 41
    sys.path[0] = make_zip(tmp_path / 'b.zip', 7)
    assert import_mod().VALUE == 7
    assert len(os.listdir(finder.cache.directory)) == 2


@needs_root
@pytest.mark.parametrize('damage', ['garbage', 'other_owner', 'group_writable', 'link'])
def test_an_entry_not_trusted_or_broken_is_compiled_again(tmp_path, finder, damage):
    sys.path.insert(0, make_zip(tmp_path / 'a.zip', 41))
    import_mod()
    entry = os.path.join(finder.cache.directory, os.listdir(finder.cache.directory)[0])
    # What a kept entry would say if it were used: VALUE 666.
    evil = marshal.dumps(compile('VALUE = 666\n', 'x', 'exec'))
    if damage == 'garbage':
        with open(entry, 'wb') as handle:
            handle.write(b'\x00not marshal')
    elif damage == 'link':
        other = str(tmp_path / 'elsewhere')
        with open(other, 'wb') as handle:
            handle.write(evil)
        os.unlink(entry)
        os.symlink(other, entry)
    else:
        with open(entry, 'wb') as handle:
            handle.write(evil)
        if damage == 'other_owner':
            os.chown(entry, 65534, 65534)
        else:
            os.chmod(entry, 0o620)
    assert import_mod().VALUE == 41


def test_not_from_a_zip_is_left_to_python(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_bytecode, 'PACKAGE', PKG + '.')
    (tmp_path / 'src' / PKG).mkdir(parents=True)
    (tmp_path / 'src' / PKG / '__init__.py').write_text('')
    (tmp_path / 'src' / PKG / 'mod.py').write_text('VALUE = 3\n')
    monkeypatch.syspath_prepend(str(tmp_path / 'src'))
    found = gpu_bytecode.Finder(gpu_bytecode.Cache(str(tmp_path / 'cache')))
    sys.meta_path.insert(0, found)
    try:
        forget()
        mod = import_mod()
        assert mod.VALUE == 3 and not isinstance(mod.__loader__, gpu_bytecode._Loader)
    finally:
        sys.meta_path.remove(found)
        forget()


@needs_root
def test_the_cache_directory_is_used_only_when_it_is_roots_alone(tmp_path):
    parent = tmp_path / 'var-cache'
    parent.mkdir(mode=0o755)
    path = str(parent / 'bytecode')
    assert gpu_bytecode.cache_dir(path) == path          # made, 0700
    assert os.stat(path).st_mode & 0o777 == 0o700
    assert gpu_bytecode.cache_dir(path) == path          # and found again
    os.chmod(path, 0o755)
    assert gpu_bytecode.cache_dir(path) is None          # others may read it
    os.chmod(path, 0o700)
    os.chown(path, 65534, 0)
    assert gpu_bytecode.cache_dir(path) is None          # not root's
    os.rmdir(path)
    os.symlink(str(tmp_path), path)
    assert gpu_bytecode.cache_dir(path) is None          # a link
    os.unlink(path)
    os.chmod(str(parent), 0o777)
    assert gpu_bytecode.cache_dir(path) is None          # anyone may replace it
    assert not os.path.lexists(path)


def test_not_root_uses_no_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(os, 'geteuid', lambda: 1000)
    assert gpu_bytecode.cache_dir(str(tmp_path / 'bytecode')) is None
    assert not (tmp_path / 'bytecode').exists()


def test_entries_unused_for_30_days_are_pruned(tmp_path):
    cache = gpu_bytecode.Cache(str(tmp_path))
    old, recent = tmp_path / ('a' + gpu_bytecode.SUFFIX), tmp_path / ('b' + gpu_bytecode.SUFFIX)
    other = tmp_path / 'not-ours.txt'
    for path in (old, recent, other):
        path.write_bytes(b'x')
    long_ago = time.time() - gpu_bytecode.MAX_AGE_S - 60
    os.utime(str(old), (long_ago, long_ago))
    os.utime(str(other), (long_ago, long_ago))
    cache.prune(keep=str(tmp_path / 'new'))
    assert not old.exists() and recent.exists() and other.exists()
