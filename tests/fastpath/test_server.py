"""fastpath as nginx sees it: real memcached (one and three servers), real HTTP."""
import time
import urllib.request

import pytest
import requests
from pymemcache.client.hash import HashClient

import fastpath._server  # noqa: F401  (a build that does not import fails here, never skips)
from tests.fastpath.conftest import SECRET, token


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
                         headers={"Cookie": f"theme=dark; fastpoll_token={tok}; other=1"})
    assert resp.status_code == 200 and resp.json()["count"] == 1


def test_the_default_cookie_is_fastpoll_token(fastpath_factory, memcached):
    """The library's cookie is fastpoll_token; the demo's plurk_token is just another cookie
    unless --cookie-name names it (as plurksite's FASTPOLL['COOKIE_NAME'] renders it)."""
    HashClient([memcached.spec], default_noreply=False).set("p1:getMessages:9:0", b'{"count":1}')
    tok = token(9)
    fp = fastpath_factory([memcached])
    assert _get(fp, "getMessages", headers={"Cookie": f"fastpoll_token={tok}"}).status_code == 200
    assert _get(fp, "getMessages", headers={"Cookie": f"plurk_token={tok}"}).status_code == 401
    demo = fastpath_factory([memcached], extra=["--cookie-name", "plurk_token"])
    assert _get(demo, "getMessages", headers={"Cookie": f"plurk_token={tok}"}).status_code == 200
    assert _get(demo, "getMessages", headers={"Cookie": f"fastpoll_token={tok}"}).status_code == 401


@pytest.mark.parametrize("headers, why", [
    ({}, "no token"),
    ({"Authorization": "Bearer v1.1.0.1.ab"}, "malformed"),
    ({"Authorization": "Basic dXNlcjpwYXNz"}, "other scheme"),
    ({"Cookie": "fastpoll_token="}, "empty cookie"),
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


@pytest.mark.parametrize("uid", ["3f2a9c1e-7b4d-4e8a-9c0f-5d6e7f8a9b0c", "x" * 64, "A_b-1", "42"])
def test_text_uids_serve_their_own_key(fastpath_factory, memcached, uid):
    """A uid is text (Django's str(pk)): fastpath copies it into the key verbatim."""
    fp = fastpath_factory([memcached])
    cache = HashClient([memcached.spec], default_noreply=False)
    cache.set(f"p1:getMessages:{uid}:3", f'{{"user":"{uid}"}}'.encode())
    if uid.upper() != uid:          # case matters: another uid's key is never served
        cache.set(f"p1:getMessages:{uid.upper()}:3", b'{"user":"someone else"}')
    assert _get(fp, "getMessages", token(uid, epoch=3)).json() == {"user": uid}
    assert _get(fp, "getMessages", token(uid, epoch=4)).status_code == 404


@pytest.mark.parametrize("bad", ["x" * 65, "a.b", "a:b", "a b"])
def test_uids_outside_the_grammar_are_malformed(fastpath_factory, memcached, bad):
    from tests.vectors.make_vectors import token as raw_token
    fp = fastpath_factory([memcached])
    tok = raw_token(bad, 0, int(time.time()) + 60, key=SECRET)
    assert _get(fp, "getMessages", tok).json() == {"error": "malformed token"}


def test_unknown_resource_and_bad_method(fastpath_factory, memcached):
    fp = fastpath_factory([memcached])
    tok = token(1)
    for path in ("nope", "../../etc/passwd", "getMessages/extra", "", "x" * 40):
        resp = requests.get(f"{fp.url}/Poll/{path}", headers={"Authorization": f"Bearer {tok}"}, timeout=5)
        assert resp.status_code == 404 and resp.headers["X-Cache"] == "MISS", path
    # any other method is Django's: its 405 with its Allow, or its 404 for a path naming nothing
    for method, resource in (("PUT", "getMessages"), ("DELETE", ""), ("OPTIONS", "a/b"), ("HEAD", "getMessages")):
        resp = _get(fp, resource, tok, method=method)
        assert resp.status_code == 404 and resp.headers["X-Cache"] == "MISS", method


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


def test_listen_backlog_is_not_shrunk_by_the_event_loop(fastpath_factory, memcached):
    """libevent's evconnlistener_new(backlog=-1) would listen(fd, 128) again: a burst of new
    connections from nginx then overflows (SYNs dropped, 1 s retransmits; EAGAIN on a unix
    socket).  The socket must keep the backlog it was created with: what the kernel gave of the
    65535 fastpath asks (net.core.somaxconn)."""
    import subprocess

    from fastpath.activation import BACKLOG, backlog_limit

    fp = fastpath_factory([memcached])
    out = subprocess.run(["ss", "-ltnH", f"sport = :{fp.port}"], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out and out[0] == "LISTEN", out
    assert int(out[2]) == min(BACKLOG, backlog_limit()) > 128, out    # Send-Q of a listening socket: its backlog


def _raw(fp, header_lines):
    import socket

    with socket.create_connection(("127.0.0.1", fp.port), timeout=5) as sock:
        sock.sendall(b"GET /Poll/getUnreadCount HTTP/1.1\r\nHost: x\r\n" +
                     b"".join(h.encode() + b"\r\n" for h in header_lines) + b"Connection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode()
    return int(head.split()[1]), head


def test_credentials_read_like_django_or_deferred(fastpath_factory, memcached):
    """Whitespace around a cookie pair is ignored and "Bearer " alone is no credential (as for
    Django); a repeated header or fastpoll_token, or a quoted value, is deferred to Django (404 MISS)."""
    fp = fastpath_factory([memcached])
    HashClient([memcached.spec], default_noreply=False).set("p1:getUnreadCount:9:0", b'{"count":1}')
    tok, other = token(9), token(10)
    assert _raw(fp, [f"Cookie: a=1 ; fastpoll_token = {tok} ;b=2"])[0] == 200
    assert _raw(fp, ["Authorization: Bearer ", f"Cookie: fastpoll_token={tok}"])[0] == 200
    assert _raw(fp, ["Authorization: Bearer "])[0] == 401
    for lines in ([f"Authorization: Bearer {tok}", f"Authorization: Bearer {other}"],
                  [f"Cookie: fastpoll_token={tok}", f"Cookie: fastpoll_token={other}"],
                  [f"Cookie: fastpoll_token={tok}; fastpoll_token={other}"],
                  [f'Cookie: fastpoll_token="{tok}"']):
        status, head = _raw(fp, lines)
        assert status == 404 and "X-Cache: MISS" in head, (lines, head)


def test_names_a_project_chooses(fastpath_factory, memcached):
    """--cookie-name, --path-prefix and --key-prefix: the custom names serve a hit; the default
    ones then miss (404, Django's) or find no credential."""
    fp = fastpath_factory([memcached], extra=["--cookie-name", "__Host-poll", "--path-prefix", "/api/v2/poll/",
                                              "--key-prefix", "fp-2"])
    cache = HashClient([memcached.spec], default_noreply=False)
    cache.set("fp-2:getMessages:7:0", b'{"custom":true}')
    cache.set("p1:getMessages:7:0", b'{"default":true}')
    cache.set("p1:getMessages:8:0", b'{"default":true}')
    tok = token(7)

    def get(path, headers):
        return requests.get(f"{fp.url}{path}", headers=headers, timeout=5)

    resp = get("/api/v2/poll/getMessages", {"Cookie": f"fastpoll_token=x; __Host-poll={tok}"})
    assert resp.status_code == 200 and resp.json() == {"custom": True} and resp.headers["X-Cache"] == "HIT"
    resp = get("/api/v2/poll/getMessages", {"Authorization": f"Bearer {tok}"})
    assert resp.status_code == 200 and resp.json() == {"custom": True}
    # the default cookie carries no credential here
    resp = get("/api/v2/poll/getMessages", {"Cookie": f"fastpoll_token={tok}"})
    assert resp.status_code == 401 and resp.json() == {"error": "authentication required"}
    # the default path is not a poll here: Django's
    resp = get("/Poll/getMessages", {"Authorization": f"Bearer {tok}"})
    assert resp.status_code == 404 and resp.headers["X-Cache"] == "MISS"
    # the default key prefix is not read: user 8 has only a p1 key
    resp = get("/api/v2/poll/getMessages", {"Authorization": f"Bearer {token(8)}"})
    assert resp.status_code == 404 and resp.headers["X-Cache"] == "MISS"
