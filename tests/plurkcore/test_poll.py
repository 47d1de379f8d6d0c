"""The Django side of /Poll/: unread semantics, exact headers and bodies, fills, the registry."""
import json

import pytest
from django.db.models import Count

import fastpoll

from fastpoll import resources as fastpoll_resources
from plurkcore import answers
from fastpoll.http import dumps

from .helpers import cached, truth

pytestmark = pytest.mark.django_db


def poll(client, resource="getUnreadCount", method="get", **kwargs):
    return getattr(client, method)(f"/Poll/{resource}", HTTP_AUTHORIZATION=f"Bearer {client.token}", **kwargs)


def count(client):
    resp = poll(client)
    return 0 if resp.status_code == 204 else resp.json()["count"]


def test_headers_exactly_as_the_contract(signup):
    a, b = signup("a"), signup("b")
    empty = poll(b)
    assert empty.status_code == 204 and b"".join(empty.streaming_content) == b""
    assert empty["X-Cache"] == "MISS" and empty["Cache-Control"] == "no-store"
    assert empty["ETag"] == '"e3b0c44298fc1c149afbf4c8996fb924"'      # sha256(b"")
    assert "Content-Type" not in empty and "Content-Length" not in empty
    b.call("POST", "/api/follow", {"username": "a"})
    a.call("POST", "/api/plurks", {"content": "x"})
    for method in ("get", "post"):
        resp = poll(b, method=method)
        assert resp.status_code == 200 and resp.content == b'{"count":1}'
        assert resp["Content-Type"] == "application/json"
        assert resp["X-Cache"] == "MISS" and resp["Cache-Control"] == "no-store"
        assert resp["ETag"] == '"6aea6dfe6561984cdc5c54ead84d47d2"'   # sha256(b'{"count":1}')
    bad = b.get("/Poll/getUnreadCount", HTTP_AUTHORIZATION="Bearer nope")
    assert bad.status_code == 401 and bad["Content-Type"] == "application/json"
    assert bad["Cache-Control"] == "no-store" and "error" in bad.json()
    assert b.get("/Poll/getUnreadCount").status_code == 401


def test_post_body_is_ignored_and_csrf_exempt(signup, client_factory):
    a = signup("a")
    browser = client_factory(enforce_csrf_checks=True)
    browser.cookies["plurk_token"] = a.token
    resp = browser.post("/Poll/getMessages", data=json.dumps({"pad": "p" * 4000}), content_type="application/json")
    assert resp.status_code == 204


def test_unread_items_definition(signup):
    a, b, c, d = (signup(n) for n in "abcd")
    b.call("POST", "/api/follow", {"username": "a"})
    d.call("POST", "/api/follow", {"username": "b"})
    p = a.call("POST", "/api/plurks", {"content": "a's plurk"}).json()
    assert (count(a), count(b), count(c), count(d)) == (0, 1, 0, 0)
    c.call("POST", f"/api/plurks/{p['id']}/responses", {"content": "c replies"})
    # a: response to own plurk; b: response to a followee's plurk; c: its own response
    assert (count(a), count(b), count(c), count(d)) == (1, 2, 0, 0)
    b.call("POST", f"/api/plurks/{p['id']}/responses", {"content": "b replies"})
    assert (count(a), count(b), count(c), count(d)) == (2, 2, 0, 0)
    a.call("POST", f"/api/plurks/{p['id']}/responses", {"content": "a replies"})
    assert (count(a), count(b)) == (2, 3)
    q = b.call("POST", "/api/plurks", {"content": "b's plurk"}).json()
    assert count(d) == 1
    messages = poll(b, "getMessages").json()
    assert messages["count"] == 3
    assert [i["kind"] for i in messages["items"]] == ["response", "response", "plurk"]
    assert [i["id"] for i in messages["items"]] == sorted((i["id"] for i in messages["items"]), reverse=True)
    item = messages["items"][-1]
    assert item == {"id": p["id"], "plurk_id": p["id"], "kind": "plurk", "author": "a",
                    "content": "a's plurk", "created": p["created"]}
    assert messages["items"][0]["plurk_id"] == p["id"] and messages["items"][0]["author"] == "a"
    b.call("POST", "/api/markRead", {"upto": q["id"]})
    assert count(b) == 0 and poll(b, "getMessages").status_code == 204


def test_messages_are_capped_at_50_but_count_all(signup):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    from plurkcore.models import Plurk
    Plurk.objects.bulk_create([Plurk(author_id=a.user["id"], content=f"p{i}") for i in range(55)])
    body = poll(b, "getMessages").json()
    assert body["count"] == 55 and len(body["items"]) == 50
    assert body["items"][0]["content"] == "p54"
    assert poll(b).content == b'{"count":55}'


def test_unknown_resource_is_json_404(signup):
    a = signup("a")
    resp = poll(a, "getNothing")
    assert resp.status_code == 404 and resp["Content-Type"] == "application/json"


@pytest.mark.django_db(transaction=True)
def test_miss_fills_the_cache_with_the_exact_body(signup, cache1):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    a.call("POST", "/api/plurks", {"content": "snow \u2603 <b>&amp;</b>"})
    from fastpoll.cache import get_cache
    from .helpers import key_of
    get_cache().client.delete_many([key_of(r, b.user["id"]) for r in ("getUnreadCount", "getMessages")])
    resp = poll(b, "getMessages")
    assert cached("getMessages", b.user["id"], [cache1]) == resp.content == truth("getMessages", b.user["id"])
    assert "\u2603".encode() in resp.content


@pytest.mark.django_db(transaction=True)
def test_integrating_app_can_register_a_resource(signup, cache1):
    from plurkcore.models import Plurk

    calls = []

    @fastpoll.resource("getPlurkTotal", watch={Plurk: lambda plurk: [plurk.author_id]})
    def total(user_ids):
        calls.append(sorted(user_ids))
        counts = dict(Plurk.objects.filter(author_id__in=user_ids).values_list("author_id").annotate(n=Count("id")))
        return {uid: dumps({"plurks": counts[uid]}) if counts.get(uid) else b"" for uid in user_ids}

    try:
        a, b = signup("a"), signup("b")
        b.call("POST", "/api/follow", {"username": "a"})
        assert poll(a, "getPlurkTotal").status_code == 204
        calls.clear()
        a.call("POST", "/api/markRead", {"upto": 0})   # touches Plurk's own resources only
        assert calls == []
        a.call("POST", "/api/plurks", {"content": "x"})
        assert calls == [[a.user["id"]]]
        assert cached("getPlurkTotal", a.user["id"], [cache1]) == b'{"plurks":1}'
        assert poll(a, "getPlurkTotal").content == b'{"plurks":1}'
    finally:
        fastpoll_resources.unregister("getPlurkTotal")


def test_register_validates():
    with pytest.raises(ValueError):
        fastpoll.resource("bad name")
    with pytest.raises(ValueError):
        fastpoll.resource("ok", per="group")
    with pytest.raises(TypeError, match="watch maps a model class to a function of an instance"):
        fastpoll.resource("ok", watch={"plurk": lambda p: []})          # a wrong type, as watch=[...]


@pytest.mark.django_db(transaction=True)
def test_a_broken_resource_does_not_stop_the_others(signup, cache1):
    @fastpoll.resource("getBroken")
    def broken(user_ids):
        raise RuntimeError("bug in an integrating app")

    try:
        a, b = signup("a"), signup("b")
        b.call("POST", "/api/follow", {"username": "a"})
        assert a.call("POST", "/api/plurks", {"content": "x"}).status_code == 201
        assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":1}'
        resp = poll(b, "getBroken")
        assert resp.status_code == 500 and resp.json() == {"error": "internal error"}
    finally:
        fastpoll_resources.unregister("getBroken")


def test_a_busy_database_answers_503_with_retry_after(signup, monkeypatch):
    from django.db import OperationalError

    a = signup("a")

    def locked(user_ids):
        raise OperationalError("database is locked")

    import dataclasses

    resource = fastpoll_resources.get("getUnreadCount")
    monkeypatch.setitem(fastpoll_resources._registry, resource.name, dataclasses.replace(resource, compute=locked))
    resp = a.call("GET", "/Poll/getUnreadCount")
    assert resp.status_code == 503 and resp["Retry-After"] == "1"
    assert "error" in resp.json()
