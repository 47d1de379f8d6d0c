"""Management commands: checkcache, repaircache, warmcache (and the demo's seeddemo, over plurkcore's models)."""
import io
import os
import signal
import subprocess
import sys

import pytest
from django.core.management import call_command

from fastpoll.models import SuspectServer
from plurkcore.models import Follow, Plurk

from .helpers import cached, key_of, server_client, truth

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(*args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue()


def test_checkcache_finds_and_fixes_differences(signup, cache1):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    a.call("POST", "/api/plurks", {"content": "x"})
    assert run("checkcache")[0] == 0
    key = key_of("getUnreadCount", b.user["id"])
    server_client(cache1.spec).set(key, b'{"count":99}')
    code, out = run("checkcache")
    assert code == 1 and key in out and "1 difference" in out
    code, out = run("checkcache", "--fix")
    assert code == 1 and "(fixed)" in out
    assert cached("getUnreadCount", b.user["id"], [cache1]) == truth("getUnreadCount", b.user["id"])
    assert run("checkcache") == (0, run("checkcache")[1])
    server_client(cache1.spec).delete(key)          # a miss is not a difference
    assert run("checkcache")[0] == 0


def test_checkcache_checks_the_object_answers_memcached_holds(signup, cache1):
    from fastpoll import keys

    a = signup("a")
    one = a.call("POST", "/api/plurks", {"content": "x"}).json()["id"]
    url = a.call("GET", f"/api/plurks/{one}").json()["poll"]
    assert a.get(url, HTTP_AUTHORIZATION=f"Bearer {a.token}").status_code == 204    # Django fills it
    a.call("POST", f"/api/plurks/{one}/responses", {"content": "first"})
    key = keys.object_key("getThread", one)
    assert server_client(cache1.spec).get(key) is not None
    code, out = run("checkcache")
    assert code == 0 and "1 cached object answer(s)" in out, out
    server_client(cache1.spec).set(key, b'{"responses":[]}')
    server_client(cache1.spec).set(keys.object_key("getThread", 987654), b"gone")    # no such plurk
    code, out = run("checkcache")
    assert code == 1 and key in out and "2 difference(s)" in out, out
    assert run("checkcache", "--fix")[0] == 1
    code, out = run("checkcache")
    assert code == 0 and "0 difference(s)" in out, out
    assert server_client(cache1.spec).get(key) not in (None, b'{"responses":[]}')


def test_repaircache_flushes_returned_server(signup, cache1):
    signup("a")
    SuspectServer.objects.create(server=cache1.spec)
    server_client(cache1.spec).set("p1:getUnreadCount:999:0", b"old")
    code, out = run("repaircache")
    assert code == 0 and f"flushed {cache1.spec}" in out
    assert server_client(cache1.spec).get("p1:getUnreadCount:999:0") is None
    assert not SuspectServer.objects.exists()


def test_repaircache_loop_stops_on_sigterm(tmp_path):
    env = dict(os.environ, PLURK_DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3",
               PLURK_MEMCACHED="127.0.0.1:1", PLURK_SECRET_FILE=str(tmp_path / "secret.key"))
    manage = os.path.join(os.path.dirname(__file__), "..", "..", "manage.py")
    subprocess.run([sys.executable, manage, "migrate", "-v", "0"], env=env, check=True, timeout=120)
    proc = subprocess.Popen([sys.executable, manage, "repaircache", "--loop", "--interval", "0.05"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "checking every" in proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert proc.returncode == 0


def test_repaircache_exits_2_while_a_server_is_unreachable(signup):
    signup("a")                                   # the default cache here is a closed port
    code, out = run("repaircache")
    assert code == 2 and "still unreachable" in out


def _manage(tmp_path, *args, migrate=True):
    env = dict(os.environ, PLURK_DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3",
               PLURK_MEMCACHED="127.0.0.1:1", PLURK_SECRET_FILE=str(tmp_path / "secret.key"))
    manage = os.path.join(os.path.dirname(__file__), "..", "..", "manage.py")
    if migrate:
        subprocess.run([sys.executable, manage, "migrate", "-v", "0"], env=env, check=True, timeout=120)
    return subprocess.run([sys.executable, manage, *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", ["checkcache", "repaircache", "warmcache", "seeddemo"])
def test_an_unmigrated_database_is_one_line_not_a_traceback(tmp_path, command):
    proc = _manage(tmp_path, command, migrate=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("CommandError: the database cannot be used (no such table") and "migrate" in line


@pytest.mark.parametrize("interval", ["nan", "inf", "0", "-1", "soon"])
def test_repaircache_refuses_an_interval_that_is_not_a_positive_number(tmp_path, interval):
    proc = _manage(tmp_path, "repaircache", "--loop", "--interval", interval, migrate=False)
    assert proc.returncode == 2 and "expected a number of seconds above 0" in proc.stderr


def test_seeddemo_is_idempotent(cache1):
    for _ in range(2):
        code, out = run("seeddemo")
        assert code == 0 and "alice" in out and "plurkdemo1" in out
    from django.contrib.auth import authenticate, get_user_model
    assert get_user_model().objects.filter(username__in=["alice", "bob", "carol", "dave"]).count() == 4
    assert authenticate(username="carol", password="plurkdemo1") is not None
    assert Follow.objects.count() == 12
    assert Plurk.objects.count() == 4 and Plurk.entries.count() == 8
    assert run("checkcache")[0] == 0


def test_checkcache_exits_2_when_a_server_could_not_be_checked(signup):
    signup("a")                       # memcached is a closed port here (conftest)
    code, out = run("checkcache")
    assert code == 2
    assert "0 difference(s)" in out


def test_login_writes_the_users_answers_and_warmcache_refills(signup, cache1, client_factory):
    a = signup("a")
    uid = a.user["id"]
    server_client(cache1.spec).flush_all()
    assert cached("getUnreadCount", uid, [cache1]) is None
    resp = client_factory().call("POST", "/api/login", {"username": "a", "password": "secret-pass-1"})
    assert resp.status_code == 200
    assert cached("getUnreadCount", uid, [cache1]) == b""          # first poll after login: a hit
    signup("b")
    server_client(cache1.spec).flush_all()
    code, out = run("warmcache")
    assert code == 0 and "warmed 2 user(s)" in out                  # signup counts as a login
    assert cached("getMessages", uid, [cache1]) == truth("getMessages", uid)


def test_warmcache_skips_users_who_have_not_logged_in_unless_all(signup, cache1):
    from django.contrib.auth import get_user_model

    a = signup("a")
    get_user_model().objects.filter(pk=a.user["id"]).update(last_login=None)
    server_client(cache1.spec).flush_all()
    assert run("warmcache")[1].startswith("warmed 0 user(s)")
    assert cached("getUnreadCount", a.user["id"], [cache1]) is None
    assert run("warmcache", "--all")[1].startswith("warmed 1 user(s)")
    assert cached("getUnreadCount", a.user["id"], [cache1]) == b""


def test_warmcache_fails_loudly_when_memcached_is_down(signup):
    signup("a")                      # memcached is a closed port here (conftest)
    from django.core.management.base import CommandError
    with pytest.raises(CommandError, match="could not be written"):
        call_command("warmcache", stdout=io.StringIO())
