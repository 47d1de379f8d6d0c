"""Django's side of section 7 of docs/contract.md: ETag on every poll answer, If-None-Match with
django.utils.cache semantics, never a hold and never Preference-Applied (the "conditional"
vectors, through gunicorn's parser and Django's whole stack as a gunicorn worker runs it)."""
import json
import os
import time

import pytest
from django.test import RequestFactory
from django.utils.cache import get_conditional_response

from fastpoll.http import answer_etag, none_match
from tests.support.wsgi import django_response, request_bytes

from .helpers import cached

VECTORS = json.load(open(os.path.join(os.path.dirname(__file__), "..", "vectors", "contract.json")))
CONDITIONAL = VECTORS["conditional"]

pytestmark = pytest.mark.django_db


@pytest.fixture
def reader(signup):
    """body -> a token whose getUnreadCount answer is that body ('{"count":1}' or '')."""
    author, one, none = signup("author"), signup("one"), signup("none")
    one.call("POST", "/api/follow", {"username": "author"})
    author.call("POST", "/api/plurks", {"content": "x"})
    return {'{"count":1}': one.token, "": none.token}


def ask_raw(raw):
    """(status, headers, body) through gunicorn's parser and Django's whole WSGI handler."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    # the handler closes old connections at a request's start and end, which on PostgreSQL ends
    # the test's transaction; Django's test Client disconnects it the same way
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        return django_response(raw)
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def ask(token, headers, method="GET"):
    raw = request_bytes([("Authorization", f"Bearer {token}"), *headers])
    if method != "GET":
        raw = raw.replace(b"GET ", method.encode() + b" ", 1)
    return ask_raw(raw)


@pytest.mark.parametrize("case", CONDITIONAL, ids=lambda c: f"{c['body'] or 'empty'}: {c['why']}")
def test_conditional_vectors(reader, case):
    body = case["body"].encode()
    start = time.monotonic()
    status, headers, content = ask(reader[case["body"]], case["headers"])
    assert time.monotonic() - start < 5, "Django must never hold a poll"
    assert status == case["django"]
    assert headers["ETag"] == answer_etag(body)
    assert headers["Cache-Control"] == "no-store" and headers["X-Cache"] == "MISS"
    assert "Preference-Applied" not in headers
    if status in (204, 304):        # RFC 9110 8.6: no Content-Length on either (fastpath sends none)
        assert content == b""
        assert "Content-Type" not in headers and "Content-Length" not in headers
    else:
        assert content == body


@pytest.mark.parametrize("case", CONDITIONAL, ids=lambda c: f"{c['body'] or 'empty'}: {c['why']}")
def test_same_reading_as_django_utils_cache(case):
    """none_match() is get_conditional_response's If-None-Match test, for GET."""
    etag = answer_etag(case["body"].encode())
    meta = {}
    for name, value in case["headers"]:
        key = "HTTP_" + name.upper().replace("-", "_")
        meta[key] = f"{meta[key]},{value.strip()}" if key in meta else value.strip()
    request = RequestFactory().get("/Poll/getUnreadCount", **meta)
    django = get_conditional_response(request, etag=etag)
    assert none_match(request, etag) == (django is not None and django.status_code == 304)


@pytest.mark.parametrize("method", ["POST", "HEAD"])
def test_post_and_head_match_like_get(reader, method):
    """A poll is a read whatever its method: 304, not get_conditional_response's 412 for POST."""
    tag = answer_etag(b'{"count":1}')
    status, headers, content = ask(reader['{"count":1}'], [("If-None-Match", tag)], method)
    assert (status, headers["ETag"], content) == (304, tag, b"")
    status, headers, content = ask(reader['{"count":1}'], [("If-None-Match", answer_etag(b""))], method)
    assert (status, headers["ETag"]) == (200, tag)
    # gunicorn sends what Django returns, even to HEAD: the GET's length, and no content
    assert content == (b"" if method == "HEAD" else b'{"count":1}') and headers["Content-Length"] == "11"


def test_head_of_an_api_answer_or_an_error_has_no_content(reader):
    token = reader['{"count":1}']
    for path, status in (("/api/me", 200), ("/Poll/getUnreadCount", 200), ("/Poll/nope", 404)):
        raw = request_bytes([("Authorization", f"Bearer {token}")], path=path).replace(b"GET ", b"HEAD ", 1)
        got, headers, content = ask_raw(raw)
        assert (got, content) == (status, b"") and int(headers["Content-Length"]) > 0, path


def test_etag_follows_the_answer(signup):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    first = b.get("/Poll/getMessages", HTTP_AUTHORIZATION=f"Bearer {b.token}")
    assert first.status_code == 204 and first["ETag"] == answer_etag(b"")
    a.call("POST", "/api/plurks", {"content": "x"})
    stale = b.get("/Poll/getMessages", HTTP_AUTHORIZATION=f"Bearer {b.token}", HTTP_IF_NONE_MATCH=first["ETag"])
    assert stale.status_code == 200 and stale["ETag"] == answer_etag(stale.content) != first["ETag"]
    again = b.get("/Poll/getMessages", HTTP_AUTHORIZATION=f"Bearer {b.token}", HTTP_IF_NONE_MATCH=stale["ETag"])
    assert again.status_code == 304 and again["ETag"] == stale["ETag"]


@pytest.mark.django_db(transaction=True)
def test_not_modified_still_fills_the_cache(signup, cache1):
    from fastpoll.cache import get_cache
    from fastpoll.models import UserState

    a = signup("a")
    get_cache().delete_many(cache1.spec, [f"p1:getUnreadCount:{a.user['id']}:0"])
    assert UserState.objects.get(user_id=a.user["id"]).epoch == 0
    assert cached("getUnreadCount", a.user["id"], [cache1]) is None
    resp = a.get("/Poll/getUnreadCount", HTTP_AUTHORIZATION=f"Bearer {a.token}",
                 HTTP_IF_NONE_MATCH=answer_etag(b""))
    assert resp.status_code == 304
    assert cached("getUnreadCount", a.user["id"], [cache1]) == b""
