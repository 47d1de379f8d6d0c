"""Source rules that keep the 2009 critique answered: no unbounded string call in fastpath's C,
and the two halves of the contract never import each other."""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C_DIR = os.path.join(ROOT, "fastpath", "src")

# Calls that trust a NUL terminator or an unbounded destination.
UNBOUNDED = re.compile(r"\b(strlen|strcpy|strcat|sprintf|vsprintf|gets|strtok|strcmp|strchr|strstr|atoi|atol|scanf|sscanf)\s*\(")


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
