"""End to end through nginx with every real part running: hits, misses, fills, POST fallbacks,
and polls that keep working while fastpath or memcached is dead."""
import json
import time

import pytest
import requests
from pymemcache.client.hash import HashClient

pytestmark = pytest.mark.slow


def _follow_and_post(stack, text="hello"):
    """A posts, B follows A: B has one unread plurk.  Returns (token_a, token_b, plurk)."""
    name_a, token_a = stack.signup("a")
    _, token_b = stack.signup("b")
    assert stack.api("POST", "/api/follow", token_b, json={"username": name_a}).status_code in (200, 201)
    resp = stack.api("POST", "/api/plurks", token_a, json={"content": text})
    assert resp.status_code == 201, resp.text
    return token_a, token_b, resp.json()


def _poll_until(stack, resource, token, want_cache, timeout=10.0, **kwargs):
    deadline = time.monotonic() + timeout
    while True:
        resp = stack.poll(resource, token, **kwargs)
        if resp.headers.get("X-Cache") == want_cache or time.monotonic() > deadline:
            return resp
        time.sleep(0.1)


def _cache(stack):
    return HashClient(stack.config.memcached_specs, connect_timeout=1, timeout=1, default_noreply=False)


def _uid_epoch(token):
    _, uid, epoch, _, _ = token.split(".")
    return uid, epoch


def test_hit_is_served_by_fastpath(stack):
    _, token_b, plurk = _follow_and_post(stack)
    resp = stack.poll("getUnreadCount", token_b)
    assert resp.status_code == 200
    assert resp.headers["X-Cache"] == "HIT"
    assert resp.headers["Cache-Control"] == "no-store"
    assert resp.headers["Content-Type"].startswith("application/json")
    assert resp.json() == {"count": 1}
    messages = stack.poll("getMessages", token_b)
    assert messages.headers["X-Cache"] == "HIT"
    assert [item["id"] for item in messages.json()["items"]] == [plurk["id"]]


def test_nothing_new_is_an_empty_hit(stack):
    _, token = stack.signup("quiet")
    resp = _poll_until(stack, "getUnreadCount", token, "HIT")
    assert resp.status_code == 204
    assert resp.headers["X-Cache"] == "HIT"
    assert resp.content == b""


def test_miss_is_answered_by_django_and_fills_the_cache(stack):
    _, token_b, _ = _follow_and_post(stack)
    uid, epoch = _uid_epoch(token_b)
    cache = _cache(stack)
    cache.delete(f"p1:getUnreadCount:{uid}:{epoch}")
    miss = stack.poll("getUnreadCount", token_b)
    assert miss.status_code == 200
    assert miss.headers["X-Cache"] == "MISS"
    assert miss.json() == {"count": 1}
    hit = stack.poll("getUnreadCount", token_b)
    assert hit.headers["X-Cache"] == "HIT"
    assert hit.content == miss.content


def test_post_poll_falls_back_with_body_intact(stack):
    _, token_b, _ = _follow_and_post(stack)
    uid, epoch = _uid_epoch(token_b)
    _cache(stack).delete(f"p1:getMessages:{uid}:{epoch}")
    body = json.dumps({"client": "e2e", "pad": "p" * 4000})
    resp = stack.poll("getMessages", token_b, method="POST", data=body,
                      headers={"Content-Type": "application/json"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["X-Cache"] == "MISS"
    assert resp.json()["count"] == 1
    again = stack.poll("getMessages", token_b, method="POST", data=body,
                       headers={"Content-Type": "application/json"})
    assert again.headers["X-Cache"] == "HIT"
    assert again.content == resp.content


@pytest.mark.parametrize("servers", [1, 3])
def test_fastpath_and_django_give_the_same_answers(request, servers):
    """The contract, observed: for the same requests fastpath (from cache) and Django (from the
    database) answer the same status and the same bytes, on one and on three memcached servers."""
    stack = request.getfixturevalue("stack" if servers == 1 else "stack3")
    token_a, token_b, _ = _follow_and_post(stack, "same bytes \u2603 <b>&amp;</b>")
    stack.api("POST", "/api/plurks/%d/responses" % _follow_and_post(stack)[2]["id"], token_a,
              json={"content": "r"})
    cases = [(r, t) for r in ("getUnreadCount", "getMessages") for t in (token_a, token_b)]
    for resource, token in cases:
        _poll_until(stack, resource, token, "HIT")
        fast = stack.poll(resource, token, base=stack.fastpath_url)
        slow = stack.poll(resource, token, base=stack.django_url)
        assert fast.headers["X-Cache"] == "HIT" and slow.headers["X-Cache"] == "MISS"
        assert (fast.status_code, fast.content) == (slow.status_code, slow.content), resource
    _, uid, epoch, _, sig = token_b.split(".")
    from fastpoll import tokens
    from fastpoll.secret import ensure_secret
    expired = tokens.sign(ensure_secret(stack.config.secret_file), int(uid), int(epoch), int(time.time()) - 1)
    forged = token_b[:-1] + ("0" if token_b[-1] != "0" else "1")
    for bad in ("", "v1.1.0.1.00", forged, expired, "v1.x", "Bearer", "v1.1.0.99999999999.zz"):
        fast = stack.poll("getUnreadCount", bad, base=stack.fastpath_url)
        slow = stack.poll("getUnreadCount", bad, base=stack.django_url)
        assert fast.status_code == slow.status_code == 401, bad
        assert fast.content == slow.content, (bad, fast.content, slow.content)
        assert fast.headers["Cache-Control"] == slow.headers["Cache-Control"] == "no-store"
    # no credentials at all, and a token in the cookie instead of the header
    fast = requests.get(stack.fastpath_url + "/Poll/getUnreadCount", timeout=10)
    slow = requests.get(stack.django_url + "/Poll/getUnreadCount", timeout=10)
    assert (fast.status_code, fast.content) == (slow.status_code, slow.content) == \
        (401, b'{"error":"authentication required"}')
    fast = requests.get(stack.fastpath_url + "/Poll/getUnreadCount", cookies={"plurk_token": token_b}, timeout=10)
    slow = requests.get(stack.django_url + "/Poll/getUnreadCount", cookies={"plurk_token": token_b}, timeout=10)
    assert (fast.status_code, fast.content) == (slow.status_code, slow.content)
    # credentials the two could read differently: fastpath defers (404 MISS), so through nginx
    # the answer is always Django's
    other = stack.signup("other")[1]
    odd = [{"Cookie": f"plurk_token={token_b}; plurk_token={other}"},
           {"Cookie": f'plurk_token="{token_b}"'},
           {"Cookie": f"a=1 ; plurk_token = {token_b} ;b=2"},
           {"Cookie": f"plurk_token={token_b}", "Authorization": "Basic Zm9vOmJhcg=="}]
    for headers in odd:
        via_nginx = requests.get(stack.base_url + "/Poll/getUnreadCount", headers=headers, timeout=10)
        slow = requests.get(stack.django_url + "/Poll/getUnreadCount", headers=headers, timeout=10)
        assert (via_nginx.status_code, via_nginx.content) == (slow.status_code, slow.content), headers
    # an unknown resource: both 404 (fastpath's tells nginx to ask Django, whose answer is final)
    fast = stack.poll("getNothing", token_b, base=stack.fastpath_url)
    slow = stack.poll("getNothing", token_b, base=stack.django_url)
    assert fast.status_code == slow.status_code == 404
    assert stack.poll("getNothing", token_b).json()["error"].startswith("unknown poll resource")


def test_logout_revokes_poll_token(stack):
    _, token_b, _ = _follow_and_post(stack)
    assert _poll_until(stack, "getUnreadCount", token_b, "HIT").status_code == 200
    assert stack.api("POST", "/api/logout", token_b).status_code == 204
    resp = stack.poll("getUnreadCount", token_b)
    assert resp.status_code == 401
    assert "error" in resp.json()


def test_access_log_shows_who_answered(stack):
    """nginx's access log names the upstream that answered and the X-Cache status."""
    import os

    from plurksite.config import format_hostport
    _, token_b, _ = _follow_and_post(stack)
    _poll_until(stack, "getUnreadCount", token_b, "HIT")
    path = os.path.join(stack.config.log_dir(), "nginx-access.log")
    want = f"upstream={format_hostport(*stack.config.fastpath)} ustatus=200"
    deadline = time.monotonic() + 5          # the log is buffered, flushed every second
    while True:
        lines = [ln for ln in open(path) if '"GET /Poll/getUnreadCount HTTP/1.1" 200' in ln]
        if any(want in ln and "cache=HIT" in ln for ln in lines) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert any(want in ln and "cache=HIT" in ln for ln in lines), lines[-3:]


def test_polls_survive_fastpath_death_and_hits_resume(private_stack, caplog):
    stack = private_stack
    _, token_b, _ = _follow_and_post(stack)
    assert _poll_until(stack, "getUnreadCount", token_b, "HIT").headers["X-Cache"] == "HIT"
    fastpath = stack.service("fastpath")
    fastpath.kill()
    for _ in range(20):
        resp = stack.poll("getUnreadCount", token_b)
        assert resp.status_code == 200 and resp.json() == {"count": 1}
    resp = _poll_until(stack, "getUnreadCount", token_b, "HIT", timeout=15)
    assert resp.headers["X-Cache"] == "HIT" and resp.json() == {"count": 1}
    assert fastpath.restarts >= 1
    logged = [r.getMessage() for r in caplog.records if r.name == "plurksite.stack"]
    assert any(m.startswith("fastpath exited") and "restarting in" in m for m in logged), logged
    assert any(m.startswith("fastpath restarted") for m in logged), logged


def test_polls_survive_memcached_death_and_hits_resume(private_stack):
    stack = private_stack
    token_a, token_b, _ = _follow_and_post(stack)
    assert _poll_until(stack, "getUnreadCount", token_b, "HIT").headers["X-Cache"] == "HIT"
    memcached = stack.service(f"memcached:{stack.config.memcached_specs[0]}")
    memcached.kill()
    for _ in range(20):
        resp = stack.poll("getUnreadCount", token_b)
        assert resp.status_code == 200 and resp.json() == {"count": 1}
        assert resp.headers["X-Cache"] == "MISS"
    # A write while memcached is dead must not fail, and must not be lost.
    assert stack.api("POST", "/api/plurks", token_a, json={"content": "during outage"}).status_code == 201
    resp = _poll_until(stack, "getUnreadCount", token_b, "HIT", timeout=20)
    assert resp.headers["X-Cache"] == "HIT"
    assert resp.json() == {"count": 2}
    assert memcached.restarts >= 1


def test_both_dead_then_both_back(private_stack):
    stack = private_stack
    _, token_b, _ = _follow_and_post(stack)
    stack.service("fastpath").kill()
    stack.service(f"memcached:{stack.config.memcached_specs[0]}").kill()
    for _ in range(10):
        resp = stack.poll("getMessages", token_b)
        assert resp.status_code == 200 and resp.json()["count"] == 1
    resp = _poll_until(stack, "getMessages", token_b, "HIT", timeout=20)
    assert resp.headers["X-Cache"] == "HIT" and resp.json()["count"] == 1


def test_fastpath_on_a_unix_socket(tmp_path):
    """PLURK_FASTPATH=unix:/path: nginx reaches fastpath over a unix socket (also when run as root
    with its workers as nobody: the socket's directory is world-traversable here)."""
    import os
    import tempfile

    from tests.support.stack import TestStack, stack_config
    sock_dir = tempfile.mkdtemp(prefix="plurk-fp-")
    os.chmod(sock_dir, 0o755)
    config = stack_config(tmp_path / "var", PLURK_FASTPATH=f"unix:{sock_dir}/fastpath.sock")
    assert config.fastpath == ("unix", f"{sock_dir}/fastpath.sock")
    try:
        with TestStack(config, nginx_workers=1) as stack:
            _, token_b, _ = _follow_and_post(stack)
            hit = _poll_until(stack, "getUnreadCount", token_b, "HIT")
            assert hit.status_code == 200 and hit.headers["X-Cache"] == "HIT"
            assert hit.json() == {"count": 1}
        assert not os.path.exists(f"{sock_dir}/fastpath.sock")
    finally:
        os.rmdir(sock_dir) if not os.listdir(sock_dir) else None
