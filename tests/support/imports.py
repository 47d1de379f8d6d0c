"""Every way a source file of this repository reaches another module, for tests/test_layers.py.

A *use* is one place where a module names another: an ``import``/``from`` statement anywhere
(in a function too), a constant-string dynamic import (``importlib.import_module``,
``__import__``, ``import_string``, ``include``, ``runpy.run_module``), a model or app looked up by
label (``apps.get_model``, ``apps.get_app_config``, a relation's ``"app.Model"``, a migration's
``dependencies``), an attribute of a module bound by ``import``
(``fastpoll.conf`` after ``import fastpoll``, ``getattr(fastpoll, "conf")`` too), and the
``import``/``cimport``/``from`` lines of Cython files (``.pyx``/``.pxd``/``.pxi``, read with
patterns: Cython is not Python's grammar; an included ``.pxi`` is checked as a module of its own).
`Index.loads` turns uses into the modules whose bodies they may run, which is the import graph:
parent packages included, and the submodules a package's lazy ``__getattr__`` loads for a name.
"""
import ast
import os
import re
from collections import namedtuple

#: line, dotted target (absolute), how ("import", "from", "cimport", "call", "attr", "model"),
#: names (a ``from`` statement's names; a model's name), top (runs when the module is imported)
Use = namedtuple("Use", "line target how names top")

Module = namedtuple("Module", "name path source kind package")

DYNAMIC = {"import_module", "__import__", "import_string", "include", "run_module"}
REGISTRY = {"get_model", "get_app_config"}
RELATIONS = {"ForeignKey", "OneToOneField", "ManyToManyField"}


def _constant(node):
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _resolve(base, level, package):
    """The absolute name of a relative import ``level`` dots up from ``package``."""
    if not level:
        return base
    parts = package.split(".") if package else []
    head = parts[:len(parts) - level + 1]
    return ".".join(head + ([base] if base else []))


def _python_uses(module):
    tree = ast.parse(module.source, module.path)
    package = module.name if module.package else module.name.rpartition(".")[0]
    bound = {}                           # local name -> module it is bound to by ``import``
    uses = []
    body_of = {}                         # node id -> runs at import time?

    def mark(node, top):
        body_of[id(node)] = top
        inner = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            mark(child, inner)

    mark(tree, True)
    for node in ast.walk(tree):
        top = body_of[id(node)]
        if isinstance(node, ast.Import):
            for alias in node.names:
                uses.append(Use(node.lineno, alias.name, "import", (), top))
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, package)
            uses.append(Use(node.lineno, base, "from", tuple(a.name for a in node.names), top))
    for node in ast.walk(tree):
        top = body_of[id(node)]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            uses.append(Use(node.lineno, f"{bound[node.value.id]}.{node.attr}", "attr", (), top))
        elif isinstance(node, ast.Call):
            func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            args = [_constant(a) for a in node.args]
            if func == "getattr" and len(args) >= 2 and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id in bound and args[1]:
                uses.append(Use(node.lineno, f"{bound[node.args[0].id]}.{args[1]}", "attr", (), top))
            elif func in DYNAMIC and args and args[0]:
                target = args[0]
                if target.startswith("."):
                    anchor = args[1] if len(args) > 1 else None
                    for kw in node.keywords:
                        if kw.arg == "package":
                            anchor = _constant(kw.value) or getattr(kw.value, "id", None)
                    anchor = {"__name__": module.name, "__package__": package}.get(anchor, anchor)
                    level = len(target) - len(target.lstrip("."))
                    target = _resolve(target.lstrip("."), level, anchor)
                uses.append(Use(node.lineno, target, "call", (), top))
            elif func in RELATIONS:
                to = ([_constant(k.value) for k in node.keywords if k.arg == "to"] or args or [None])[0]
                if to and "." in to:
                    label, _, name = to.partition(".")
                    uses.append(Use(node.lineno, label, "model", (name,), top))
            elif func in REGISTRY and args and args[0]:
                label, _, name = args[0].partition(".")
                name = name or (args[1] if len(args) > 1 else "") or ""
                uses.append(Use(node.lineno, label, "model", (name,) if name else (), top))
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "dependencies" for t in node.targets):
            for item in ast.walk(node.value):          # a migration's ("app", "0001_initial")
                if isinstance(item, ast.Tuple) and len(item.elts) == 2 and _constant(item.elts[0]):
                    uses.append(Use(item.lineno, _constant(item.elts[0]), "model", (), top))
    return uses


_TRIPLE = re.compile(r"(\"\"\"|''')(.*?)\1", re.S)
_CY_IMPORT = re.compile(r"^([ \t]*)c?import[ \t]+([\w.][\w., \t]*)", re.M)
_CY_FROM = re.compile(r"^([ \t]*)from[ \t]+(\.*[\w.]*)[ \t]+c?import[ \t]+(\([^)]*\)|[^#\n]*)", re.M)
_CY_CALL = re.compile(r"\b(\w+)\s*\(\s*(['\"])([\w.]+)\2(?:\s*,\s*(['\"])([\w.]+)\4)?")


def _cython_uses(module):
    """Cython's grammar is not Python's: its import lines are read with patterns, strings that
    span lines (docstrings) blanked out first."""
    text = _TRIPLE.sub(lambda m: "\n" * m.group(0).count("\n"), module.source)
    text = re.sub(r"#[^\n]*", "", text)
    package = module.name if module.package else module.name.rpartition(".")[0]
    uses = []

    def line(match):
        return text.count("\n", 0, match.start()) + 1

    for m in _CY_IMPORT.finditer(text):
        how = "cimport" if m.group(0).lstrip().startswith("cimport") else "import"
        for part in m.group(2).split(","):
            if part.split():
                uses.append(Use(line(m), part.split()[0], how, (), not m.group(1)))
    for m in _CY_FROM.finditer(text):
        names = tuple(n.split()[0] for n in m.group(3).strip("() \t").replace("\n", " ").split(",") if n.split())
        base = _resolve(m.group(2).lstrip("."), len(m.group(2)) - len(m.group(2).lstrip(".")), package)
        uses.append(Use(line(m), base, "from", names, not m.group(1)))
    for m in _CY_CALL.finditer(text):
        if m.group(1) in DYNAMIC:
            uses.append(Use(line(m), m.group(3), "call", (), False))
        elif m.group(1) in REGISTRY:
            label, _, name = m.group(3).partition(".")
            uses.append(Use(line(m), label, "model", (name or m.group(5) or "",), False))
    return uses


def uses_of(module):
    return _cython_uses(module) if module.kind == "pyx" else _python_uses(module)


class Index:
    """The modules under a set of roots, by dotted name, and what each of them uses."""

    def __init__(self, modules):
        self.modules = dict(modules)
        self._uses = {}
        self._lazy = {}

    @classmethod
    def from_sources(cls, sources, path_prefix="<src>"):
        """``{"pkg/__init__.py": source, "pkg/mod.pyx": source, ...}``: an index without files."""
        modules = {}
        for rel, source in sources.items():
            stem, ext = os.path.splitext(rel)
            name = stem.replace("/", ".").removesuffix(".__init__")
            package = stem.endswith("__init__")
            kind = "pyx" if ext in (".pyx", ".pxd", ".pxi") else "py"
            if name in modules:              # a .pyx and its .pxd (or .pxi) are one module
                old = modules[name]
                source = old.source + "\n" + source
                kind = "pyx"
            modules[name] = Module(name, f"{path_prefix}/{rel}", source, kind, package)
        return cls(modules)

    @classmethod
    def from_tree(cls, root, tops):
        """The ``.py``, ``.pyx``, ``.pxd`` and ``.pxi`` files of the packages ``tops`` directly under ``root``."""
        sources = {}
        for top in tops:
            if os.path.isfile(os.path.join(root, top + ".py")):
                sources[top + ".py"] = os.path.join(root, top + ".py")
            for dirpath, dirnames, files in os.walk(os.path.join(root, top)):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                for name in sorted(files):
                    if name.endswith((".py", ".pyx", ".pxd", ".pxi")):
                        path = os.path.join(dirpath, name)
                        sources[os.path.relpath(path, root).replace(os.sep, "/")] = path
        index = cls.from_sources({rel: open(path, encoding="utf-8").read() for rel, path in sources.items()})
        for name, module in index.modules.items():
            index.modules[name] = module._replace(path=os.path.join(root, module.path.split("/", 1)[1]))
        return index

    def with_sources(self, sources, path_prefix="<src>"):
        """A copy with ``sources`` (as for `from_sources`) added or put in place of a module; what
        was read of the other modules is kept."""
        extra = Index.from_sources(sources, path_prefix)
        index = Index({**self.modules, **extra.modules})
        index._uses = {n: u for n, u in self._uses.items() if n not in extra.modules}
        return index

    def __contains__(self, name):
        return name in self.modules

    def uses(self, name):
        if name not in self._uses:
            self._uses[name] = uses_of(self.modules[name])
        return self._uses[name]

    def module_of(self, target):
        """The longest prefix of a dotted name that is a module of the index (``a.b.C`` -> ``a.b``)."""
        parts = target.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in self.modules:
                return ".".join(parts[:n])
        return None

    def lazy(self, package):
        """``{name: submodule}`` a package's module ``__getattr__`` loads on first use: read from the
        ``{name: ("submodule", ...)}`` tables of its ``__init__`` (fastpoll's ``_EXPORTS``).
        None when the package has no ``__getattr__``."""
        if package not in self._lazy:
            self._lazy[package] = None
            module = self.modules.get(package)
            if module and module.package and module.kind == "py":
                tree = ast.parse(module.source, module.path)
                if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
                    table = {}
                    for node in tree.body:
                        value = getattr(node, "value", None)
                        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(value, ast.Dict):
                            for key, item in zip(value.keys, value.values):
                                first = item.elts[0] if isinstance(item, ast.Tuple) and item.elts else item
                                sub = f"{package}.{_constant(first)}"
                                if _constant(key) and _constant(first) and sub in self.modules:
                                    table[_constant(key)] = sub
                    self._lazy[package] = table
        return self._lazy[package]

    def loads(self, name, use):
        """The modules of the index whose bodies ``use`` (in module ``name``) may run: the target,
        the packages above it, the submodules a ``from`` names or a lazy package loads for a name;
        not the packages above ``name`` itself (Python ran them before ``name``)."""
        out = set()
        if use.how in ("import", "cimport", "call", "from"):
            target = self.module_of(use.target)
            while target:
                out.add(target)
                target = target.rpartition(".")[0]
        if use.how == "from":
            lazy = self.lazy(use.target) or {}
            for n in use.names:
                if f"{use.target}.{n}" in self.modules:
                    out.add(f"{use.target}.{n}")
                elif n in lazy:
                    out.add(lazy[n])
        if use.how == "attr":
            package, _, attr = use.target.rpartition(".")
            lazy = self.lazy(package) or {}
            if attr in lazy:
                out.add(lazy[attr])
        own = {name}
        parts = name.split(".")
        own |= {".".join(parts[:n]) for n in range(1, len(parts))}
        return out - own

    def graph(self, names=None):
        """``{module: {modules it may load}}``; a package with a lazy ``__getattr__`` may load every
        module of its table (at call time)."""
        names = sorted(self.modules) if names is None else names
        graph = {}
        for name in names:
            edges = set()
            for use in self.uses(name):
                edges |= self.loads(name, use)
            edges |= set((self.lazy(name) or {}).values())
            graph[name] = edges - {name}
        return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
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
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)
