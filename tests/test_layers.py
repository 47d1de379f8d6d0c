"""Imports go one way (issue 30, items 1 and 3).

The layers, and what each may use (the packages of the other layers, all of them):

- ``fastpath`` (library): itself only; no Django, no fastpoll, no plurkcore;
- ``fastpoll`` (library): itself and fastpath; no Plurk (plurkcore), no demo, no lab;
- ``plurkcore`` (library): itself and fastpoll's public API (``fastpoll.__all__``); no fastpath,
  no demo, no lab;
- demo (``plurksite``, ``plurkweb``): the libraries; no lab (``plurksite`` drives the cluster's
  load from its own code, not from ``locustfiles`` or ``bench``);
- ``examples`` (examples/inbox: ``inbox``, ``inbox_site``): fastpoll's public API only, as a
  project of its own would;
- the lab (``tests``, ``bench``, ``locustfiles``) may use anything; nothing outside it uses it.

A use is anything tests/support/imports.py reads: ``import``/``from`` anywhere (in functions too),
constant-string ``import_module``/``__import__``/``import_string``/``include``/``run_module`` (fastpoll's
docstring names ``fastpoll.urls`` and ``fastpoll.middleware.PollTokenMiddleware`` for URLconfs and
settings: a public-API-only layer may ``include``/``import_string`` those two paths),
``apps.get_model``/``get_app_config`` by label (any object's: ``django.apps.apps``, a migration's
``apps``), a relation to ``"app.Model"`` (``ForeignKey``, ``OneToOneField``, ``ManyToManyField``,
``to=``), the apps a migration's ``dependencies`` name, ``fastpoll.<name>`` and ``getattr(fastpoll, "<name>")`` after ``import fastpoll`` (a
submodule reached through the package object is not public), and the import/cimport lines of
``.pyx``/``.pxd`` files.  An app label is its package's name (no AppConfig here sets ``label``).

Migrations: a migration of a public-API-only layer may name fastpoll's models by label
(``apps.get_model("fastpoll", "UserState")``, a relation's ``"fastpoll.X"``) when it declares a
dependency on a fastpoll migration.  That ``apps`` is the historical registry: the model is fastpoll's table as of that
declared migration, not fastpoll's code, and moving rows into fastpoll's tables (plurkcore's
0006) cannot be written with the public API; the dependency is the contract, so it is required.
Anywhere else, a fastpoll model by label is reaching past the public API.

No module outside the lab takes part in an import cycle of any length: call-time imports,
the packages Python runs above an imported module, and the submodules fastpoll's lazy
``__getattr__`` loads (for a package, every module of its table; for ``fastpoll.touch`` or ``from
fastpoll import touch``, ``fastpoll.changes``) are arrows.  A module's own packages are not:
Python runs them before it.
"""
import ast
import os

import pytest

from tests.support.imports import Index, cycles

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "inbox")

LAYER = {"fastpath": "fastpath", "fastpoll": "fastpoll", "plurkcore": "plurkcore",
         "plurksite": "demo", "plurkweb": "demo",
         "examples": "examples", "inbox": "examples", "inbox_site": "examples", "manage": "examples",
         "tests": "lab", "bench": "lab", "locustfiles": "lab"}
MAY_USE = {
    "fastpath": {"fastpath"},
    "fastpoll": {"fastpoll", "fastpath"},
    "plurkcore": {"plurkcore", "fastpoll"},
    "demo": {"demo", "plurkcore", "fastpoll", "fastpath"},
    "examples": {"examples", "fastpoll"},
}
#: layer -> packages outside the repository's layers it may not use
NO_THIRD_PARTY = {"fastpath": {"django"}}
#: layer -> the package it may use through that package's __all__ only
PUBLIC_ONLY = {"plurkcore": "fastpoll", "examples": "fastpoll"}
#: what fastpoll's docstring names for settings and URLconfs, beside __all__
BY_PATH = {"fastpoll.urls", "fastpoll.middleware.PollTokenMiddleware"}


def _index():
    index = Index.from_tree(ROOT, [t for t in LAYER if t not in ("inbox", "inbox_site", "manage", "examples")])
    example = Index.from_tree(EXAMPLES, ["inbox", "inbox_site", "manage"])
    assert not set(index.modules) & set(example.modules)
    return Index({**index.modules, **example.modules})


INDEX = _index()


def layer(name):
    return LAYER.get(name.split(".")[0])


def _public():
    import fastpoll

    return set(fastpoll.__all__)


def _declares_dependency(module, app):
    """Does a migration's ``dependencies`` list a migration of ``app``?"""
    for node in ast.walk(ast.parse(module.source)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "dependencies" for t in node.targets):
            for item in ast.walk(node.value):
                if isinstance(item, ast.Tuple) and item.elts and isinstance(item.elts[0], ast.Constant) \
                        and item.elts[0].value == app:
                    return True
    return False


def violations(index, public=None):
    """One line per use that breaks a rule of the module docstring, for the modules outside the lab."""
    public = _public() if public is None else public
    found = []
    for name in sorted(index.modules):
        mine = layer(name)
        if mine not in MAY_USE:
            continue
        module = index.modules[name]
        for use in index.uses(name):
            top = use.target.split(".")[0]
            theirs = LAYER.get(top)
            where = f"{os.path.relpath(module.path, ROOT)}:{use.line}: {name} ({mine}) {use.how} {use.target}"
            if use.names:
                where += f" {list(use.names)}"
            if use.how != "attr" and theirs and theirs not in MAY_USE[mine]:
                found.append(f"{where}: {mine} may not use {theirs}")
            elif use.how != "attr" and not theirs and top in NO_THIRD_PARTY.get(mine, ()):
                found.append(f"{where}: {mine} may not use {top}")
            if PUBLIC_ONLY.get(mine) == top:
                ok = {
                    "import": use.target == top,
                    "call": use.target == top or use.target in BY_PATH,
                    "from": use.target == top and set(use.names) <= public,
                    "attr": use.target.rpartition(".")[0] != top or use.target.rpartition(".")[2] in public,
                    "model": ".migrations." in name and _declares_dependency(module, top),
                }.get(use.how, False)
                if not ok:
                    found.append(f"{where}: {mine} may use {top}'s public API only ({top}.__all__)")
    return found


def late_imports(index, name):
    """The fastpoll, plurkcore and fastpath modules ``name`` imports at call time."""
    return [f"{use.line}: {use.target}" for use in index.uses(name)
            if not use.top and use.how in ("import", "from", "call", "cimport")
            and use.target.split(".")[0] in ("fastpoll", "plurkcore", "fastpath")]


def _graph(index):
    return index.graph([m for m in index.modules if layer(m) in MAY_USE])


# -- the tree ------------------------------------------------------------------------------------

def test_the_scan_sees_the_tree():
    """What the rules below stand on: Cython files are read, fastpoll's lazy table is understood,
    the example is scanned, and plurkcore's 0006 is the migration the exemption is for."""
    assert INDEX.modules["fastpath._lifecycle"].kind == INDEX.modules["fastpath.includes.fastpath"].kind == "pyx"
    assert ("fastpath.includes.process", "cimport") in {(u.target, u.how) for u in INDEX.uses("fastpath._lifecycle")}
    assert set(INDEX.lazy("fastpoll")) == _public() - {"__version__"}
    assert INDEX.lazy("fastpoll")["touch"] == "fastpoll.changes"
    assert len([m for m in INDEX.modules if layer(m) == "examples"]) >= 8
    assert any(u.how == "model" and u.target == "fastpoll" for u in INDEX.uses("plurkcore.migrations.0006_fastpoll_tables"))
    graph = _graph(INDEX)
    assert "fastpoll.changes" in graph["fastpoll"]                  # the lazy table's arrows
    assert "fastpoll.changes" in graph["plurkcore.receivers"]       # fastpoll.touch -> fastpoll.changes


def test_layers_import_one_way():
    assert violations(INDEX) == []


def test_no_import_cycle_of_any_length():
    assert cycles(_graph(INDEX)) == []


@pytest.mark.parametrize("module", sorted(m for m in INDEX.modules if m.startswith("fastpoll.") and m != "fastpoll.apps"))
def test_fastpoll_imports_at_module_level_only(module):
    """A call-time import hides an arrow from readers (``ready()`` is where Django wants them: it
    runs once the apps are loaded)."""
    assert late_imports(INDEX, module) == []


# -- the rules catch what a review found them missing ---------------------------------------------

def _with(sources):
    """The tree with ``sources`` added; ``"+path"`` appends to the file's real text."""
    real = {}
    for rel, text in sources.items():
        if rel.startswith("+"):
            rel = rel[1:]
            with open(os.path.join(ROOT, rel), encoding="utf-8") as fh:
                text = fh.read() + "\n" + text
        real[rel] = text
    example = any(rel.startswith(("inbox/", "inbox_site/")) for rel in real)
    return INDEX.with_sources(real, EXAMPLES if example else ROOT)


BREAKS = {
    "plurkcore imports the demo site": ({"plurkcore/zz_demo.py": "from plurksite import config\n"}, "plurksite"),
    "plurkcore reaches a submodule through the package": (
        {"plurkcore/zz_attr.py": "import fastpoll\n\n\ndef f():\n    return fastpoll.conf.get_config()\n"}, "fastpoll.conf"),
    "plurkcore getattr()s a private name": (
        {"plurkcore/zz_attr.py": "import fastpoll\ngetattr(fastpoll, 'keys')\n"}, "fastpoll.keys"),
    "plurkcore renames fastpoll": (
        {"plurkcore/zz_attr.py": "import fastpoll as fp\nfp.publish.write_answers({})\n"}, "fastpoll.publish"),
    "plurkcore imports a fastpoll submodule": (
        {"plurkcore/zz_sub.py": "import fastpoll.publish\n"}, "fastpoll.publish"),
    "plurkcore imports a private name in a function": (
        {"plurkcore/zz_late.py": "def f():\n    from fastpoll import touch, conf\n"}, "['touch', 'conf']"),
    "plurkcore imports through a dynamic import": (
        {"plurkcore/zz_dyn.py": "import importlib\nimportlib.import_module('.conf', 'fastpoll')\n"}, "fastpoll.conf"),
    "plurkcore takes a fastpoll model by label": (
        {"plurkcore/zz_model.py": "from django.apps import apps\napps.get_model('fastpoll', 'UserState')\n"}, "model fastpoll"),
    "plurkcore imports fastpath": ({"plurkcore/zz_fp.py": "from fastpath import options\n"}, "fastpath"),
    "a plurkcore migration takes a fastpoll model without depending on it": (
        {"plurkcore/migrations/9999_zz.py": "def f(apps, schema_editor):\n    apps.get_model('fastpoll.UserState')\n\n\n"
                                            "dependencies = [('plurkcore', '0006_fastpoll_tables')]\n"}, "model fastpoll"),
    "fastpoll imports plurkcore dynamically": (
        {"fastpoll/zz_dyn.py": "import importlib\n\n\ndef f():\n    importlib.import_module('plurkcore.models')\n"}, "plurkcore.models"),
    "fastpoll looks a Plurk model up": (
        {"fastpoll/zz_dyn.py": "import django.apps\n\n\ndef f():\n    django.apps.apps.get_model('plurkcore', 'Plurk')\n"}, "model plurkcore"),
    "a fastpoll model relates to a Plurk model": (
        {"fastpoll/zz_models.py": "from django.db import models\nx = models.ForeignKey('plurkcore.Plurk', models.CASCADE)\n"},
        "model plurkcore"),
    "a fastpoll migration depends on plurkcore": (
        {"fastpoll/migrations/9999_zz.py": "class Migration:\n    dependencies = [('plurkcore', '0006_fastpoll_tables')]\n"},
        "model plurkcore"),
    "fastpoll includes plurkcore's URLs": (
        {"fastpoll/zz_urls.py": "from django.urls import include\ninclude('plurkcore.urls')\n"}, "plurkcore.urls"),
    "fastpoll imports the test rig": ({"fastpoll/zz_rig.py": "from tests.support import servers\n"}, "tests.support"),
    "the demo imports bench": ({"plurksite/zz_rig.py": "__import__('bench.common')\n"}, "bench.common"),
    "the demo imports locustfiles late": ({"plurkweb/zz_rig.py": "def f():\n    import locustfiles\n"}, "locustfiles"),
    "fastpath's .pyx imports fastpoll": ({"+fastpath/_lifecycle.pyx": "import fastpoll\n"}, "import fastpoll"),
    "fastpath's .pyx imports Django in a function": (
        {"+fastpath/_server.pyx": "def f():\n    from django.conf import settings\n"}, "from django.conf"),
    "fastpath's .pxd cimports plurkcore": (
        {"+fastpath/includes/process.pxd": "from plurkcore cimport x\n"}, "plurkcore"),
    "a fastpath .pxi imports fastpoll": (
        {"fastpath/zz_consts.pxi": "DEF N = 1\nfrom fastpoll import touch\n"}, "fastpoll"),
    "the demo runs a bench module": (
        {"plurksite/zz_run.py": "import runpy\nrunpy.run_module('bench.load')\n"}, "bench.load"),
    "fastpath imports Django": ({"fastpath/zz.py": "import django\n"}, "fastpath may not use django"),
    "fastpath imports the demo": ({"fastpath/zz.py": "from plurkweb import views\n"}, "plurkweb"),
    "the example reaches a private name": ({"inbox/zz.py": "import fastpoll\nfastpoll.conf\n"}, "fastpoll.conf"),
    "the example takes a fastpoll model": (
        {"inbox/zz.py": "from django.apps import apps\napps.get_model('fastpoll', 'UserState')\n"}, "model fastpoll"),
    "the example getattr()s a private name": ({"inbox/zz.py": "import fastpoll\ngetattr(fastpoll, 'conf')\n"}, "fastpoll.conf"),
    "the example imports plurkcore": ({"inbox/zz.py": "from plurkcore import answers\n"}, "plurkcore"),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_the_layer_rules_catch(case):
    sources, expected = BREAKS[case]
    found = violations(_with(sources))
    rel = [r.lstrip("+") for r in sources][0]
    assert [v for v in found if rel in v and expected in v], (case, found)


def test_a_migration_may_take_fastpoll_models_when_it_depends_on_fastpoll():
    source = ("def f(apps, schema_editor):\n    apps.get_model('fastpoll', 'UserState')\n\n\n"
              "class Migration:\n    dependencies = [('fastpoll', '0001_initial')]\n")
    assert violations(_with({"plurkcore/migrations/9999_zz.py": source})) == []
    assert violations(_with({"plurkcore/zz.py": source}))


def test_the_late_import_rule_catches():
    index = _with({"fastpoll/zz_late.py": "import importlib\n\n\ndef f():\n    importlib.import_module('fastpoll.publish')\n"})
    assert late_imports(index, "fastpoll.zz_late") == ["5: fastpoll.publish"]


CYCLES = {
    "through fastpoll.touch's lazy module": (
        {"fastpoll/zz_lazy.py": "import fastpoll\n\n\ndef f():\n    fastpoll.touch('x')\n",
         "+fastpoll/changes.py": "from . import zz_lazy\n"}, {"fastpoll.changes", "fastpoll.zz_lazy"}),
    "through fastpoll's lazy table": (
        {"plurksite/zz_q.py": "import fastpoll\n", "+fastpoll/changes.py": "import plurksite.zz_q\n"},
        {"fastpoll", "fastpoll.changes", "plurksite.zz_q"}),
    "through the package above an imported module": (
        {"plurksite/zz_p.py": "import plurkcore.http\n", "+plurkcore/__init__.py": "import plurksite.zz_p\n"},
        {"plurkcore", "plurksite.zz_p"}),
    "through a call-time import": (
        {"fastpoll/zz_a.py": "def f():\n    from fastpoll import zz_b\n", "fastpoll/zz_b.py": "from . import zz_a\n"},
        {"fastpoll.zz_a", "fastpoll.zz_b"}),
    "through dynamic imports": (
        {"fastpoll/zz_a.py": "import importlib\nimportlib.import_module('fastpoll.zz_b')\n",
         "fastpoll/zz_b.py": "__import__('fastpoll.zz_a')\n"}, {"fastpoll.zz_a", "fastpoll.zz_b"}),
    "through Cython": (
        {"+fastpath/_server.pyx": "from fastpath cimport _lifecycle\n"}, {"fastpath._server", "fastpath._lifecycle"}),
}


@pytest.mark.parametrize("case", sorted(CYCLES))
def test_the_cycle_test_catches(case):
    sources, expected = CYCLES[case]
    assert [c for c in cycles(_graph(_with(sources))) if expected <= set(c)], case


def test_a_package_importing_its_own_modules_is_no_cycle():
    index = Index.from_sources({"pa/__init__.py": "from .x import f\n", "pa/x.py": "from . import y\nimport pa.y\n",
                                "pa/y.py": "import pa\n"})
    assert index.graph() == {"pa": {"pa.x"}, "pa.x": {"pa.y"}, "pa.y": set()}
    assert cycles(index.graph()) == []
