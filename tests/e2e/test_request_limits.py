"""What nginx forwards, fastpath answers or hands to Django: never a refusal of its own.

nginx accepts request lines and headers of up to 8 KiB each (large_client_header_buffers 4 8k)
and forwards /Poll/'s request line with the Authorization and Cookie headers to fastpath.
Before issue 13, fastpath refused URIs over 2 KiB with a 414 that nginx passed on to the user,
where Django would have answered 200."""
import time

import pytest
import requests

pytestmark = pytest.mark.slow


def _hit(stack, token, **kwargs):
    """Poll until fastpath answers (the login warm-up may still be in flight)."""
    deadline = time.monotonic() + 10
    while True:
        resp = stack.poll("getUnreadCount", token, **kwargs)
        if resp.headers.get("X-Cache") == "HIT" or time.monotonic() > deadline:
            return resp
        time.sleep(0.1)


@pytest.mark.parametrize("query_bytes", [3000, 7000])
def test_long_query_string_is_answered_by_fastpath(stack, query_bytes):
    _, token = stack.signup("longq")
    resp = _hit(stack, token, params={"q": "x" * query_bytes})
    assert resp.status_code == 204 and resp.headers["X-Cache"] == "HIT"


def test_large_cookie_header_is_answered_by_fastpath(stack):
    _, token = stack.signup("bigcookie")
    cookie = "; ".join(f"c{i}={'v' * 60}" for i in range(100)) + f"; plurk_token={token}"
    assert 6000 < len(cookie) < 8000
    resp = requests.get(stack.url("/Poll/getUnreadCount"), headers={"Cookie": cookie}, timeout=10)
    deadline = time.monotonic() + 10
    while resp.headers.get("X-Cache") != "HIT" and time.monotonic() < deadline:
        time.sleep(0.1)
        resp = requests.get(stack.url("/Poll/getUnreadCount"), headers={"Cookie": cookie}, timeout=10)
    assert resp.status_code == 204 and resp.headers["X-Cache"] == "HIT"


def test_beyond_nginx_limits_nginx_answers_json(stack):
    """Past nginx's own limit the refusal is nginx's, in the API's JSON shape."""
    _, token = stack.signup("hugeq")
    resp = stack.poll("getUnreadCount", token, params={"q": "x" * 9000})
    assert resp.status_code == 414 and resp.json() == {"error": "request URI too long"}
