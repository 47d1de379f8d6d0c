"""fastpath as nginx sees it: real memcached (one and three servers), real HTTP."""
import time
import urllib.request

import pytest
import requests
from pymemcache.client.hash import HashClient

from tests.fastpath.conftest import token

pytest.importorskip("fastpath._server")


def _get(fp, resource, tok=None, method="GET", **kwargs):
    headers = kwargs.pop("headers", {})
    if tok:
        headers["Authorization"] = f"Bearer {tok}"
    return requests.request(method, f"{fp.url}/Poll/{resource}", headers=headers, timeout=5, **kwargs)


@pytest.mark.parametrize("n_servers", [1, 3])
def test_hit_empty_hit_and_miss(fastpath_factory, memcached, memcached3, n_servers):
    servers = [memcached] if n_servers == 1 else memcached3
    fp = fastpath_factory(servers)
    cache = HashClient([s.spec for s in servers], default_noreply=False)
    for uid in range(1, 60):
        cache.set(f"p1:getUnreadCount:{uid}:0", b'{"count":%d}' % uid if uid % 2 else b"")
    for uid in range(1, 60):
        resp = _get(fp, "getUnreadCount", token(uid))
        assert resp.headers["X-Cache"] == "HIT" and resp.headers["Cache-Control"] == "no-store"
        if uid % 2:
            assert resp.status_code == 200 and resp.json() == {"count": uid}
            assert resp.headers["Content-Type"] == "application/json"
        else:
            assert resp.status_code == 204 and resp.content == b""
    miss = _get(fp, "getMessages", token(5))
    assert miss.status_code == 404 and miss.headers["X-Cache"] == "MISS"


def test_cookie_token_and_query_string_ignored(fastpath_factory, memcached):
    fp = fastpath_factory([memcached])
    HashClient([memcached.spec], default_noreply=False).set("p1:getMessages:9:2", b'{"count":1,"items":[]}')
    tok = token(9, epoch=2)
    resp = requests.post(f"{fp.url}/Poll/getMessages?x=1", data=b"a=b" * 100, timeout=5,
                         headers={"Cookie": f"theme=dark; plurk_token={tok}; other=1"})
    assert resp.status_code == 200 and resp.json()["count"] == 1


@pytest.mark.parametrize("headers, why", [
    ({}, "no token"),
    ({"Authorization": "Bearer v1.1.0.1.ab"}, "malformed"),
    ({"Authorization": "Basic dXNlcjpwYXNz"}, "other scheme"),
    ({"Cookie": "plurk_token="}, "empty cookie"),
])
def test_unauthenticated_is_401_json(fastpath_factory, memcached, headers, why):
    fp = fastpath_factory([memcached])
    resp = _get(fp, "getMessages", headers=headers)
    assert resp.status_code == 401, why
    assert "error" in resp.json()


def test_expired_and_forged_tokens(fastpath_factory, memcached):
    fp = fastpath_factory([memcached])
    HashClient([memcached.spec], default_noreply=False).set("p1:getMessages:3:0", b'{"secret":"of user 3"}')
    assert _get(fp, "getMessages", token(3, ttl=-1)).json() == {"error": "token expired"}
    forged = token(3, key=b"x" * 64)
    assert _get(fp, "getMessages", forged).json() == {"error": "bad signature"}


def test_never_another_users_entry(fastpath_factory, memcached):
    fp = fastpath_factory([memcached])
    cache = HashClient([memcached.spec], default_noreply=False)
    for uid in range(1, 40):
        cache.set(f"p1:getMessages:{uid}:0", f'{{"user":{uid}}}'.encode())
    for uid in range(1, 40):
        assert _get(fp, "getMessages", token(uid)).json() == {"user": uid}


def test_unknown_resource_and_bad_method(fastpath_factory, memcached):
    fp = fastpath_factory([memcached])
    tok = token(1)
    for path in ("nope", "../../etc/passwd", "getMessages/extra", "", "x" * 40):
        resp = requests.get(f"{fp.url}/Poll/{path}", headers={"Authorization": f"Bearer {tok}"}, timeout=5)
        assert resp.status_code == 404 and resp.headers["X-Cache"] == "MISS", path
    resp = _get(fp, "getMessages", tok, method="PUT")
    assert resp.status_code == 405 and resp.headers["Allow"] == "GET, POST"


def test_memcached_down_is_503_then_recovers(fastpath_factory, memcached):
    fp = fastpath_factory([memcached], extra=("--timeout-ms", "100"))
    cache = HashClient([memcached.spec], default_noreply=False)
    cache.set("p1:getUnreadCount:1:0", b'{"count":1}')
    assert _get(fp, "getUnreadCount", token(1)).status_code == 200
    memcached.pause()                       # frozen: answers never come -> timeout
    started = time.monotonic()
    resp = _get(fp, "getUnreadCount", token(1))
    assert resp.status_code == 503 and resp.headers["X-Cache"] == "MISS"
    assert time.monotonic() - started < 2
    memcached.resume()
    memcached.kill()                        # dead: connection refused -> 503 at once
    assert _get(fp, "getUnreadCount", token(1)).status_code == 503
    memcached.start()
    HashClient([memcached.spec], default_noreply=False).set("p1:getUnreadCount:1:0", b'{"count":7}')
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        resp = _get(fp, "getUnreadCount", token(1))
        if resp.status_code == 200:
            break
        time.sleep(0.05)
    assert resp.json() == {"count": 7}


def test_metrics(fastpath_factory, memcached):
    fp = fastpath_factory([memcached], workers=2)
    HashClient([memcached.spec], default_noreply=False).set("p1:getUnreadCount:1:0", b"")
    for _ in range(10):
        _get(fp, "getUnreadCount", token(1))
    _get(fp, "getMessages", token(1))
    text = urllib.request.urlopen(f"http://127.0.0.1:{fp.admin_port}/metrics", timeout=5).read().decode()
    assert 'fastpath_requests_total{status="204"} 10' in text
    assert "fastpath_cache_empty_hits_total 10" in text
    assert "fastpath_cache_misses_total 1" in text
    assert "fastpath_workers 2" in text
    assert "fastpath_memcached_seconds_count 11" in text


def test_crashed_worker_is_restarted_and_sigterm_stops(fastpath_factory, memcached):
    import os
    import signal
    fp = fastpath_factory([memcached], workers=2)
    children = [int(p) for p in open(f"/proc/{fp.proc.pid}/task/{fp.proc.pid}/children").read().split()]
    assert len(children) == 2
    os.kill(children[0], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        now = [int(p) for p in open(f"/proc/{fp.proc.pid}/task/{fp.proc.pid}/children").read().split()]
        if len(now) == 2 and children[0] not in now:
            break
        time.sleep(0.05)
    assert len(now) == 2 and children[0] not in now
    assert _get(fp, "getMessages", token(1)).status_code == 404
    fp.proc.send_signal(signal.SIGTERM)
    assert fp.proc.wait(timeout=10) == 0


@pytest.mark.parametrize("backend", ["epoll", "poll"])
def test_libevent_backend_choice(fastpath_factory, memcached, backend):
    """--backend picks libevent's method (the long-polling issue compares them); both serve."""
    fp = fastpath_factory([memcached], extra=("--backend", backend))
    HashClient([memcached.spec], default_noreply=False).set("p1:getUnreadCount:3:0", b'{"count":3}')
    for _ in range(3):
        assert _get(fp, "getUnreadCount", token(3)).json() == {"count": 3}
    text = urllib.request.urlopen(f"http://127.0.0.1:{fp.admin_port}/metrics", timeout=5).read().decode()
    assert f'fastpath_info{{backend="{backend}"}} 1' in text
