"""``manage.py fastpoll_secret`` and the checks' hints that name it (a project of a user's has no
runner that generates the secret: the command is how it gets one)."""
import os
import stat
import subprocess
import sys

import pytest
from django.conf import settings
from django.core import checks
from django.core.management import CommandError, call_command
from django.test import override_settings

from fastpoll import checks as fastpoll_checks
from fastpoll.secret import read_secret
from tests.support.servers import repo_root


def secret_settings(path):
    return override_settings(FASTPOLL={**settings.FASTPOLL, "KEY_PREFIX": "secret", "SECRET_FILE": path})


def command(*args):
    from io import StringIO
    out = StringIO()
    call_command("fastpoll_secret", *args, stdout=out)
    return out.getvalue()


def mode(path):
    return oct(stat.S_IMODE(os.stat(path).st_mode))


def test_creates_the_file_with_a_fresh_secret_mode_0600(tmp_path):
    path = tmp_path / "fastpoll.key"
    umask = os.umask(0o022)
    try:
        with secret_settings(str(path)):
            out = command()
    finally:
        os.umask(umask)
    assert out == f"wrote a new secret to {path} (mode 0600): give fastpath the same file (--secret-file)\n"
    assert mode(path) == "0o600"
    key = read_secret(str(path))
    assert len(key) == 64 and int(key, 16) >= 0 and path.read_bytes() == key + b"\n"
    other = tmp_path / "other.key"
    with secret_settings(str(other)):
        command()
    assert read_secret(str(other)) != key


def test_refuses_to_overwrite_without_force(tmp_path):
    path = tmp_path / "fastpoll.key"
    path.write_bytes(b"k" * 40 + b"\n")
    path.chmod(0o640)
    with secret_settings(str(path)), pytest.raises(CommandError) as raised:
        command()
    assert str(raised.value) == (f"{path} exists: keeping it (--force replaces it, and every poll token "
                                 f"signed with it stops working)")
    assert path.read_bytes() == b"k" * 40 + b"\n"
    with secret_settings(str(path)):
        out = command("--force")
    assert out == (f"replaced the secret in {path} (mode 0600): restart fastpath and every Django process now "
                   f"(each read the old secret once at start; until they restart, polls answer 401 bad signature); "
                   f"every poll token issued before stops working\n")
    assert len(read_secret(str(path))) == 64 and mode(path) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fastpoll.key"]      # no temporary file left


def test_without_the_setting_or_the_directory_it_says_what_to_do(tmp_path):
    with secret_settings(None), pytest.raises(CommandError, match=r"^FASTPOLL\['SECRET_FILE'\] is not set: "):
        command()
    missing = tmp_path / "nodir" / "fastpoll.key"
    with secret_settings(str(missing)), pytest.raises(CommandError) as raised:
        command()
    assert str(raised.value) == f"cannot write {missing}: No such file or directory"


def test_manage_py_exits_0_then_1_in_one_line(tmp_path):
    """As a user's project runs it: a settings module of its own, django-admin."""
    path = tmp_path / "fastpoll.key"
    (tmp_path / "secret_settings.py").write_text(
        'SECRET_KEY = "x"\nINSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "fastpoll"]\n'
        f'FASTPOLL = {{"SECRET_FILE": {str(path)!r}, "KEY_PREFIX": "t"}}\n')
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "secret_settings",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), repo_root()])}
    argv = [sys.executable, "-m", "django", "fastpoll_secret"]
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.count("\n") == 1 and str(path) in done.stdout and mode(path) == "0o600"
    again = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and again.stderr == (
        f"CommandError: {path} exists: keeping it (--force replaces it, and every poll token signed with "
        f"it stops working)\n")


def problems(path):
    with secret_settings(path):
        return [(e.id, e.hint) for e in checks.run_checks(tags=[fastpoll_checks.TAG]) if e.id.startswith("fastpoll.E00")]


def test_the_checks_hints_name_the_command(tmp_path):
    assert problems(None) == [("fastpoll.E005", "Set it to the path of the secret shared with fastpath, then "
                                                "create the file with `manage.py fastpoll_secret`.")]
    assert problems(str(tmp_path / "missing.key")) == [
        ("fastpoll.E006", "Create it with `manage.py fastpoll_secret`, and give fastpath the same file.")]
    short = tmp_path / "short.key"
    short.write_bytes(b"tooshort\n")
    with secret_settings(str(short)):
        [error] = [e for e in checks.run_checks(tags=[fastpoll_checks.TAG]) if e.id == "fastpoll.E006"]
    assert error.msg == f"{short}: the secret must be 32..1024 bytes, found 8; `manage.py fastpoll_secret --force` writes a new one"
    assert error.hint == ("Make it readable by this user, or write a new secret with `manage.py fastpoll_secret "
                          "--force` (every poll token signed with the old one stops working).")
