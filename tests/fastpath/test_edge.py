"""The edge (issue 31 deliverable 3, docs/contract.md section 10): a second listener of fastpath
that clients reach without nginx.  Only the poll path is served there (GET and HEAD polls,
long-polls, streams, CORS preflights); a miss sends the client to the site (409
{"error":...,"retry":"site"}, or a stream of one `event: miss`); everything else is refused;
held connections are capped per client address and per user; a request head must arrive within
--edge-header-timeout.  The poll listener (behind nginx) keeps its behaviour exactly.
Real memcached, real fastpath, raw sockets."""
import json
import socket
import time

import pytest
from pymemcache.client.base import Client

import fastpath._server  # noqa: F401  (a build that does not import fails here, never skips)
from fastpoll.http import STREAM_PREFIX
from tests.fastpath.conftest import token
from tests.fastpath.test_connections import Reader, _seconds_until_cut
from tests.fastpath.test_longpoll import SLACK, etag, held, key, metric, wait_metric
from tests.fastpath.test_objects import cap, marker_key, object_key
from tests.fastpath.test_stream import Stream

SITE = "https://www.example.com"
OTHER_SITE = "http://localhost:8000"
CORS = ("access-control-allow-origin", "access-control-allow-credentials", "access-control-expose-headers",
        "access-control-allow-methods", "access-control-allow-headers", "access-control-max-age")


@pytest.fixture
def cache(memcached):
    client = Client(memcached.spec, default_noreply=False)
    client.set(key(1), b'{"mine":1}')
    client.set(key(2), b'{"mine":2}')
    client.set(key(3, "getUnreadCount"), b"")
    yield client
    client.close()


def start(fastpath_factory, memcached, *extra):
    args = ["--reread-interval", "60", "--timeout-ms", "2000", "--object-resources", "thread",
            "--edge-origins", f"{SITE},{OTHER_SITE}", *extra]
    return fastpath_factory([memcached], extra=tuple(args), edge=True)


@pytest.fixture
def fp(fastpath_factory, memcached, cache):
    return start(fastpath_factory, memcached)


def request(path="/Poll/getMessages", uid=1, method="GET", headers=(), version="1.1", auth=True, body=b""):
    head = f"{method} {path} HTTP/{version}\r\nHost: edge.example.com\r\n"
    if auth:
        head += f"Authorization: Bearer {token(uid)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers)
    if body:
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


class Conn:
    """One raw connection to a port of fastpath: send requests, read whole responses."""

    def __init__(self, port, timeout=SLACK, source="127.0.0.1"):
        """``source``: the client's address (another 127.0.0.x is another client)."""
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
        self.reader = Reader(self.sock)

    def ask(self, data=None, **kwargs):
        self.sock.sendall(data if data is not None else request(**kwargs))
        return self.answer()

    def answer(self, timeout=SLACK):
        self.sock.settimeout(timeout)
        return self.reader.response()

    def closed(self, timeout=SLACK):
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def edge(fp, data=None, **kwargs):
    """One request on its own edge connection: (status, headers, body)."""
    with Conn(fp.edge_port) as conn:
        return conn.ask(data, **kwargs)


def poll(fp, data=None, **kwargs):
    """The same on the poll listener (nginx's)."""
    with Conn(fp.port) as conn:
        return conn.ask(data, **kwargs)


def edge_stream(fp, **kwargs):
    """test_stream's raw stream, on the edge."""
    return Stream(_EdgePort(fp), **kwargs)


class _EdgePort:
    def __init__(self, fp):
        self.port = fp.edge_port


def no_cors(headers):
    return not any(name in headers for name in CORS)


# ---- 1. the poll path only ----------------------------------------------------------------

def test_edge_answers_a_short_poll_as_the_poll_listener_does(fp):
    status, headers, body = edge(fp)
    assert (status, body) == (200, b'{"mine":1}')
    assert headers["etag"] == etag(body) and headers["x-cache"] == "HIT"
    assert headers["cache-control"] == "no-store" and headers["vary"] == "Origin"
    assert no_cors(headers)          # no Origin: no CORS
    status, headers, _ = edge(fp, path="/Poll/getUnreadCount", uid=3)
    assert status == 204 and headers["etag"] == etag(b"")
    status, headers, _ = edge(fp, headers=[("If-None-Match", etag(b'{"mine":1}'))])
    assert status == 304
    assert edge(fp, auth=False)[0] == 401


def test_edge_keeps_the_connection_between_polls(fp):
    with Conn(fp.edge_port) as conn:
        for uid in (1, 2, 1):
            status, headers, body = conn.ask(uid=uid)
            assert (status, body) == (200, b'{"mine":%d}' % uid) and "connection" not in headers


def _head_lines(raw):
    """A response head's lines but its Date, in order."""
    return [line for line in raw.split(b"\r\n") if not line.startswith(b"Date: ")]


@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_edge_answers_head_without_a_body(fp, version):
    """HEAD is handed to Django on the poll listener; the edge has no Django, so it answers
    with the head a GET gets (Connection included: the connection is kept alike), without
    the content."""
    keep = [("Connection", "keep-alive")] if version == "1.0" else []
    with Conn(fp.edge_port) as conn:
        conn.sock.settimeout(SLACK)
        heads = []
        for method in ("GET", "HEAD"):
            conn.sock.sendall(request(method=method, version=version, headers=keep))
            raw = b""
            while b"\r\n\r\n" not in raw:
                raw += conn.sock.recv(65536)
            head, _, rest = raw.partition(b"\r\n\r\n")
            assert rest == (b'{"mine":1}' if method == "GET" else b"")
            heads.append(head)
        head = heads[1]
        assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Length: 10\r\n" in head
        assert b"ETag: " + etag(b'{"mine":1}').encode() in head
        assert _head_lines(head) == _head_lines(heads[0]) and b"Connection: close" not in head
        assert conn.ask(version=version, headers=keep)[2] == b'{"mine":1}'    # still open after it
    with Conn(fp.port) as conn:
        conn.sock.sendall(request(method="HEAD"))
        status, headers, _ = conn.reader.response(True)
        assert (status, headers["x-cache"]) == (404, "MISS")        # the poll listener's: Django's


def test_edge_holds_a_long_poll_and_answers_the_change(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--reread-interval", "1")
    with Conn(fp.edge_port) as conn:
        conn.sock.sendall(request(uid=1, headers=[("If-None-Match", etag(b'{"mine":1}')), ("Prefer", "wait=30")]))
        held(fp, 1)
        cache.set(key(1), b'{"mine":"new"}')
        status, headers, body = conn.answer()
        assert (status, body) == (200, b'{"mine":"new"}') and headers["preference-applied"] == "wait=30"


def test_an_escaped_comma_opens_the_same_stream_on_the_edge_as_through_nginx(fp, cache):
    """nginx hands fastpath its decoded $uri on the held paths and Django decodes the path: the
    edge reads "/Poll/a%2Cb" as "/Poll/a,b" too, never as another (unknown) resource."""
    cache.set(key(1, "getUnreadCount"), b'{"u":1}')
    s = edge_stream(fp, uid=1, resource="getUnreadCount%2CgetMessages")
    try:
        assert s.head()[0] == 200
        assert [s.event()["event"], s.event()["event"]] == ["getUnreadCount", "getMessages"]
    finally:
        s.sock.close()
    assert edge(fp, request("/Poll/getMessages%00"))[0] == 404


def test_edge_hold_times_out_with_304(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-wait", "1")
    status, headers, _ = edge(fp, headers=[("If-None-Match", etag(b'{"mine":1}')), ("Prefer", "wait=30")])
    assert status == 304 and headers["preference-applied"] == "wait=1"
    assert metric(fp, "fastpath_hold_timeouts_total") == 1


def test_edge_streams_events(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--reread-interval", "1")
    s = edge_stream(fp, uid=1)
    try:
        status, headers = s.head()
        assert status == 200 and headers["content-type"] == "text/event-stream"
        assert headers["vary"] == "Origin" and headers["x-cache"] == "HIT"
        first = s.block()
        assert "event: getMessages" in first and 'data: {"mine":1}' in first
        cache.set(key(1), b'{"mine":"next"}')
        assert 'data: {"mine":"next"}' in s.block()
    finally:
        s.sock.close()


@pytest.mark.parametrize("uid, cache_header", [(1, "HIT"), (99, "MISS")])
def test_an_edge_stream_starts_with_djangos_retry_line(fp, uid, cache_header):
    """Open or one miss, an edge stream's first bytes are fastpoll.http.STREAM_PREFIX, in its own
    chunk: a browser's EventSource comes back 1 s after the end (not its default 3 s)."""
    s = edge_stream(fp, uid=uid, extra=f"Origin: {SITE}\r\n")
    try:
        status, headers = s.head()
        assert (status, headers["x-cache"], headers["access-control-allow-origin"]) == (200, cache_header, SITE)
        framed = b"%x\r\n%s\r\n" % (len(STREAM_PREFIX), STREAM_PREFIX)
        while len(s.raw) < len(framed):
            s._recv(SLACK)
        assert s.raw.startswith(framed)
        assert ("data: " in s.block()) if uid == 1 else (s.block() == "event: miss\ndata: ")
    finally:
        s.sock.close()


CONDITIONALS_NO_POLL_READS = [
    [("If-None-Match", "*")],
    [("If-None-Match", f'{etag(b"other")}, {etag(b"{}")}')],
    [("Prefer", "wait=10"), ("Prefer", "wait=20")],
]


@pytest.mark.parametrize("extra", CONDITIONALS_NO_POLL_READS, ids=["inm-star", "inm-list", "two-prefer"])
def test_a_stream_ignores_conditionals_a_poll_would_send_to_the_site(fp, extra):
    """If-None-Match and Prefer mean nothing to a stream (docs/contract.md section 9), as to
    Django's: those a poll cannot read (409 MISS for a poll) open the stream all the same, its
    first event the current answer."""
    assert edge(fp, headers=extra)[0] == 409      # as a poll: the site's to read
    s = edge_stream(fp, uid=1, extra="".join(f"{name}: {value}\r\n" for name, value in extra))
    try:
        status, headers = s.head()
        assert (status, headers["content-type"], headers["x-cache"]) == (200, "text/event-stream", "HIT")
        assert s.event() == {"id": etag(b'{"mine":1}'), "event": "getMessages", "data": '{"mine":1}'}
    finally:
        s.sock.close()


def test_edge_serves_per_object_polls(fp, cache):
    cache.set(object_key("thread", "t1"), b'{"thread":1}')
    cache.set(marker_key(5), b"")
    path = f"/Poll/thread/t1?cap={cap('thread', 't1', '5')}"
    assert edge(fp, path=path, uid=5)[::2] == (200, b'{"thread":1}')
    cache.delete(marker_key(5))
    status, headers, body = edge(fp, path=path, uid=5)
    assert status == 409 and json.loads(body) == {"error": "miss", "retry": "site"}


def test_a_miss_on_the_edge_sends_the_client_to_the_site(fp):
    """No nginx, no Django behind the edge: a poll whose answer is not in memcached is 409 with
    retry "site" (the client asks the site once, which fills the cache), not 404 (a path the
    edge does not serve)."""
    status, headers, body = edge(fp, uid=99)
    assert (status, headers["x-cache"]) == (409, "MISS")
    assert json.loads(body) == {"error": "miss", "retry": "site"}
    assert headers["content-length"] == str(len(body))
    # what the poll listener hands to Django is sent to the site too, with its reason
    two = [("Authorization", f"Bearer {token(1)}")]
    status, _, body = edge(fp, headers=two)
    assert (status, json.loads(body)) == (409, {"error": "ambiguous credentials", "retry": "site"})
    # and on the poll listener nothing changed: 404 MISS for nginx
    status, headers, body = poll(fp, uid=99)
    assert (status, headers["x-cache"], body) == (404, "MISS", b'{"error":"miss"}')
    assert "vary" not in headers


def test_a_stream_of_a_missing_key_on_the_edge_is_one_miss_event(fp):
    """... with X-Cache: MISS, as any miss of the edge (a client may read the header only)."""
    s = edge_stream(fp, uid=99)
    try:
        status, headers = s.head()
        assert status == 200 and headers["content-type"] == "text/event-stream"
        assert headers["x-cache"] == "MISS"
        assert s.block() == "event: miss\ndata: "
        assert s.block() is None     # the end (the last chunk): the client asks the site
    finally:
        s.sock.close()
    assert metric(fp, "fastpath_stream_misses_total") == 1


REFUSED_CAPS = {
    "tampered": lambda: cap("thread", "t1", "5")[:-3] + "000",
    "expired": lambda: cap("thread", "t1", "5", ttl=-10),
    "foreign": lambda: cap("thread", "t1", "6"),          # another user's
    "other-object": lambda: cap("thread", "t2", "5"),
}


@pytest.mark.parametrize("which", sorted(REFUSED_CAPS))
def test_a_stream_whose_capability_is_refused_is_one_miss_event(fp, cache, which):
    """docs/contract.md section 10: a stream that cannot start (a refused capability among the
    cases a poll answers 409) is 200 text/event-stream, X-Cache: MISS, `event: miss` and the
    end, with CORS: an EventSource cannot read a 409, so the page learns nothing from one.  A
    poll of the same capability keeps its 409."""
    cache.set(object_key("thread", "t1"), b'{"thread":1}')
    cache.set(marker_key(5), b"")
    path = f"thread/t1?cap={REFUSED_CAPS[which]()}"
    s = edge_stream(fp, uid=5, resource=path, extra=f"Origin: {SITE}\r\n")
    try:
        status, headers = s.head()
        assert (status, headers["content-type"], headers["x-cache"]) == (200, "text/event-stream", "MISS")
        _assert_cors(headers)
        assert s.block() == "event: miss\ndata: "
        assert s.block() is None
    finally:
        s.sock.close()
    status, headers, body = edge(fp, path="/Poll/" + path, uid=5)
    assert (status, json.loads(body)) == (409, {"error": "capability refused", "retry": "site"})
    # a bad token is no miss: the stream is refused 401 as the poll is
    s = edge_stream(fp, uid=5, resource=path, auth="Bearer x.y")
    try:
        assert s.head()[0] == 401
    finally:
        s.sock.close()


def test_a_stream_refused_on_the_poll_listener_is_still_djangos(fp, cache):
    """Behind nginx nothing changes: a refused capability is 404 MISS for Django to answer."""
    s = Stream(fp, uid=5, resource=f"thread/t1?cap={cap('thread', 't1', '6')}")
    try:
        status, headers = s.head()
        assert (status, headers["x-cache"]) == (404, "MISS")
    finally:
        s.sock.close()


def test_an_open_stream_whose_key_goes_ends_with_a_miss_event(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--reread-interval", "1")
    s = edge_stream(fp, uid=2)
    try:
        assert 'data: {"mine":2}' in s.block()
        cache.delete(key(2))
        assert s.block() == "event: miss\ndata: "
        assert s.block() is None
    finally:
        s.sock.close()


@pytest.mark.parametrize("path", ["/", "/metrics", "/Poll/", "/Poll/nothing", "/poll/getMessages",
                                  "/Poll/getMessages/../getMessages", "/admin/", "/Poll/thread/t1/x"])
def test_other_paths_are_refused_on_the_edge(fp, path):
    status, headers, body = edge(fp, path=path)
    assert (status, json.loads(body)) == (404, {"error": "not found"})
    assert "x-cache" not in headers                 # refused, not handed on


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "CONNECT", "TRACE"])
def test_other_methods_are_refused_on_the_edge(fp, method):
    status, headers, body = edge(fp, method=method, body=b"a=1" if method in ("POST", "PUT") else b"")
    assert (status, json.loads(body)) == (405, {"error": "method not allowed"})
    assert headers["allow"] == "GET, HEAD, OPTIONS" and "x-cache" not in headers


def test_a_head_too_large_is_refused_on_the_edge(fp):
    status, headers, body = edge(fp, request(headers=[("Origin", SITE), ("X-Big", "b" * 40000)]))
    assert (status, json.loads(body)) == (431, {"error": "request head too large for fastpath"})
    assert headers["connection"] == "close" and "x-cache" not in headers
    assert no_cors(headers) and headers["vary"] == "Origin"      # refused before Origin is read
    status, headers, _ = poll(fp, request(headers=[("X-Big", "b" * 40000)]))
    assert (status, headers["x-cache"]) == (404, "MISS")          # the poll listener's, unchanged


def test_a_body_beyond_max_body_is_413_on_the_edge(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-body", "100")
    status, headers, _ = edge(fp, body=b"x" * 200)
    assert status == 413 and headers["connection"] == "close"


def test_the_edge_counts_its_answers(fp):
    edge(fp, uid=99)
    edge(fp, path="/nothing")
    text = _metrics(fp)
    assert 'fastpath_requests_total{status="409"} 1' in text
    assert 'fastpath_requests_total{status="404"} 1' in text


def _metrics(fp):
    import urllib.request
    return urllib.request.urlopen(f"http://127.0.0.1:{fp.admin_port}/metrics", timeout=5).read().decode()


# ---- 2. CORS ------------------------------------------------------------------------------

def _assert_cors(headers, origin=SITE):
    assert headers["access-control-allow-origin"] == origin
    assert headers["access-control-allow-credentials"] == "true"
    assert headers["access-control-expose-headers"] == "ETag, Preference-Applied, Retry-After, X-Cache"
    assert headers["vary"] == "Origin"


@pytest.mark.parametrize("origin", [SITE, OTHER_SITE])
def test_an_allowed_origin_gets_cors_headers(fp, origin):
    status, headers, body = edge(fp, headers=[("Origin", origin)])
    assert status == 200
    _assert_cors(headers, origin)
    assert "access-control-allow-methods" not in headers      # only a preflight's
    status, headers, _ = edge(fp, uid=99, headers=[("Origin", origin)])
    assert status == 409
    _assert_cors(headers, origin)                             # the page must read the miss


def test_cors_on_a_304_and_on_a_stream(fp):
    status, headers, _ = edge(fp, headers=[("Origin", SITE), ("If-None-Match", etag(b'{"mine":1}'))])
    assert status == 304
    _assert_cors(headers)
    s = edge_stream(fp, uid=1, extra=f"Origin: {SITE}\r\n")
    try:
        status, headers = s.head()
        assert status == 200
        _assert_cors(headers)
    finally:
        s.sock.close()


@pytest.mark.parametrize("origin", ["https://evil.example", "https://www.example.com.evil.example",
                                    "https://WWW.EXAMPLE.COM", "https://www.example.com:443", "null",
                                    "https://www.example.com/"])
def test_an_origin_not_listed_gets_no_cors_headers(fp, origin):
    status, headers, body = edge(fp, headers=[("Origin", origin)])
    assert (status, body) == (200, b'{"mine":1}')      # answered (the browser keeps it from the page)
    assert no_cors(headers)


def test_a_repeated_origin_gets_no_cors_headers(fp):
    status, headers, _ = edge(fp, headers=[("Origin", SITE), ("Origin", OTHER_SITE)])
    assert status == 200 and no_cors(headers)


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_preflight_of_an_allowed_origin_is_204(fp, method):
    status, headers, body = edge(fp, method="OPTIONS", auth=False, headers=[
        ("Origin", SITE), ("Access-Control-Request-Method", method),
        ("Access-Control-Request-Headers", "authorization,if-none-match,prefer,last-event-id")])
    assert (status, body) == (204, b"")
    _assert_cors(headers)
    assert headers["access-control-allow-methods"] == "GET, HEAD"
    assert headers["access-control-allow-headers"] == "Authorization, If-None-Match, Prefer, Last-Event-ID"
    assert headers["access-control-max-age"] == "600"


@pytest.mark.parametrize("extra", [
    [("Origin", "https://evil.example"), ("Access-Control-Request-Method", "GET")],
    [("Access-Control-Request-Method", "GET")],
    [("Origin", SITE)],
    [("Origin", SITE), ("Access-Control-Request-Method", "POST")],
    [("Origin", SITE), ("Access-Control-Request-Method", "GET"), ("Access-Control-Request-Method", "GET")],
], ids=["unlisted-origin", "no-origin", "no-method", "post", "repeated-method"])
def test_other_preflights_are_403_without_cors(fp, extra):
    status, headers, body = edge(fp, method="OPTIONS", auth=False, headers=extra)
    assert (status, json.loads(body)) == (403, {"error": "preflight refused"})
    assert no_cors(headers)


def test_a_preflight_of_another_path_is_404(fp):
    status, _, _ = edge(fp, path="/metrics", method="OPTIONS", auth=False,
                        headers=[("Origin", SITE), ("Access-Control-Request-Method", "GET")])
    assert status == 404


def test_the_poll_listener_ignores_origin(fp):
    status, headers, _ = poll(fp, headers=[("Origin", SITE)])
    assert status == 200 and no_cors(headers) and "vary" not in headers
    status, headers, _ = poll(fp, method="OPTIONS", headers=[("Origin", SITE), ("Access-Control-Request-Method", "GET")])
    assert (status, headers["x-cache"]) == (404, "MISS")    # Django's, as before


# ---- 3. caps --------------------------------------------------------------------------------

def _hold(port, uid, tag=None):
    conn = Conn(port)
    conn.sock.sendall(request(uid=uid, headers=[("If-None-Match", tag or etag(b'{"mine":%d}' % uid)),
                                                ("Prefer", "wait=50")]))
    return conn


def _one_leaves_and_the_next_is_held(fp, conns, leaving, uid):
    """At the cap, the held ``conns[leaving]`` ends: the slot it frees holds ``uid``'s next
    long-poll on the edge (every one of ``conns`` is held)."""
    conns.pop(leaving).close()
    held(fp, len(conns))
    conns.append(_hold(fp.edge_port, uid))
    held(fp, len(conns))


def test_held_connections_per_address_are_capped_with_429(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--edge-max-per-address", "3", "--max-held-per-user", "0")
    for uid in (10, 11, 12, 13):
        cache.set(key(uid), b'{"mine":%d}' % uid)
    conns = [_hold(fp.edge_port, uid) for uid in (10, 11, 12)]
    try:
        held(fp, 3)
        status, headers, body = edge(fp, uid=13, headers=[("If-None-Match", etag(b'{"mine":13}')),
                                                          ("Prefer", "wait=50")])
        assert (status, json.loads(body)) == (429, {"error": "too many held connections from this address"})
        assert headers["retry-after"] == "5" and "preference-applied" not in headers
        assert edge(fp, uid=13)[0] == 200                     # a short poll is not held: not capped
        s = edge_stream(fp, uid=13)                           # a stream is held: capped
        assert s.head()[0] == 429
        s.sock.close()
        assert metric(fp, "fastpath_held_refused_total") == 2
        # the poll listener's client is nginx: no cap per address there
        extra = [_hold(fp.port, uid) for uid in (10, 11, 12, 13)]
        held(fp, 7)
        for conn in extra:
            conn.close()
        _one_leaves_and_the_next_is_held(fp, conns, -1, 13)
    finally:
        for conn in conns:
            conn.close()


def test_held_connections_per_user_are_capped_on_both_listeners(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-held-per-user", "2")
    conns = [_hold(fp.port, 1), _hold(fp.edge_port, 1)]
    try:
        held(fp, 2)
        for port in (fp.port, fp.edge_port):
            conn = _hold(port, 1)
            status, headers, body = conn.answer()
            conn.close()
            assert (status, json.loads(body)) == (429, {"error": "too many held connections for this user"})
            assert headers["retry-after"] == "5"
        conns.append(_hold(fp.port, 2))                       # another user is not affected
        held(fp, 3)
        _one_leaves_and_the_next_is_held(fp, conns, 0, 1)    # one of user 1's
    finally:
        for conn in conns:
            conn.close()


def test_a_page_can_read_the_back_off_of_a_429(fastpath_factory, memcached, cache):
    """A 429's Retry-After is among the headers CORS lets the page's script read."""
    fp = start(fastpath_factory, memcached, "--max-held-per-user", "1")
    with _hold(fp.edge_port, 1) as conn:
        held(fp, 1)
        status, headers, _ = edge(fp, uid=1, headers=[("If-None-Match", etag(b'{"mine":1}')),
                                                      ("Prefer", "wait=50"), ("Origin", SITE)])
        assert (status, headers["retry-after"]) == (429, "5")
        _assert_cors(headers)
        assert "Retry-After" in headers["access-control-expose-headers"].split(", ")


def test_an_answered_hold_no_longer_counts(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-held-per-user", "1", "--reread-interval", "1")
    with _hold(fp.edge_port, 1) as conn:
        held(fp, 1)
        cache.set(key(1), b'{"mine":"changed"}')
        assert conn.answer()[0] == 200
        conn.sock.sendall(request(uid=1, headers=[("If-None-Match", etag(b'{"mine":"changed"}')),
                                                  ("Prefer", "wait=50")]))
        held(fp, 1)                                           # the same connection holds again


def test_streams_count_per_user(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-held-per-user", "1")
    s = edge_stream(fp, uid=1)
    try:
        assert 'data: {"mine":1}' in s.block()
        t = edge_stream(fp, uid=1)
        status, headers = t.head()
        t.sock.close()
        assert status == 429 and headers["retry-after"] == "5"
    finally:
        s.sock.close()
    wait_metric(fp, "fastpath_streams", 0)
    u = edge_stream(fp, uid=1)                                # the first one's slot is free
    try:
        assert u.head()[0] == 200
    finally:
        u.sock.close()


def test_edge_connections_are_capped(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--edge-max-connections", "4")
    time.sleep(0.3)                                           # the readiness probe's slot is free
    conns = []
    try:
        for _ in range(4):                                    # kept open (keep-alive)
            conns.append(Conn(fp.edge_port))
            assert conns[-1].ask()[0] == 200
        for _ in range(2):                                    # beyond the cap: closed, unanswered
            conns.append(Conn(fp.edge_port))
            conns[-1].sock.sendall(request())
            assert conns[-1].closed()
        assert conns[0].ask()[0] == 200
        assert poll(fp)[0] == 200                             # the poll listener has its own cap
        assert metric(fp, "fastpath_connections_rejected_total") == 2
    finally:
        for conn in conns:
            conn.close()


def test_one_address_cannot_take_every_edge_connection(fastpath_factory, memcached, cache):
    """An address that opens connections and trickles heads (each cut by --edge-header-timeout,
    then opened again) keeps at most --edge-max-conns-per-address of them: beyond it a new one
    is closed at once, and a client from another address still gets an edge connection."""
    fp = start(fastpath_factory, memcached, "--edge-max-connections", "8", "--edge-max-conns-per-address", "3")
    time.sleep(0.3)                                           # the readiness probe's slot is free
    attacker = []
    try:
        for _ in range(8):                                    # as many as the edge has
            attacker.append(Conn(fp.edge_port))
            attacker[-1].sock.sendall(b"GET /Poll/getMessages HTTP/1.1\r\nHo")    # a head begun
        assert all(conn.closed() for conn in attacker[3:])   # beyond the cap: closed at once
        for conn in attacker[:3]:                             # the first ones are still open
            with pytest.raises(TimeoutError):
                conn.closed(timeout=0.3)
        assert metric(fp, "fastpath_connections_rejected_total") == 5
        for source in ("127.0.0.2", "127.0.0.3"):             # other clients: answered, kept
            victim = Conn(fp.edge_port, source=source)
            attacker.append(victim)
            assert victim.ask()[:3:2] == (200, b'{"mine":1}')
        assert attacker[-2].ask(uid=2)[2] == b'{"mine":2}'
        attacker[0].close()                                   # one of the address's leaves ...
        deadline = time.monotonic() + SLACK
        while True:                                           # ... and it may open one again
            conn = Conn(fp.edge_port)
            attacker.append(conn)
            try:
                if conn.ask()[0] == 200:
                    break
            except ConnectionError:
                pass
            assert time.monotonic() < deadline, "the address's slot was never given back"
            time.sleep(0.05)
    finally:
        for conn in attacker:
            conn.close()


def test_edge_connections_per_address_are_not_capped_with_0(fastpath_factory, memcached, cache):
    """0 (as behind a balancer, where every connection has the balancer's address): no cap."""
    fp = start(fastpath_factory, memcached, "--edge-max-per-address", "0", "--edge-max-connections", "8")
    time.sleep(0.3)
    conns = []
    try:
        for _ in range(8):
            conns.append(Conn(fp.edge_port))
            assert conns[-1].ask()[0] == 200
        assert metric(fp, "fastpath_connections_rejected_total") == 0
    finally:
        for conn in conns:
            conn.close()


# ---- 4. timeouts ---------------------------------------------------------------------------

def test_a_head_trickled_past_the_header_timeout_is_cut_off(fastpath_factory, memcached, cache):
    """--edge-header-timeout counts from a request's first byte: a byte every 0.3 s, which
    resets the idle timeout every time, does not keep the connection."""
    fp = start(fastpath_factory, memcached, "--edge-header-timeout", "2", "--idle-timeout", "30")
    with Conn(fp.edge_port) as conn:
        cut = _seconds_until_cut(conn.sock, b"GET /Poll/getMessages HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 100,
                                 every=0.3, within=60)
        assert cut is not None and cut < 2 + 3


def test_the_header_timeout_starts_at_the_requests_first_byte(fastpath_factory, memcached, cache):
    """A keep-alive connection idle for longer than the header timeout (but not the idle one)
    still gets its next request answered."""
    fp = start(fastpath_factory, memcached, "--edge-header-timeout", "1", "--idle-timeout", "30")
    with Conn(fp.edge_port) as conn:
        assert conn.ask()[0] == 200
        time.sleep(2.2)
        assert conn.ask()[0] == 200


def test_an_idle_edge_connection_is_closed(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--idle-timeout", "1")
    with Conn(fp.edge_port) as conn:
        assert conn.ask()[0] == 200
        started = time.monotonic()
        assert conn.closed(timeout=SLACK) and time.monotonic() - started < 1 + 3


# ---- 5. the hardening probes, against the edge ---------------------------------------------

from tests.fastpath.test_hostile import _exchange, _parse, _raw  # noqa: E402

_H = b"Host: x\r\nConnection: close\r\n"


@pytest.fixture
def hostile(fastpath_factory, memcached, cache):
    return start(fastpath_factory, memcached, "--idle-timeout", "2", "--max-body", "1024")


@pytest.mark.parametrize("data, status", [
    (b"\x00\x01\x02garbage\r\n\r\n", 400),
    (b"GET /Poll/getMessages HTTP/9.9\r\n\r\n", 505),
    (b"GET /Poll/" + b"a" * 40000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 431),
    (b"GET /Poll/getMessages HTTP/1.1\r\nX-Note: one\r\n two\r\n" + _H + b"\r\n", 400),
    (b"GET /Poll/getMessages HTTP/1.1\r\nCookie: fastpoll_token=\x0b\r\n" + _H + b"\r\n", 400),
    (b"GET /Poll/getMessages HTTP/1.1\nHost: x\n\n", 400),
    (b"GET /Poll/getMessages HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n" + _H
     + b"\r\n0\r\n\r\n", 400),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),
    # RFC 9112 5.1: whitespace between a field name and its colon MUST be refused with 400
    # (a proxy that reads "Authorization" and one that reads "Authorization " disagree on who asks)
    (b"GET /Poll/getMessages HTTP/1.1\r\nAuthorization : Bearer x\r\n" + _H + b"\r\n", 400),
    (b"GET /Poll/getMessages HTTP/1.1\r\nCookie\t: fastpoll_token=x\r\n" + _H + b"\r\n", 400),
], ids=["binary", "http-9.9", "long-uri", "obs-fold", "control-byte", "bare-lf", "cl-and-chunked", "http2",
        "space-before-colon", "tab-before-colon"])
def test_malformed_requests_on_the_edge_are_refused_then_closed(hostile, data, status):
    got, headers, body = _parse(_raw(hostile.edge_port, data))
    assert got == status and headers["connection"] == "close" and "x-cache" not in headers
    assert "error" in json.loads(body)
    assert edge(hostile)[0] == 200                       # and the edge is still fine


def test_slowloris_on_the_edge_is_cut_off(hostile):
    with socket.create_connection(("127.0.0.1", hostile.edge_port), timeout=10) as sock:
        sock.sendall(b"GET /Poll/getMessages HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        assert sock.recv(100) == b""                     # closed without an answer
        assert time.monotonic() - started < 6            # --idle-timeout 2
    assert edge(hostile)[0] == 200


def test_a_bad_entry_on_the_edge_sends_the_client_to_the_site(fake_memcached, fastpath_factory):
    fake_memcached.set(b"p1:getMessages:1:0", b"x", flags=b"zz")          # a malformed VALUE line
    fp = fastpath_factory([fake_memcached], extra=("--timeout-ms", "2000"), edge=True)
    status, headers, body = edge(fp)
    assert status == 409 and headers["x-cache"] == "MISS" and json.loads(body)["retry"] == "site"


def test_seeded_mutation_fuzz_on_the_edge(hostile):
    """As test_hostile's: random flips, cuts and splices of edge requests (preflights, Origin,
    streams); every answer is HTTP or a close, never a hang, never user 2's entry."""
    import random
    rng = random.Random(20261127)
    seeds = [request(headers=[("Origin", SITE)]), request(uid=1, headers=[("Accept", "text/event-stream")]),
             request(method="OPTIONS", auth=False, headers=[("Origin", SITE), ("Access-Control-Request-Method", "GET")]),
             request(headers=[("If-None-Match", etag(b'{"mine":1}')), ("Prefer", "wait=1")])]
    for i in range(150):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 6)):
            pos = rng.randrange(len(data))
            op = rng.random()
            if op < 0.4:
                data[pos] = rng.randrange(256)
            elif op < 0.7:
                del data[pos:pos + rng.randint(1, 20)]
            else:
                data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
        out, ending = _exchange(hostile.edge_port, bytes(data), wait=0.3, then_wait=3.0)
        assert ending != "timeout", (i, bytes(data)[:200], out[:200])
        assert out == b"" or out.startswith(b"HTTP/1."), (i, bytes(data)[:200], out[:200])
        assert b'{"mine":2}' not in out
    assert edge(hostile)[0] == 200
