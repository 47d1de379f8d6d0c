"""The inbox example (examples/inbox) run with its OWN settings, in subprocesses: pytest's process
has plurksite's settings, and a Django process has one settings module and one user model.

Each scenario is a function of tests/examples/inbox_scenarios.py, run against a real memcached
and a fresh SQLite database migrated by the example's manage.py.
"""
import ast
import os
import subprocess
import sys

import pytest

from tests.support.servers import memcached_servers, repo_root

ROOT = repo_root()
EXAMPLE = os.path.join(ROOT, "examples", "inbox")
SCENARIOS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inbox_scenarios.py")

def run(args, env, timeout=120):
    return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def inbox_env(tmp_path_factory):
    var = tmp_path_factory.mktemp("inbox")
    with memcached_servers(1) as (server,):
        env = dict(os.environ, INBOX_VAR=str(var), INBOX_MEMCACHED=server.spec,
                   INBOX_SECRET_FILE=str(var / "secret" / "poll.key"))
        env.pop("DJANGO_SETTINGS_MODULE", None)
        done = run([os.path.join(EXAMPLE, "manage.py"), "migrate", "-v0"], env)
        assert done.returncode == 0, done.stderr
        yield env


def scenario(env, name):
    done = run([SCENARIOS, name], env)
    assert done.returncode == 0, f"scenario {name} failed:\n{done.stdout}\n{done.stderr[-3000:]}"
    assert done.stdout.strip().endswith(f"ok {name}"), done.stdout


def test_check_and_migrations_are_current(inbox_env):
    done = run([os.path.join(EXAMPLE, "manage.py"), "check", "--fail-level", "WARNING"], inbox_env)
    assert done.returncode == 0, done.stdout + done.stderr
    done = run([os.path.join(EXAMPLE, "manage.py"), "makemigrations", "--check", "--dry-run", "inbox"], inbox_env)
    assert done.returncode == 0, "examples/inbox needs a new migration:\n" + done.stdout + done.stderr
    assert os.path.exists(os.path.join(inbox_env["INBOX_VAR"], "secret", "poll.key"))


def test_new_notification_writes_the_exact_answer_after_commit(inbox_env):
    scenario(inbox_env, "written")


def test_update_and_touch_leave_memcached_equal_to_the_database(inbox_env):
    scenario(inbox_env, "bulk")


def test_poll_view_answers_a_bearer_token_and_401_without(inbox_env):
    scenario(inbox_env, "poll")


def test_logout_revokes_the_poll_tokens(inbox_env):
    scenario(inbox_env, "logout")


def test_a_board_is_written_after_commit_and_polled_with_its_capability(inbox_env):
    scenario(inbox_env, "board")


def test_a_token_and_a_capability_for_any_form_of_a_uuid_user_sign_the_same_user(inbox_env):
    scenario(inbox_env, "user_forms")


# -- the example uses fastpoll's public API only ---------------------------------------------

ALLOWED_STRINGS = {"fastpoll", "fastpoll.urls", "fastpoll.middleware.PollTokenMiddleware"}


def fastpoll_uses(path):
    """Every way ``path`` reaches into fastpoll: (line, what) for what is not the public API."""
    import fastpoll

    public = set(fastpoll.__all__)
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    tree = ast.parse(source, path)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad += [(node.lineno, f"import {a.name}") for a in node.names
                    if a.name.split(".")[0] == "fastpoll" and (a.name != "fastpoll" or a.asname)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "fastpoll":
            bad.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "fastpoll" \
                and node.attr not in public:
            bad.append((node.lineno, f"fastpoll.{node.attr}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "fastpoll" in node.value \
                and node.value.startswith("fastpoll") and node.value not in ALLOWED_STRINGS:
            bad.append((node.lineno, repr(node.value)))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                "__import__", "import_module", "import_string"):
            bad.append((node.lineno, "dynamic import"))
    return bad


def example_sources():
    for dirpath, _, files in os.walk(EXAMPLE):
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def test_example_imports_only_fastpolls_public_names():
    sources = list(example_sources())
    assert len(sources) >= 8, sources
    bad = [f"{os.path.relpath(p, ROOT)}:{line}: {what}" for p in sources for line, what in fastpoll_uses(p)]
    assert not bad, "examples/inbox reaches past fastpoll.__all__:\n" + "\n".join(bad)
    used = "".join(open(p, encoding="utf-8").read() for p in sources)
    assert "import fastpoll" in used and "fastpoll.urls" in used and "fastpoll.middleware.PollTokenMiddleware" in used


@pytest.mark.parametrize("line", [
    "from fastpoll.auth import issue_token", "import fastpoll.publish", "import fastpoll as fp",
    "fastpoll.write_answers({})", "x = 'fastpoll.secret.ensure_secret'", "__import__('fastpoll.keys')",
])
def test_the_import_rule_catches(tmp_path, line):
    path = tmp_path / "bad.py"
    path.write_text(f"import fastpoll\n{line}\n")
    assert fastpoll_uses(str(path)), line


def test_the_walk_through_quotes_the_examples_resources():
    """docs/integrate.md shows the example's two resources as they are in inbox/polls.py."""
    with open(os.path.join(ROOT, "docs", "integrate.md"), encoding="utf-8") as fh:
        blocks = [b.split("```", 1)[0] for b in fh.read().split("```python\n")[1:]]
    with open(os.path.join(EXAMPLE, "inbox", "polls.py"), encoding="utf-8") as fh:
        polls = fh.read()
    quoted = [b for b in blocks if '@fastpoll.resource("inbox"' in b or '@fastpoll.resource("board"' in b]
    assert len(quoted) == 2, "docs/integrate.md should show the inbox and the board resources"
    for block in quoted:
        start = block.index("@fastpoll.resource(")
        assert block[start:] in polls, "docs/integrate.md differs from examples/inbox/inbox/polls.py:\n" + block
