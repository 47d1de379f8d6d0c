"""Source rules that keep the 2009 critique answered: no unbounded string call in fastpath's C,
and the two halves of the contract never import each other."""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C_DIR = os.path.join(ROOT, "fastpath", "src")

# Calls that trust a NUL terminator or an unbounded destination, and case folding that depends on
# the C locale (Python sets it from the environment: under tr_TR, "I" does not fold to "i").
UNBOUNDED = re.compile(r"\b(strlen|strcpy|strcat|sprintf|vsprintf|gets|strtok|strcmp|strchr|strstr|atoi|atol|scanf|sscanf"
                       r"|strcasecmp|strncasecmp|tolower|toupper)\s*\(")


def _c_files():
    if not os.path.isdir(C_DIR):
        return []
    return sorted(os.path.join(C_DIR, n) for n in os.listdir(C_DIR) if n.endswith((".c", ".h")))


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def test_fastpath_c_sources_exist():
    assert _c_files(), "fastpath/src/*.c missing"


@pytest.mark.parametrize("path", _c_files(), ids=os.path.basename)
def test_no_unbounded_string_functions(path):
    with open(path) as fh:
        code = _strip_comments(fh.read())
    offenders = [f"{os.path.basename(path)}:{n}: {line.strip()}"
                 for n, line in enumerate(code.splitlines(), 1) if UNBOUNDED.search(line)]
    assert offenders == []


def _defined_functions(text):
    """Names of the non-static functions a C file defines (a name at the start of a line,
    after its return type, followed by an argument list and a body)."""
    return set(re.findall(r"^(?!static\b)[A-Za-z_][\w \*]*?\b(fp_\w+)\s*\([^;{]*\)\s*\{", text, flags=re.M))


def test_fastpath_c_calls_only_go_down():
    """No file of fastpath/src calls into a file that calls it (docs/fastpath.md draws the
    layers): answers and events come back up through callbacks with a context pointer."""
    sources = {os.path.basename(p)[:-2]: _strip_comments(open(p).read())
               for p in _c_files() if p.endswith(".c")}
    owner = {fn: name for name, text in sources.items() for fn in _defined_functions(text)}
    assert {"fp_mc_get", "fp_conn_open", "fp_server_init"} <= set(owner)   # the scan finds them
    calls = {name: {owner[fn] for fn in re.findall(r"\b(fp_\w+)\s*\(", text)
                    if fn in owner and owner[fn] != name}
             for name, text in sources.items()}
    cycles = sorted(f"{a} <-> {b}" for a in calls for b in calls[a] if a in calls.get(b, ()) and a < b)
    assert cycles == []
    assert calls["fp_mc"] <= {"fp_util", "fp_stats", "fp_hash", "fp_slab"}   # knows nothing of HTTP
    assert "fp_server" not in calls["fp_conn"]


def _imports(package):
    found = set()
    for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
        for name in files:
            if not name.endswith(".py"):
                continue
            with open(os.path.join(dirpath, name)) as fh:
                tree = ast.parse(fh.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.add(node.module.split(".")[0])
    return found


def test_fastpath_never_imports_django_or_plurkcore():
    assert not {"django", "plurkcore", "plurksite"} & _imports("fastpath")


def test_plurkcore_never_imports_fastpath_or_the_project():
    assert not {"fastpath", "plurksite"} & _imports("plurkcore")
