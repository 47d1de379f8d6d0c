"""Imports go one way (issue 30): fastpath knows no Django; fastpoll knows no Plurk; plurkcore uses
fastpoll's public API only; product code never imports the test rig; and no module of the
product takes part in an import cycle of any length, call-time imports included."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRODUCT = ("fastpath", "fastpoll", "plurkcore", "plurksite", "plurkweb")
RIG = {"tests", "bench", "locustfiles"}


def _modules(package):
    """{dotted module name: path} of a package's Python files."""
    found = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[rel.removesuffix(".__init__")] = path
    return found


MODULES = {name: path for package in PRODUCT for name, path in _modules(package).items()}


def _imports(module, path):
    """[(imported dotted name, names imported from it, at module level?)] of one file."""
    tree = ast.parse(open(path).read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    top = {id(node) for node in tree.body}
    top |= {id(n) for node in tree.body if isinstance(node, (ast.If, ast.Try)) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, (), id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.append((base, tuple(a.name for a in node.names), id(node) in top))
    return found


def _targets(name, names):
    """The product modules an import statement loads: the module, and a submodule per name."""
    out = [name] if name in MODULES else []
    out += [f"{name}.{n}" for n in names if f"{name}.{n}" in MODULES]
    return out


GRAPH = {m: {t for name, names, _ in _imports(m, p) for t in _targets(name, names) if t != m}
         for m, p in MODULES.items()}


def test_no_import_cycle_of_any_length():
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            # a package's __init__ importing its own submodules lazily is not a cycle
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("fastpoll.") and m != "fastpoll.apps"))
def test_fastpoll_imports_at_module_level_only(module):
    """A call-time import hides an arrow from readers and from the cycle test (``ready()`` is
    where Django wants them: it runs once the apps are loaded)."""
    late = [name for name, _, top in _imports(module, MODULES[module])
            if not top and name.split(".")[0] in ("fastpoll", "plurkcore", "fastpath")]
    assert late == []


def test_fastpoll_knows_no_plurk_and_fastpath_no_django():
    for module, targets in GRAPH.items():
        if module.startswith("fastpoll"):
            assert not [t for t in targets if t.startswith(("plurkcore", "plurksite", "plurkweb"))], module
        if module.startswith("fastpath"):
            assert not [t for t in targets if not t.startswith("fastpath")], module
    for module, path in MODULES.items():
        if module.startswith("fastpath"):
            assert not {n.split(".")[0] for n, _, _ in _imports(module, path)} & {"django", "fastpoll"}, module


def test_plurkcore_uses_only_the_public_api_of_fastpoll():
    import fastpoll

    for module, path in MODULES.items():
        if not module.startswith("plurkcore"):
            continue
        for name, names, _ in _imports(module, path):
            if name.split(".")[0] != "fastpoll":
                continue
            assert name == "fastpoll" and set(names) <= set(fastpoll.__all__), (module, name, names)


def test_the_product_never_imports_the_test_rig():
    for module, path in MODULES.items():
        rig = {n.split(".")[0] for n, _, _ in _imports(module, path)} & RIG
        assert not rig, (module, rig)
