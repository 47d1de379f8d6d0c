"""getThread: Plurk's per-object resource (one key per plurk, read by everyone who has the plurk
open, with a capability that GET /api/plurks/<id> hands out)."""
import pytest

from fastpoll import keys
from plurkcore import answers

from .helpers import server_client

pytestmark = pytest.mark.django_db(transaction=True)


def _cached(key, cache):
    client = server_client(cache.spec)
    try:
        return client.get(key)
    finally:
        client.close()


def _open(client, plurk_id):
    resp = client.call("GET", f"/api/plurks/{plurk_id}")
    assert resp.status_code == 200, resp.content
    return resp.json()["poll"]


def test_a_thread_is_answered_and_cached_and_follows_new_responses(signup, cache1):
    a, b = signup("a"), signup("b")
    plurk = a.call("POST", "/api/plurks", {"content": "thread"}).json()
    url = _open(b, plurk["id"])
    assert url.startswith(f"/Poll/getThread/{plurk['id']}?cap=c1.getThread.{plurk['id']}.{b.user['id']}.")
    first = b.get(url, HTTP_AUTHORIZATION=f"Bearer {b.token}")
    assert first.status_code == 204 and first["X-Cache"] == "MISS"          # no responses yet
    assert _cached(keys.object_key("getThread", plurk["id"]), cache1) == b""
    assert _cached(keys.marker_key(b.user["id"], 0), cache1) == b""          # fastpath checks it
    assert a.call("POST", f"/api/plurks/{plurk['id']}/responses", {"content": "first!"}).status_code == 201
    value = _cached(keys.object_key("getThread", plurk["id"]), cache1)
    assert value == answers.get_thread([plurk["id"]])[plurk["id"]]
    body = b.get(url, HTTP_AUTHORIZATION=f"Bearer {b.token}").json()
    assert body["count"] == 1 and body["responses"][0]["content"] == "first!"


def _forge(url):
    """``url`` with its capability's last character changed (to another one, always)."""
    return url[:-1] + ("1" if url[-1] == "0" else "0")


@pytest.mark.parametrize("tamper", ["missing", "other user", "other plurk", "forged"])
def test_a_capability_opens_one_thread_for_one_user(signup, cache1, tamper):
    a, b = signup("a"), signup("b")
    one = a.call("POST", "/api/plurks", {"content": "one"}).json()["id"]
    two = a.call("POST", "/api/plurks", {"content": "two"}).json()["id"]
    url = {"missing": f"/Poll/getThread/{one}",
           "other user": _open(a, one),
           "other plurk": _open(b, two).replace(f"/getThread/{two}?", f"/getThread/{one}?"),
           "forged": _forge(_open(b, one))}[tamper]
    resp = b.get(url, HTTP_AUTHORIZATION=f"Bearer {b.token}")
    assert resp.status_code == 403 and "capability" in resp.json()["error"], resp.json()


def test_a_revoked_token_loses_its_marker_and_its_threads(signup, cache1):
    a, b = signup("a"), signup("b")
    plurk = a.call("POST", "/api/plurks", {"content": "thread"}).json()
    url = _open(b, plurk["id"])
    assert b.get(url, HTTP_AUTHORIZATION=f"Bearer {b.token}").status_code == 204
    assert _cached(keys.marker_key(b.user["id"], 0), cache1) == b""
    assert b.call("POST", "/api/logout").status_code == 204
    assert _cached(keys.marker_key(b.user["id"], 0), cache1) is None
    assert b.get(url, HTTP_AUTHORIZATION=f"Bearer {b.token}").status_code == 401


def test_a_per_user_resource_is_not_an_object_one(signup):
    a = signup("a")
    assert a.get("/Poll/getMessages/1", HTTP_AUTHORIZATION=f"Bearer {a.token}").status_code == 404
    assert a.get("/Poll/getThread", HTTP_AUTHORIZATION=f"Bearer {a.token}").status_code == 404


def test_a_response_moved_to_another_plurk_rewrites_both_threads(signup, cache1):
    """The watcher reads the row as it was before an update: the thread a response leaves is
    rewritten too, not left showing it until the cache's TTL (found adopting fastpoll: a message
    moved to another recipient stayed in the first one's answer)."""
    from plurkcore.models import Plurk

    a = signup("a")
    one, two = (a.call("POST", "/api/plurks", {"content": c}).json()["id"] for c in ("one", "two"))
    for plurk in (one, two):
        assert a.get(_open(a, plurk), HTTP_AUTHORIZATION=f"Bearer {a.token}").status_code == 204
    moved = a.call("POST", f"/api/plurks/{one}/responses", {"content": "misplaced"}).json()["id"]
    assert b"misplaced" in _cached(keys.object_key("getThread", one), cache1)
    response = Plurk.entries.get(pk=moved)
    response.parent_id = two
    response.save()
    assert _cached(keys.object_key("getThread", one), cache1) == b""
    assert b"misplaced" in _cached(keys.object_key("getThread", two), cache1)


def test_a_follow_moved_to_another_follower_rewrites_both_users(signup, cache1):
    """The same for a per-user resource: a Follow row given to another follower rewrites the
    answers of the user it leaves (who no longer sees the followee's plurks) and of the one it
    joins."""
    from plurkcore.models import Follow

    from .helpers import cached, truth

    a, b, c = signup("a"), signup("b"), signup("c")
    b.call("POST", "/api/follow", {"username": "a"})
    a.call("POST", "/api/plurks", {"content": "for my followers"})
    assert truth("getUnreadCount", b.user["id"]) == b'{"count":1}'
    follow = Follow.objects.get(follower_id=b.user["id"])
    follow.follower_id = c.user["id"]
    follow.save()
    for user in (b, c):
        assert cached("getUnreadCount", user.user["id"], [cache1]) == truth("getUnreadCount", user.user["id"])
    assert truth("getUnreadCount", b.user["id"]) != truth("getUnreadCount", c.user["id"])
