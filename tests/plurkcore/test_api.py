"""The JSON API: shapes, status codes, authentication, CSRF, and a battery of malformed input."""
import json

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from fastpoll import conf, tokens
from fastpoll.auth import signing_key

from .helpers import sqlite_steps

pytestmark = pytest.mark.django_db


def test_signup_shape_and_cookies(api):
    resp = api.call("POST", "/api/signup", {"username": "alice", "password": "secret-pass-1"})
    assert resp.status_code == 201
    body = resp.json()
    assert set(body) == {"token", "user"} and body["user"]["username"] == "alice"
    uid, epoch, expires = tokens.verify(signing_key(), body["token"], 0)
    assert (uid, epoch) == (str(body["user"]["id"]), 0)
    cookie = resp.cookies["plurk_token"]
    assert cookie.value == body["token"] and cookie["httponly"] and cookie["samesite"] == "Lax"
    assert cookie["path"] == "/"
    assert "csrftoken" in resp.cookies
    assert resp["Content-Type"] == "application/json"


def test_token_ttl_comes_from_settings(api, settings):
    settings.FASTPOLL = dict(settings.FASTPOLL, TOKEN_TTL=60)
    body = api.call("POST", "/api/signup", {"username": "ttl", "password": "secret-pass-1"}).json()
    _, _, expires = tokens.verify(signing_key(), body["token"], 0)
    import time
    assert abs(expires - (time.time() + 60)) < 5


@pytest.mark.parametrize("username,password,status", [
    ("taken", "secret-pass-1", 409),
    ("bad name", "secret-pass-1", 400),
    ("x" * 151, "secret-pass-1", 400),
    ("", "secret-pass-1", 400),
    ("ok_name", "short", 400),
    ("ok.name@+-", "12345678", 201),
    ("\u00e9l\u00e8ve", "secret-pass-1", 201),
    (".", "secret-pass-1", 400),
    ("..", "secret-pass-1", 400),
    ("a.", "secret-pass-1", 201),
])
def test_signup_validation(api, username, password, status):
    get_user_model().objects.create_user("taken", password="secret-pass-1")
    resp = api.call("POST", "/api/signup", {"username": username, "password": password})
    assert resp.status_code == status, resp.content
    if status != 201:
        assert "error" in resp.json()


def test_login(api, signup):
    signup("bob")
    resp = api.call("POST", "/api/login", {"username": "bob", "password": "secret-pass-1"})
    assert resp.status_code == 200 and resp.json()["user"]["username"] == "bob"
    assert resp.cookies["plurk_token"].value == resp.json()["token"]
    for creds in ({"username": "bob", "password": "wrong-pass-1"}, {"username": "nobody", "password": "x" * 9}):
        bad = api.call("POST", "/api/login", creds)
        assert bad.status_code == 401 and "error" in bad.json()


def test_usernames_are_checked_and_found_as_django_stores_them(api, signup):
    # create_user stores NFKC; the checks and every lookup must see the same name
    resp = api.call("POST", "/api/signup", {"username": "\ufb01sh", "password": "secret-pass-1"})
    assert resp.status_code == 201 and resp.json()["user"]["username"] == "fish"
    for typed in ("\ufb01sh", "fish"):
        assert api.call("POST", "/api/login", {"username": typed, "password": "secret-pass-1"}).status_code == 200
    viewer = signup("viewer")
    assert viewer.call("GET", "/api/users/\ufb01sh").json()["username"] == "fish"
    assert viewer.call("POST", "/api/follow", {"username": "\ufb01sh"}).json() == {"following": "fish"}
    assert viewer.call("DELETE", "/api/follow/\ufb01sh").status_code == 204
    # NFKC grows these past the column (180 characters) or into spaces: 400, not a 500 or a
    # stored name nobody can log in with
    for name in ("\ufb03" * 60, "\ufdfa" * 9):
        resp = api.call("POST", "/api/signup", {"username": name, "password": "secret-pass-1"})
        assert resp.status_code == 400 and "username" in resp.json()["error"], name
    assert get_user_model().objects.count() == 2


def test_signup_refuses_a_password_login_would_refuse(api):
    longest = "p" * 4096
    too_long = api.call("POST", "/api/signup", {"username": "long", "password": longest + "p"})
    assert too_long.status_code == 400 and "password" in too_long.json()["error"]
    assert api.call("POST", "/api/signup", {"username": "long", "password": longest}).status_code == 201
    assert api.call("POST", "/api/login", {"username": "long", "password": longest}).status_code == 200


def test_logout_revokes_every_token(api, signup):
    bob = signup("bob")
    second = api.call("POST", "/api/login", {"username": "bob", "password": "secret-pass-1"}).json()["token"]
    assert bob.call("GET", "/api/me").status_code == 200
    resp = bob.call("POST", "/api/logout")
    assert resp.status_code == 204 and b"".join(resp.streaming_content) == b""
    assert resp.cookies["plurk_token"].value == ""
    for token in (bob.token, second):
        gone = api.call("GET", "/api/me", token=token)
        assert gone.status_code == 401 and "error" in gone.json()
        assert api.call("GET", "/Poll/getUnreadCount", token=token).status_code == 401
    fresh = api.call("POST", "/api/login", {"username": "bob", "password": "secret-pass-1"}).json()["token"]
    assert tokens.verify(signing_key(), fresh, 0)[1] == 1
    assert api.call("GET", "/api/me", token=fresh).status_code == 200


def test_me_users_follow(signup):
    a, b, c = signup("a"), signup("b"), signup("c")
    assert b.call("POST", "/api/follow", {"username": "a"}).status_code == 201
    again = b.call("POST", "/api/follow", {"username": "a"})
    assert again.status_code == 200 and again.json() == {"following": "a"}
    assert c.call("POST", "/api/follow", {"username": "a"}).status_code == 201
    assert b.call("POST", "/api/follow", {"username": "c"}).status_code == 201
    assert b.call("POST", "/api/follow", {"username": "b"}).status_code == 400
    assert b.call("POST", "/api/follow", {"username": "zed"}).status_code == 404
    assert b.call("GET", "/api/me").json() == {"id": b.user["id"], "username": "b",
                                               "following": ["a", "c"], "followers": 0}
    a.call("POST", "/api/plurks", {"content": "one"})
    profile = b.call("GET", "/api/users/a").json()
    assert profile["followers"] == 2 and profile["following"] == 0 and profile["is_following"] is True
    assert [p["content"] for p in profile["plurks"]] == ["one"]
    assert set(profile) == {"id", "username", "followers", "following", "is_following", "plurks"}
    assert a.call("GET", "/api/users/b").json()["is_following"] is False
    assert b.call("GET", "/api/users/nobody").status_code == 404
    assert b.call("DELETE", "/api/follow/a").status_code == 204
    assert b.call("DELETE", "/api/follow/a").status_code == 204
    assert b.call("DELETE", "/api/follow/nobody").status_code == 404
    assert b.call("GET", "/api/me").json()["following"] == ["c"]


def test_plurks_responses_and_shapes(signup):
    a, b = signup("a"), signup("b")
    resp = a.call("POST", "/api/plurks", {"content": "  hello \u2603  "})
    assert resp.status_code == 201
    plurk = resp.json()
    assert set(plurk) == {"id", "author", "content", "created", "response_count"}
    assert plurk["content"] == "hello \u2603" and plurk["author"] == "a" and plurk["response_count"] == 0
    assert plurk["created"].endswith("Z") and "T" in plurk["created"]
    r = b.call("POST", f"/api/plurks/{plurk['id']}/responses", {"content": "hi"})
    assert r.status_code == 201
    response = r.json()
    assert set(response) == {"id", "plurk_id", "author", "content", "created"}
    assert response["plurk_id"] == plurk["id"] and response["id"] > plurk["id"]
    detail = a.call("GET", f"/api/plurks/{plurk['id']}").json()
    assert detail["response_count"] == 1 and detail["responses"] == [response]
    # a response is not a plurk: no responses to responses, no detail page
    assert b.call("GET", f"/api/plurks/{response['id']}").status_code == 404
    assert b.call("POST", f"/api/plurks/{response['id']}/responses", {"content": "x"}).status_code == 404
    assert b.call("POST", "/api/plurks", {"content": "x" * 360}).status_code == 201
    for bad in ("", "   ", "x" * 361):
        assert b.call("POST", "/api/plurks", {"content": bad}).status_code == 400


def test_timeline_paging(signup):
    a, b, c = signup("a"), signup("b"), signup("c")
    b.call("POST", "/api/follow", {"username": "a"})
    ids = []
    for i in range(5):
        ids.append(a.call("POST", "/api/plurks", {"content": f"a{i}"}).json()["id"])
        ids.append(b.call("POST", "/api/plurks", {"content": f"b{i}"}).json()["id"])
        c.call("POST", "/api/plurks", {"content": f"c{i}"})
    page = b.call("GET", "/api/timeline?limit=4").json()
    assert [p["id"] for p in page["items"]] == sorted(ids, reverse=True)[:4]
    assert page["next"] == page["items"][-1]["id"]
    seen = [p["id"] for p in page["items"]]
    while page["next"]:
        page = b.call("GET", f"/api/timeline?limit=4&before={page['next']}").json()
        seen += [p["id"] for p in page["items"]]
    assert seen == sorted(ids, reverse=True)
    assert len(b.call("GET", "/api/timeline").json()["items"]) == 10


@pytest.mark.skipif("connection.vendor != 'sqlite'", reason="counts SQLite's own instructions")
def test_a_timeline_page_costs_its_page_not_the_authors_history(signup):
    """The page's response counts are counted for its rows: Count("responses") joined and grouped
    every plurk of the followed authors with their responses before the LIMIT applied."""
    from plurkcore.models import Plurk

    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    first = a.call("POST", "/api/plurks", {"content": "first"}).json()["id"]
    b.call("POST", f"/api/plurks/{first}/responses", {"content": "re"})

    def steps():
        pages = []
        return sqlite_steps(lambda: pages.append(b.call("GET", "/api/timeline?limit=5").json())), pages[0]

    for i in range(5):
        a.call("POST", "/api/plurks", {"content": f"new {i}"})
    before, _ = steps()
    old = Plurk.entries.bulk_create([Plurk(author_id=a.user["id"], content="old") for _ in range(3000)])
    if not old[0].pk:
        old = list(Plurk.objects.filter(content="old"))
    Plurk.entries.bulk_create([Plurk(author_id=b.user["id"], parent=p, content="re") for p in old])
    newest = [a.call("POST", "/api/plurks", {"content": f"newest {i}"}).json()["id"] for i in range(5)]
    b.call("POST", f"/api/plurks/{newest[0]}/responses", {"content": "re"})
    after, page = steps()
    assert [p["id"] for p in page["items"]] == newest[::-1]
    assert [p["response_count"] for p in page["items"]] == [0, 0, 0, 0, 1]
    assert after <= before * 1.5 + 10, (before, after)


def test_mark_read_moves_forward_only(signup):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    ids = [a.call("POST", "/api/plurks", {"content": str(i)}).json()["id"] for i in range(3)]
    assert b.call("POST", "/api/markRead", {"upto": ids[0]}).json() == {"count": 2}
    assert b.call("POST", "/api/markRead", {"upto": 0}).json() == {"count": 2}
    assert b.call("POST", "/api/markRead", {"upto": 2**63 - 1}).json() == {"count": 0}
    # the cursor was clamped to the newest id: later plurks are unread
    a.call("POST", "/api/plurks", {"content": "later"})
    assert b.call("POST", "/api/markRead", {"upto": 0}).json() == {"count": 1}


def test_authentication_sources(api, signup, client_factory):
    bob = signup("bob")
    assert api.call("GET", "/api/me").status_code == 401
    assert api.call("GET", "/api/me", HTTP_AUTHORIZATION="bearer " + bob.token).status_code == 200
    assert api.call("GET", "/api/me", HTTP_AUTHORIZATION="Basic " + bob.token).status_code == 401
    cookie_client = client_factory()
    cookie_client.cookies["plurk_token"] = bob.token
    assert cookie_client.call("GET", "/api/me").status_code == 200
    # a Bearer header wins over the cookie, even when it is invalid; another scheme is not ours
    assert cookie_client.call("GET", "/api/me", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
    assert cookie_client.call("GET", "/api/me", HTTP_AUTHORIZATION="Basic Zm9vOmJhcg==").status_code == 200
    expired = tokens.sign(signing_key(), bob.user["id"], 0, 1)
    assert api.call("GET", "/api/me", token=expired).json()["error"] == "token expired"
    other = tokens.sign(b"k" * 64, bob.user["id"], 0, 2**40)
    assert api.call("GET", "/api/me", token=other).status_code == 401
    get_user_model().objects.filter(pk=bob.user["id"]).update(is_active=False)
    assert api.call("GET", "/api/me", token=bob.token).status_code == 401


def test_cookie_writes_need_csrf_bearer_writes_do_not(client_factory, signup):
    signup("a")
    browser = client_factory(enforce_csrf_checks=True)
    resp = browser.call("POST", "/api/signup", {"username": "web", "password": "secret-pass-1"})
    assert resp.status_code == 201
    csrf = browser.cookies["csrftoken"].value
    denied = browser.call("POST", "/api/plurks", {"content": "no csrf"})
    assert denied.status_code == 403 and "CSRF" in denied.json()["error"]
    assert browser.call("POST", "/api/plurks", {"content": "with csrf"}, HTTP_X_CSRFTOKEN=csrf).status_code == 201
    assert browser.call("GET", "/api/me").status_code == 200        # reads need no token
    bearer = client_factory(enforce_csrf_checks=True)
    token = resp.json()["token"]
    assert bearer.call("POST", "/api/plurks", {"content": "bearer"}, token=token).status_code == 201
    assert browser.call("POST", "/api/logout").status_code == 403
    assert browser.call("POST", "/api/logout", HTTP_X_CSRFTOKEN=csrf).status_code == 204


@pytest.mark.parametrize("path", ["/api/login", "/api/signup"])
def test_another_site_cannot_log_a_browser_in(client_factory, signup, path):
    signup("victim")
    browser = client_factory(enforce_csrf_checks=True)
    # what an HTML form with enctype=text/plain on another site sends
    forged = browser.generic("POST", path, b'{"username":"victim","password":"secret-pass-1","x":"="}',
                             content_type="text/plain", HTTP_ORIGIN="https://evil.example")
    assert forged.status_code == 403 and "CSRF" in forged.json()["error"]
    assert "plurk_token" not in forged.cookies
    fetched = browser.call("POST", path, {"username": "victim", "password": "secret-pass-1"},
                           HTTP_SEC_FETCH_SITE="cross-site")
    assert fetched.status_code == 403
    # the site's own page: same origin, the csrftoken cookie its pages set, echoed in X-CSRFToken
    browser.cookies["csrftoken"] = csrf = "a" * 32
    own = browser.call("POST", path, {"username": "victim" if path == "/api/login" else "newcomer",
                                      "password": "secret-pass-1"},
                       HTTP_ORIGIN="http://testserver", HTTP_X_CSRFTOKEN=csrf)
    assert own.status_code in (200, 201), own.content


def test_a_deactivated_account_can_be_unfollowed(signup):
    a, b = signup("a"), signup("b")
    assert a.call("POST", "/api/follow", {"username": "b"}).status_code == 201
    get_user_model().objects.filter(username="b").update(is_active=False)
    assert a.call("GET", "/api/users/b").status_code == 404
    assert a.call("DELETE", "/api/follow/b").status_code == 204
    assert a.call("GET", "/api/me").json()["following"] == []
    assert a.call("DELETE", "/api/follow/nobody").status_code == 404


def test_methods_head_with_get_and_allow_lists(signup):
    me = signup("m")
    head = me.call("HEAD", "/api/me")
    assert head.status_code == 200 and head.content == b""
    put = me.call("PUT", "/api/me")
    assert put.status_code == 405 and put["Allow"] == "GET, HEAD"
    assert me.call("PUT", "/Poll/getUnreadCount")["Allow"] == "GET, HEAD, POST"
    for method in ("TRACE", "FOO", "PUT"):
        missing = me.generic(method, "/api/nope")
        assert missing.status_code == 404 and "Allow" not in missing, method


MALFORMED = [
    ("POST", "/api/signup", b"{not json"),
    ("POST", "/api/signup", b"[1, 2]"),
    ("POST", "/api/signup", b'"string"'),
    ("POST", "/api/signup", b"null"),
    ("POST", "/api/signup", b""),
    ("POST", "/api/signup", b"\xff\xfe\x00garbage"),
    ("POST", "/api/signup", b'{"username": 5, "password": "secret-pass-1"}'),
    ("POST", "/api/signup", b'{"username": ["a"], "password": "secret-pass-1"}'),
    ("POST", "/api/signup", b'{"username": "ok", "password": null}'),
    ("POST", "/api/signup", b'{"username": "a\\u0000b", "password": "secret-pass-1"}'),
    ("POST", "/api/signup", b'{"username": "ok", "password": "' + b"p" * 70000 + b'"}'),
    ("POST", "/api/signup", b"[" * 100000),
    ("POST", "/api/login", b'{"username": {}, "password": 1}'),
    ("POST", "/api/login", b'{"username": "' + b"u" * 5000 + b'", "password": "secret-pass-1"}'),
    ("POST", "/api/signup", b'{"username": "lone\\ud800", "password": "secret-pass-1"}'),
    ("POST", "/api/signup", b'{"username": "ok", "password": "nul\\u0000-in-password"}'),
    ("POST", "/api/login", b'{"username": "a\\u0000b", "password": "secret-pass-1"}'),
    ("POST", "/api/plurks", b'{"content": "nul \\u0000 inside"}'),
    ("POST", "/api/plurks", b'{"content": "lone \\udc00 surrogate"}'),
    ("POST", "/api/follow", b'{"username": "k\\u0000"}'),
    ("GET", "/api/users/a%00b", None),
    ("DELETE", "/api/follow/a%00b", None),
    ("GET", "/api/signup", None),
    ("PUT", "/api/plurks", b"{}"),
    ("POST", "/api/plurks", b'{"content": 42}'),
    ("POST", "/api/plurks", b'{"content": null}'),
    ("POST", "/api/plurks", b'{}'),
    ("POST", "/api/plurks", b'{"content": "' + b"x" * 100000 + b'"}'),
    ("POST", "/api/plurks/99999999999999999999999999/responses", b'{"content": "x"}'),
    ("POST", "/api/plurks/123456/responses", b'{"content": "x"}'),
    ("GET", "/api/plurks/99999999999999999999999999", None),
    ("GET", "/api/plurks/abc", None),
    ("GET", "/api/plurks/%0A", None),
    ("GET", "/api/me/%0A", None),
    ("GET", "/Poll/getUnreadCount%0A", None),
    ("POST", "/api/follow", b'{"username": 7}'),
    ("POST", "/api/follow", b'{"username": "nobody"}'),
    ("POST", "/api/follow", b'{"username": "' + b"n" * 1000 + b'"}'),
    ("DELETE", "/api/follow/" + "n" * 1000, None),
    ("GET", "/api/users/" + "%E2%98%83" * 10, None),
    ("POST", "/api/markRead", b'{"upto": "12"}'),
    ("POST", "/api/markRead", b'{"upto": -1}'),
    ("POST", "/api/markRead", b'{"upto": true}'),
    ("POST", "/api/markRead", b'{"upto": 1.5}'),
    ("POST", "/api/markRead", b'{"upto": 1e400}'),
    ("POST", "/api/markRead", b'{"upto": 99999999999999999999999999}'),
    ("GET", "/api/timeline?limit=0", None),
    ("GET", "/api/timeline?limit=101", None),
    ("GET", "/api/timeline?limit=-1", None),
    ("GET", "/api/timeline?limit=%EF%BC%91", None),
    ("GET", "/api/timeline?before=abc", None),
    ("GET", "/api/timeline?before=99999999999999999999999", None),
    ("GET", "/api/nothing-here", None),
    ("GET", "/api", None),
    ("GET", "/Poll/", None),
    ("GET", "/Poll/getNothing", None),
    ("GET", "/Poll/bad-name!", None),
    ("DELETE", "/Poll/getUnreadCount", None),
]


@pytest.mark.parametrize("method,path,body", MALFORMED, ids=lambda v: str(v)[:40])
def test_malformed_input_gives_json_4xx(signup, method, path, body):
    signup("known")
    client = signup("me")
    kwargs = {}
    if body is not None:
        kwargs = {"data": body, "content_type": "application/json"}
    resp = getattr(client, method.lower())(path, HTTP_AUTHORIZATION=f"Bearer {client.token}", **kwargs)
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.content[:200])
    assert resp["Content-Type"] == "application/json"
    assert isinstance(json.loads(resp.content)["error"], str)


@pytest.mark.parametrize("header", ["Bearer", "Bearer ", "Bearer  x", "v1.1.0.1.00", "Bearer v1.\u00e9",
                                    "Bearer " + "v1." * 1000])
def test_bad_tokens_give_json_401(api, header):
    for path in ("/api/me", "/Poll/getMessages"):
        resp = api.get(path, HTTP_AUTHORIZATION=header)
        assert resp.status_code == 401 and "error" in resp.json()


def test_unexpected_errors_are_json_500(signup, monkeypatch):
    client = signup("boom")
    from plurkcore import api

    monkeypatch.setattr(api, "unread_counts", lambda uids: 1 / 0)
    resp = client.call("POST", "/api/markRead", {"upto": 0})
    assert resp.status_code == 500 and resp.json() == {"error": "internal error"}


def test_settings_are_cached_and_reset(settings):
    assert conf.get_config()["CACHE_TTL"] == conf.DEFAULTS["CACHE_TTL"]
    settings.FASTPOLL = dict(settings.FASTPOLL, CACHE_TTL=5)
    assert conf.get_config()["CACHE_TTL"] == 5


def test_database_unavailable_is_503_json_not_500(client, monkeypatch):
    """An overloaded database (SQLite 'database is locked') answers 503 + Retry-After, never 500."""
    from django.db import OperationalError

    from plurkcore import api

    def locked(*args, **kwargs):
        raise OperationalError("database is locked")

    monkeypatch.setattr(api.fastpoll, "issue_token", locked)
    resp = client.post("/api/signup", data={"username": "lockme", "password": "long-enough-1"},
                       content_type="application/json")
    assert resp.status_code == 503
    assert resp["Retry-After"] == "1"
    assert resp.json() == {"error": "database busy, retry shortly"}


@pytest.mark.parametrize("content_type", ["multipart/form-data", "multipart/form-data; boundary=",
                                          "multipart/form-data; boundary=x\x00y"])
def test_cookie_write_with_a_broken_multipart_body_is_a_400(client_factory, content_type):
    """The CSRF check reads request.POST; a multipart body it cannot parse is the client's
    error (400 JSON), not a 500."""
    browser = client_factory(enforce_csrf_checks=True)
    resp = browser.call("POST", "/api/signup", {"username": "mp", "password": "secret-pass-1"})
    csrf = browser.cookies["csrftoken"].value
    resp = browser.generic("POST", "/api/plurks", b"--x\r\ngarbage", content_type=content_type,
                           HTTP_X_CSRFTOKEN=csrf)
    assert resp.status_code == 400, resp.content
    assert resp["Content-Type"] == "application/json" and "malformed" in resp.json()["error"]


@pytest.mark.parametrize("path", ["/api/me", "/api/nothing/here", "/Poll/getUnreadCount"])
def test_a_host_outside_allowed_hosts_gets_json(api, path, settings):
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    settings.DEBUG = False
    resp = api.get(path, HTTP_HOST="evil.example")
    assert resp.status_code == 400
    assert resp["Content-Type"] == "application/json" and resp.json() == {"error": "bad request"}


def test_pages_keep_html_errors(api, settings):
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    resp = api.get("/", HTTP_HOST="evil.example", HTTP_ACCEPT="text/html")
    assert resp.status_code == 400 and b"<" in resp.content
