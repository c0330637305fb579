"""Imports between the collection's plugins form no cycle (issue 32 item 5).

Every `import` of a module under plugins/ counts, the ones inside functions too: an import
put in a function to break a cycle hides the cycle from Python, not from a reader.
"""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import ast
import os

PLUGINS = os.path.normpath(os.path.join(os.path.dirname(__file__), '..', '..', '..', 'plugins'))
PREFIX = 'ansible_collections.gpuops.reclaim.plugins.'


def _module_of(dotted):
    """'module_utils.gpu_owner' for a dotted name under plugins/ that is a file, else None."""
    return dotted if os.path.isfile(os.path.join(PLUGINS, *dotted.split('.')) + '.py') else None


def imports_of(source):
    """The plugins/ modules a source imports, at any depth of its tree."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            package = node.module[len(PREFIX):]
            for alias in node.names:
                # `from ...module_utils import gpu_owner` names a module; `from
                # ...module_utils.gpu_owner import X` names something in one.
                found.add(_module_of('%s.%s' % (package, alias.name)) or _module_of(package))
        elif isinstance(node, ast.Import):
            found.update(_module_of(alias.name[len(PREFIX):]) for alias in node.names
                         if alias.name.startswith(PREFIX))
    found.discard(None)
    return found


def graph():
    edges = {}
    for folder, _dirs, files in os.walk(PLUGINS):
        for name in files:
            if name.endswith('.py'):
                path = os.path.join(folder, name)
                module = os.path.relpath(path, PLUGINS)[:-3].replace(os.sep, '.')
                with open(path) as handle:
                    edges[module] = imports_of(handle.read())
    return edges


def cycles(edges):
    """Each cycle once, as the list of modules along it (depth-first, in sorted order)."""
    found, state = [], {}

    def visit(module, path):
        state[module] = 'open'
        for other in sorted(edges.get(module, ())):
            if state.get(other) == 'open':
                found.append(path[path.index(other):] + [other])
            elif other not in state:
                visit(other, path + [other])
        state[module] = 'done'

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return found


def test_the_rule_sees_an_import_inside_a_function():
    inner = "def f():\n    from ansible_collections.gpuops.reclaim.plugins.module_utils import gpu_owner\n"
    assert imports_of(inner) == {'module_utils.gpu_owner'}
    assert imports_of("from ansible_collections.gpuops.reclaim.plugins.module_utils.gpu_text import escape_text") == \
        {'module_utils.gpu_text'}
    assert cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c', 'a']]
    assert cycles({'a': {'b'}, 'b': set()}) == []


def test_plugins_import_one_way():
    edges = graph()
    assert 'module_utils.gpu_flow' in edges and 'module_utils.gpu_say' in edges['module_utils.gpu_flow']
    assert cycles(edges) == []
