"""Server-Sent Events in fastpath (issue 31, docs/contract.md section 9): a GET poll that
accepts ``text/event-stream`` is a stream: one event per answer (the first unless Last-Event-ID
is its ETag), a comment line every --stream-heartbeat, the end after --max-stream, and
``event: miss`` then the end when the key goes.
Real memcached, real fastpath, raw sockets; notices are sent from here in the fixed format."""
import os
import socket
import subprocess
import threading
import time

import pytest
from pymemcache.client.base import Client

import fastpath._server  # noqa: F401  (a build that does not import fails here, never skips)
from fastpoll.http import STREAM_PREFIX, composite_event_id, event_bytes
from tests.fastpath.conftest import token
from tests.fastpath.test_longpoll import (SLACK, Notifier, Poll, cache, etag, held, key,  # noqa: F401
                                          metric, notify_dir, start, wait_metric)


class Stream:
    """One raw stream on its own connection: the head, then events as they come, read through
    the chunked framing (or until the close, on HTTP/1.0)."""

    prefixed = False                 # STREAM_PREFIX read and checked (block)

    def __init__(self, fp, uid=1, resource="getMessages", last_event_id=None, version="1.1", method="GET",
                 accept="text/event-stream", auth=None, extra="", host="x"):
        self.sock = socket.create_connection(("127.0.0.1", fp.port), timeout=SLACK + 60)
        auth = auth if auth is not None else f"Bearer {token(uid)}"
        head = f"{method} /Poll/{resource} HTTP/{version}\r\nHost: {host}\r\nAuthorization: {auth}\r\nAccept: {accept}\r\n"
        if last_event_id is not None:
            head += f"Last-Event-ID: {last_event_id}\r\n"
        self.sock.sendall((head + extra + "\r\n").encode())
        self.raw = b""
        self.text = b""              # the de-chunked stream so far
        self.ended = False           # the last chunk (or the close) came
        self.status = self.headers = None

    def _recv(self, timeout):
        self.sock.settimeout(timeout)
        data = self.sock.recv(65536)
        if not data:
            self.ended = True
            raise EOFError
        self.raw += data

    def head(self, timeout=SLACK):
        while b"\r\n\r\n" not in self.raw:
            self._recv(timeout)
        head, _, self.raw = self.raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        return self.status, self.headers

    def _dechunk(self):
        if self.headers.get("transfer-encoding") != "chunked":
            self.text += self.raw
            self.raw = b""
            return
        while b"\r\n" in self.raw:
            size_line, _, rest = self.raw.partition(b"\r\n")
            size = int(size_line, 16)
            if len(rest) < size + 2:
                return
            assert rest[size:size + 2] == b"\r\n", self.raw
            self.text += rest[:size]
            self.raw = rest[size + 2:]
            if size == 0:
                self.ended = True
                return

    def block(self, timeout=SLACK):
        """The next block of the stream (an event or a comment, without its blank line), or
        None once the stream ended.  A stream's first bytes, STREAM_PREFIX (its retry: line), are
        checked here and skipped."""
        if self.status is None:
            self.head(timeout)
        deadline = time.monotonic() + timeout
        while True:
            self._dechunk()
            if not self.prefixed and self.status == 200 and self.headers.get("content-type") == "text/event-stream":
                if len(self.text) < len(STREAM_PREFIX) and not self.ended:
                    try:
                        self._recv(max(deadline - time.monotonic(), 0.01))
                    except EOFError:
                        pass
                    continue
                assert self.text.startswith(STREAM_PREFIX), self.text
                self.text = self.text[len(STREAM_PREFIX):]
                self.prefixed = True
            if b"\n\n" in self.text:
                block, _, self.text = self.text.partition(b"\n\n")
                return block.decode()
            if self.ended:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no block within {timeout} s; have {self.text!r}")
            try:
                self._recv(left)
            except EOFError:
                return None

    def event(self, timeout=SLACK, skip_comments=True):
        """The next event as a dict (id, event, data: the data lines joined with LF)."""
        while True:
            block = self.block(timeout)
            if block is None or not (skip_comments and block.startswith(":")):
                return parse(block)

    def quiet(self, timeout):
        """True if nothing but comments comes within timeout."""
        try:
            self.event(timeout)
        except TimeoutError:
            return True
        return False

    def close(self):
        self.sock.close()


def parse(block):
    if block is None:
        return None
    out, data = {}, []
    for line in block.split("\n"):
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        else:
            out[name] = value
    if data:
        out["data"] = "\n".join(data)
    return out


def test_first_event_is_the_current_answer_in_the_documented_format(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(1), b'{"count":1}')
    s = Stream(fp, 1)
    status, headers = s.head()
    assert status == 200
    assert headers["content-type"] == "text/event-stream"
    assert headers["cache-control"] == "no-store"
    assert headers["x-accel-buffering"] == "no"
    assert headers["transfer-encoding"] == "chunked"
    assert "content-length" not in headers and "connection" not in headers
    # exactly the bytes of docs/contract.md section 9
    tag = etag(b'{"count":1}')
    assert s.block() == "id: " + tag + '\nevent: getMessages\ndata: {"count":1}'
    assert metric(fp, "fastpath_streams") == 1
    assert metric(fp, "fastpath_streams_total") == 1
    assert metric(fp, "fastpath_stream_events_total") == 1
    assert metric(fp, "fastpath_held_polls") == 0      # a stream is not a held poll
    s.close()
    wait_metric(fp, "fastpath_streams", 0)


@pytest.mark.parametrize("body, data", [
    (b"", ""), (b"a\nb", "a\nb"), (b"a\r\nb\rc\n", "a\nb\nc\n"), (b" lead", " lead"),
])
def test_a_body_is_data_lines_and_the_empty_answer_one_empty_data_line(fastpath_factory, memcached, cache,
                                                                      body, data):
    fp = start(fastpath_factory, memcached)
    cache.set(key(2), body)
    s = Stream(fp, 2)
    block = s.block()
    assert parse(block) == {"id": etag(body), "event": "getMessages", "data": data}
    # the same bytes as Django's one-event stream (fastpoll.http.event_bytes)
    assert block.encode() + b"\n\n" == event_bytes(etag(body), "getMessages", body)
    s.close()


def test_no_first_event_when_last_event_id_is_the_answers_etag(fastpath_factory, memcached, cache, notify_dir):
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    cache.set(key(3), b'{"n":1}')
    s = Stream(fp, 3, last_event_id=etag(b'{"n":1}'))
    assert s.head()[0] == 200
    assert s.quiet(0.5)
    assert metric(fp, "fastpath_stream_events_total") == 0
    cache.set(key(3), b'{"n":2}')
    Notifier(notify_dir).send([key(3)])
    assert s.event() == {"id": etag(b'{"n":2}'), "event": "getMessages", "data": '{"n":2}'}
    s.close()


def _first_bytes(s, n):
    """The first n bytes of the stream's body as they came (framing included)."""
    s.head()
    while len(s.raw) < n:
        s._recv(SLACK)
    return s.raw[:n]


@pytest.mark.parametrize("version", ["1.1", "1.0"])
@pytest.mark.parametrize("skip", [False, True])
def test_every_stream_starts_with_djangos_retry_line(fastpath_factory, memcached, cache, version, skip):
    """fastpoll.http.STREAM_PREFIX (Django's first bytes), in its own chunk, before the first event
    or without one (Last-Event-ID is the answer's): after --max-stream EventSource comes back in
    1 s, not its own default of 3."""
    fp = start(fastpath_factory, memcached)
    cache.set(key(3), b'{"n":1}')
    s = Stream(fp, 3, last_event_id=etag(b'{"n":1}') if skip else None, version=version)
    framed = b"%x\r\n%s\r\n" % (len(STREAM_PREFIX), STREAM_PREFIX) if version == "1.1" else STREAM_PREFIX
    assert STREAM_PREFIX == b"retry: 1000\n\n"
    assert _first_bytes(s, len(framed)) == framed
    if skip:
        assert s.quiet(0.3)
    else:
        assert s.event()["data"] == '{"n":1}'
    s.close()


def test_a_stale_last_event_id_gets_the_current_answer(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(4), b'{"n":2}')
    s = Stream(fp, 4, last_event_id=etag(b'{"n":1}'))
    assert s.event()["id"] == etag(b'{"n":2}')
    s.close()


def test_one_event_per_change_in_order_each_id_the_new_etag(fastpath_factory, memcached, cache, notify_dir):
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    notifier = Notifier(notify_dir)
    cache.set(key(5), b'{"n":0}')
    s = Stream(fp, 5)
    assert s.event()["data"] == '{"n":0}'
    for n in (1, 2, 3):
        body = b'{"n":%d}' % n
        cache.set(key(5), body)
        notifier.send([key(5)])
        assert s.event() == {"id": etag(body), "event": "getMessages", "data": body.decode()}
    assert metric(fp, "fastpath_stream_events_total") == 4
    # the same bytes again are no change
    cache.set(key(5), b'{"n":3}')
    notifier.send([key(5)])
    try:
        extra = s.event(0.5)
    except TimeoutError:
        extra = None
    assert extra is None, (extra, s.text, s.raw)
    s.close()


def test_heartbeat_comment_every_stream_heartbeat(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--stream-heartbeat", "1")
    cache.set(key(6), b"x")
    s = Stream(fp, 6)
    assert s.event()["data"] == "x"
    t0 = time.monotonic()
    assert s.block(timeout=5) == ": "
    assert s.block(timeout=5) == ": "
    assert 1.0 <= time.monotonic() - t0 <= 2.0 + SLACK
    assert metric(fp, "fastpath_stream_heartbeats_total") >= 2
    s.close()


def test_stream_ends_after_max_stream_and_the_connection_is_kept(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-stream", "1")
    cache.set(key(7), b"x")
    s = Stream(fp, 7)
    t0 = time.monotonic()
    assert s.event()["data"] == "x"
    assert s.block(timeout=5) is None and s.ended           # the last chunk
    assert 0.85 <= time.monotonic() - t0 <= 1.0 + SLACK
    wait_metric(fp, "fastpath_streams", 0)
    # keep-alive: the next request on the same connection is answered
    s.sock.sendall(f"GET /Poll/getMessages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token(7)}\r\n\r\n".encode())
    s.sock.settimeout(SLACK)
    assert s.sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
    s.close()


def test_http10_stream_is_ended_by_the_close(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-stream", "1")
    cache.set(key(8), b"x")
    s = Stream(fp, 8, version="1.0")
    status, headers = s.head()
    assert "transfer-encoding" not in headers and headers["connection"] == "close"
    assert s.event()["data"] == "x"
    assert s.block(timeout=5) is None
    s.close()


@pytest.mark.parametrize("how", ["delete", "flush"])
def test_key_deleted_is_event_miss_then_the_end(fastpath_factory, memcached, cache, notify_dir, how):
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    cache.set(key(9), b"x")
    s = Stream(fp, 9)
    assert s.event()["data"] == "x"
    cache.delete(key(9)) if how == "delete" else cache.flush_all()
    Notifier(notify_dir).send([key(9)])
    assert s.event() == {"event": "miss", "data": ""}
    assert s.block() is None and s.ended
    assert metric(fp, "fastpath_stream_misses_total") == 1
    wait_metric(fp, "fastpath_streams", 0)


def test_a_miss_before_the_stream_opens_is_django_s_404(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    s = Stream(fp, 10)
    status, headers = s.head()
    assert status == 404 and headers["x-cache"] == "MISS" and headers["content-type"] == "application/json"
    assert metric(fp, "fastpath_streams_total") == 0


def test_bad_token_is_an_ordinary_json_401(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(11), b"x")
    s = Stream(fp, 11, auth="Bearer nope")
    status, headers = s.head()
    assert status == 401 and headers["content-type"] == "application/json"
    assert int(headers["content-length"]) > 0


def test_head_and_post_behave_as_polls(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(12), b"x")
    status, headers = Stream(fp, 12, method="HEAD").head()
    assert status == 404 and headers["x-cache"] == "MISS"             # HEAD: Django's, as polls
    status, headers = Stream(fp, 12, method="POST", extra="Content-Length: 0\r\n").head()
    assert status == 200 and headers["content-type"] == "application/json"   # POST: a poll
    assert metric(fp, "fastpath_streams_total") == 0


@pytest.mark.parametrize("extra", [
    'If-None-Match: *\r\n', 'If-None-Match: "a", "b"\r\n', 'Prefer: wait=5\r\nPrefer: wait=6\r\n',
    'If-None-Match: "a"\r\nIf-None-Match: "b"\r\n', 'If-None-Match: {tag}\r\nPrefer: wait=0\r\n',
], ids=["inm-star", "inm-list", "two-prefer", "two-inm", "inm-current"])
def test_if_none_match_and_prefer_mean_nothing_to_a_stream(fastpath_factory, memcached, cache, extra):
    """docs/contract.md section 9, as Django streams them: the conditionals a poll hands to Django
    (404 MISS) or holds on are not read; the first event is the current answer."""
    fp = start(fastpath_factory, memcached)
    cache.set(key(14), b'{"n":14}')
    extra = extra.format(tag=etag(b'{"n":14}'))
    s = Stream(fp, 14, extra=extra)
    assert s.head()[0] == 200 and s.headers["content-type"] == "text/event-stream"
    assert "preference-applied" not in s.headers
    assert s.event() == {"id": etag(b'{"n":14}'), "event": "getMessages", "data": '{"n":14}'}
    s.close()
    poll = Stream(fp, 14, accept="application/json", extra=extra)      # a poll reads them still
    assert poll.head()[0] in (404, 304)
    poll.close()


def test_accept_lists_and_parameters(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(13), b"x")
    for accept, stream in [("text/html, TEXT/Event-Stream;q=0.9", True), (" text/event-stream ", True),
                           ("application/json", False), ("text/event-streams", False)]:
        s = Stream(fp, 13, accept=accept)
        assert (s.head()[1]["content-type"] == "text/event-stream") is stream, accept
        s.close()
    # Accept twice: Django reads it
    s = Stream(fp, 13, extra="Accept: text/event-stream\r\n")
    assert s.head()[0] == 404


def test_a_stream_does_not_starve_other_polls(fastpath_factory, memcached, cache, notify_dir):
    fp = start(fastpath_factory, memcached, "--stream-heartbeat", "1", notify=notify_dir)
    notifier = Notifier(notify_dir)
    cache.set(key(14), b"0")
    streams = [Stream(fp, 14) for _ in range(20)]
    for s in streams:
        assert s.event()["data"] == "0"
    stop = threading.Event()

    def churn():
        # a client of its own: pymemcache's is not thread-safe (sharing the test's, the two
        # threads' replies crossed on one socket and the test hung)
        writer = Client(memcached.spec, default_noreply=False, timeout=5)
        n = 0
        try:
            while not stop.is_set():
                n += 1
                writer.set(key(14), str(n).encode())
                notifier.send([key(14)])
                time.sleep(0.005)
        finally:
            writer.close()

    t = threading.Thread(target=churn)
    t.start()
    try:
        cache.set(key(15), b"other")
        for _ in range(50):
            t0 = time.monotonic()
            assert Poll(fp, 15).answer()[2] == b"other"
            assert time.monotonic() - t0 < 1.0
    finally:
        stop.set()
        t.join()
    for s in streams:
        s.close()
    wait_metric(fp, "fastpath_streams", 0)


def test_a_client_that_leaves_frees_its_stream(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(16), b"x")
    s = Stream(fp, 16)
    s.event()
    assert metric(fp, "fastpath_streams") == 1
    s.close()
    wait_metric(fp, "fastpath_streams", 0)
    wait_metric(fp, "fastpath_connections", 1)    # the /metrics one


def test_draining_ends_open_streams(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(17), b"x")
    s = Stream(fp, 17)
    s.event()
    fp.proc.send_signal(15)
    assert s.block(timeout=SLACK) is None and s.ended
    fp.proc.wait(timeout=SLACK)


def test_object_stream_ends_with_miss_when_the_users_epoch_marker_goes(fastpath_factory, memcached, cache,
                                                                        notify_dir):
    from tests.fastpath.test_objects import cap, marker_key, object_key
    fp = start(fastpath_factory, memcached, "--object-resources", "thread", notify=notify_dir)
    notifier = Notifier(notify_dir)
    cache.set(marker_key(18), b"")
    cache.set(object_key("thread", "t-1"), b'{"t":1}')
    s = Stream(fp, 18, resource=f"thread/t-1?cap={cap('thread', 't-1', 18)}")
    assert s.event() == {"id": etag(b'{"t":1}'), "event": "thread", "data": '{"t":1}'}
    cache.set(object_key("thread", "t-1"), b'{"t":2}')
    notifier.send([object_key("thread", "t-1")])
    assert s.event()["data"] == '{"t":2}'
    cache.delete(marker_key(18))                  # revoked: the epoch moved on
    notifier.send([marker_key(18)])
    assert s.event() == {"event": "miss", "data": ""}
    assert s.block() is None and s.ended
    wait_metric(fp, "fastpath_streams", 0)


def test_a_revoked_user_streams_end_when_its_key_is_deleted(fastpath_factory, memcached, cache, notify_dir):
    # per-user resources: revocation deletes the epoch's keys, which is the miss case
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    cache.set(key(19), b"x")
    cache.set(key(19, "getUnreadCount"), b"1")
    a, b = Stream(fp, 19), Stream(fp, 19, resource="getUnreadCount")
    assert a.event()["event"] == "getMessages" and b.event()["event"] == "getUnreadCount"
    cache.delete(key(19))
    cache.delete(key(19, "getUnreadCount"))
    Notifier(notify_dir).send([key(19), key(19, "getUnreadCount")])
    assert a.event()["event"] == "miss" and b.event()["event"] == "miss"
    wait_metric(fp, "fastpath_streams", 0)


# ---- at scale -------------------------------------------------------------------------------

def _open_raw(fp, uid, resource="getMessages"):
    """A stream request sent, nothing read (the measurement's clients)."""
    sock = socket.create_connection(("127.0.0.1", fp.port), timeout=SLACK)
    sock.sendall(f"GET /Poll/{resource} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token(uid)}\r\n"
                 f"Accept: text/event-stream\r\nLast-Event-ID: {etag(b'x')}\r\n\r\n".encode())
    return sock


def test_memory_per_stream(fastpath_factory, memcached, notify_dir, capsys):
    from tests.fastpath.test_longpoll import _raise_nofile, _set_many, _worker_rss
    n = 5000
    assert _raise_nofile(n + 200)
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    _set_many(memcached, [(key(u), b"x") for u in range(1, n + 101)])
    warm = [_open_raw(fp, u) for u in range(n + 1, n + 101)]       # pools, tables warm
    wait_metric(fp, "fastpath_streams", 100, 3 * SLACK)
    before = _worker_rss(fp)
    streams = [_open_raw(fp, u) for u in range(1, n + 1)]
    wait_metric(fp, "fastpath_streams", n + 100, 6 * SLACK)
    wait_metric(fp, "fastpath_inflight_requests", 0)
    per_stream = (_worker_rss(fp) - before) / n
    with capsys.disabled():
        print(f"\nfastpath: {per_stream:.0f} bytes of worker RSS per open stream ({n} open)")
    for s in streams + warm:
        s.close()
    assert per_stream < 2048          # the goal, fastpath's share; a leak would be far above


def test_fan_out_of_one_change_to_a_thousand_streams(fastpath_factory, memcached, cache, notify_dir, capsys):
    import select
    from tests.fastpath.test_longpoll import _raise_nofile
    n = 1000
    assert _raise_nofile(n + 100)
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    cache.set(key(77), b"x")
    socks = [_open_raw(fp, 77) for _ in range(n)]       # all on one key, Last-Event-ID current
    wait_metric(fp, "fastpath_streams", n, 3 * SLACK)
    for s in socks:                                     # their heads
        s.settimeout(SLACK)
        assert s.recv(65536).startswith(b"HTTP/1.1 200 OK")
    notifier = Notifier(notify_dir)
    rounds, spans = 3, []
    for r in range(rounds):
        body = b'{"round":%d}' % r
        cache.set(key(77), body)
        t0 = time.monotonic()
        notifier.send([key(77)])
        pending = {s.fileno(): s for s in socks}
        poller = select.poll()
        for fd in pending:
            poller.register(fd, select.POLLIN)
        while pending:
            ready = poller.poll(SLACK * 1000)
            assert ready, f"{len(pending)} streams got no event"
            for fd, _ in ready:
                assert etag(body).encode() in pending.pop(fd).recv(65536)
                poller.unregister(fd)
        spans.append(time.monotonic() - t0)
    with capsys.disabled():
        print(f"\nfastpath: one change to {n} streams on one key: last event after "
              f"{', '.join(f'{x * 1000:.0f}' for x in spans)} ms ({n / min(spans):,.0f} events/s)")
    assert metric(fp, "fastpath_stream_events_total") == n * rounds
    for s in socks:
        s.close()


def _slow_reader(fp, uid, port=None):
    """A stream whose client reads nothing yet, with a small receive buffer (port: a TCP port,
    or a unix socket's path)."""
    sock = socket.socket(socket.AF_UNIX if isinstance(port, str) else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(port if isinstance(port, str) else ("127.0.0.1", port or fp.port))
    sock.sendall(f"GET /Poll/getMessages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token(uid)}\r\n"
                 f"Accept: text/event-stream\r\n\r\n".encode())
    return sock


def _changes(cache, notifier, uid, n, size):
    bodies = [bytes([ord("a") + i]) * size for i in range(n)]
    for body in bodies:
        cache.set(key(uid), body)
        notifier.send([key(uid)])
        time.sleep(0.05)                    # each change read before the next
    return bodies


def test_a_slow_reader_gets_every_event_in_order_when_it_reads(fastpath_factory, memcached, cache, notify_dir):
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    notifier = Notifier(notify_dir)
    cache.set(key(20), b"0")
    sock = _slow_reader(fp, 20)
    wait_metric(fp, "fastpath_streams", 1)
    bodies = _changes(cache, notifier, 20, 6, 30000)          # ~180 KB the client has not read
    wait_metric(fp, "fastpath_stream_events_total", 7)
    s = Stream.__new__(Stream)
    s.sock, s.raw, s.text, s.ended, s.status, s.headers = sock, b"", b"", False, None, None
    assert s.event()["data"] == "0"
    for body in bodies:
        assert s.event() == {"id": etag(body), "event": "getMessages", "data": body.decode()}
    s.close()


def _send_q(port, sock):
    """ss's Send-Q of fastpath's end of the connection of our sock: on loopback TCP (port: the
    listener's) the bytes the kernel holds for it, unsent or unacknowledged (/proc/net/tcp's
    tx_queue); on a unix socket (port: its path) the buffers it has sent that the peer has not
    read (`ss -x`).  None once it is gone."""
    if isinstance(port, str):
        out = subprocess.run(["ss", "-xnH"], capture_output=True, text=True, check=True).stdout
        peer = str(os.fstat(sock.fileno()).st_ino)
        return next((int(f[3]) for f in map(str.split, out.splitlines())
                     if len(f) >= 8 and f[4] == port and f[7] == peer), None)
    peer_port = sock.getsockname()[1]
    with open("/proc/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            f = line.split()
            if (f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == port
                    and int(f[2].rsplit(":", 1)[1], 16) == peer_port):
                return int(f[4].split(":")[0], 16)
    return None


BACKLOG_MAX = 256 * 1024             # fp_stream.c STREAM_BACKLOG_MAX: fastpath's own share
KERNEL_MAX = 64 * 1024               # the kernel's: the doubled SO_SNDBUF (fp_stream.c
                                     # STREAM_SNDBUF 16 KiB) is 32 KiB of buffers, whose data
                                     # is less; twice that leaves room for the write that passes
                                     # it (the kernel checks for room before, not during, one).
                                     # Measured: 20-28 KiB on TCP, 39 KiB on a unix socket
                                     # (its Send-Q counts whole buffers); without: 2.8 MB on
                                     # TCP (autotuned), 224 KiB on unix (wmem_default)


@pytest.mark.parametrize("listener", ["poll", "edge", "unix"])
def test_a_reader_that_lets_events_pile_up_is_closed(fastpath_factory, memcached, cache, notify_dir, capsys,
                                                     listener):
    """A stream's client that never reads costs fastpath at most BACKLOG_MAX of its own memory
    and KERNEL_MAX of the kernel's socket buffer (ss's Send-Q), then it is closed: not the
    megabytes the kernel would autotune a TCP send buffer up to (nor a unix socket's 208 KiB
    wmem_default)."""
    fp = fastpath_factory([memcached], edge=listener == "edge", unix=listener == "unix",
                          extra=("--reread-interval", "60", "--timeout-ms", "2000", "--notify-dir", str(notify_dir)))
    port = {"edge": fp.edge_port, "unix": fp.unix_path}.get(listener, fp.port)
    notifier = Notifier(notify_dir)
    cache.set(key(21), b"0")
    sock = _slow_reader(fp, 21, port)
    wait_metric(fp, "fastpath_streams", 1)
    size, fed, send_q = 20000, 0, []
    for i in range(400):             # 8 MB at most: beyond tcp_wmem's 4 MB and BACKLOG_MAX
        cache.set(key(21), bytes([ord("a") + i % 2]) * size)
        notifier.send([key(21)])
        fed += size
        time.sleep(0.05)             # each change read before the next
        q = _send_q(port, sock)
        if q is None or metric(fp, "fastpath_streams") == 0:
            break
        send_q.append(q)
    wait_metric(fp, "fastpath_streams", 0)
    with capsys.disabled():
        print(f"\nfastpath ({listener}): a stream that never reads cut after {fed // 1024} KiB of events; "
              f"the kernel's Send-Q at most {max(send_q) // 1024} KiB")
    assert max(send_q) <= KERNEL_MAX
    # cut at the user-space cap: what it held there, the kernel's share and the client's buffer
    assert fed <= BACKLOG_MAX + KERNEL_MAX + 64 * 1024
    sock.close()


# ---- several resources in one stream (docs/contract.md section 9) ------------------------

BOTH = "getUnreadCount,getMessages"


def both_id(*tags):
    return ",".join(tags)


def test_one_stream_of_two_resources_first_events_in_path_order(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(40, "getUnreadCount"), b'{"u":1}')
    cache.set(key(40), b'{"m":1}')
    s = Stream(fp, 40, resource=BOTH)
    status, headers = s.head()
    assert status == 200 and headers["content-type"] == "text/event-stream"
    u, m = etag(b'{"u":1}'), etag(b'{"m":1}')
    # each event's id is what the client has after it: "" for what it has none of yet
    first, second = s.block(), s.block()
    assert first == f'id: {u},""\nevent: getUnreadCount\ndata: {{"u":1}}'
    assert second == f'id: {u},{m}\nevent: getMessages\ndata: {{"m":1}}'
    # the same bytes as Django's (fastpoll.http.streams_response)
    assert first.encode() + b"\n\n" == event_bytes(composite_event_id([u, None]), "getUnreadCount", b'{"u":1}')
    assert second.encode() + b"\n\n" == event_bytes(composite_event_id([u, m]), "getMessages", b'{"m":1}')
    assert metric(fp, "fastpath_streams") == 1             # one connection, one stream
    assert metric(fp, "fastpath_streams_total") == 1
    assert metric(fp, "fastpath_stream_events_total") == 2
    s.close()
    wait_metric(fp, "fastpath_streams", 0)


def test_a_change_of_one_resource_is_one_event_with_the_new_composite_id(fastpath_factory, memcached, cache,
                                                                         notify_dir):
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    notifier = Notifier(notify_dir)
    cache.set(key(41, "getUnreadCount"), b"0")
    cache.set(key(41), b"m0")
    s = Stream(fp, 41, resource=BOTH)
    s.event(), s.event()
    cache.set(key(41), b"m1")
    notifier.send([key(41)])
    assert s.event() == {"id": both_id(etag(b"0"), etag(b"m1")), "event": "getMessages", "data": "m1"}
    cache.set(key(41, "getUnreadCount"), b"1")
    notifier.send([key(41, "getUnreadCount")])
    assert s.event() == {"id": both_id(etag(b"1"), etag(b"m1")), "event": "getUnreadCount", "data": "1"}
    assert s.quiet(0.3)
    s.close()


@pytest.mark.parametrize("have, sent", [
    (("u", "m"), []),                  # both current: the stream opens quiet
    (("u", "old"), ["getMessages"]),   # only the stale one
    (("old", "m"), ["getUnreadCount"]),
    (None, ["getUnreadCount", "getMessages"]),
])
def test_last_event_id_resumes_every_resource(fastpath_factory, memcached, cache, have, sent):
    fp = start(fastpath_factory, memcached)
    cache.set(key(42, "getUnreadCount"), b"u")
    cache.set(key(42), b"m")
    last = None if have is None else both_id(*(etag(h.encode()) for h in have))
    s = Stream(fp, 42, resource=BOTH, last_event_id=last)
    assert s.head()[0] == 200
    got = [s.event() for _ in sent]
    assert [e["event"] for e in got] == sent
    if got:
        assert got[-1]["id"] == both_id(etag(b"u"), etag(b"m"))
    assert s.quiet(0.2)
    s.close()


def test_an_unreadable_last_event_id_sends_every_resource(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(43, "getUnreadCount"), b"u")
    cache.set(key(43), b"m")
    for last in [etag(b"u"), both_id(etag(b"u"), etag(b"m"), etag(b"m")), "garbage", etag(b"u") + ";" + etag(b"m")]:
        s = Stream(fp, 43, resource=BOTH, last_event_id=last)
        assert [s.event()["event"], s.event()["event"]] == ["getUnreadCount", "getMessages"], last
        s.close()


def test_a_miss_of_one_resource_ends_the_stream(fastpath_factory, memcached, cache, notify_dir):
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    cache.set(key(44, "getUnreadCount"), b"u")
    cache.set(key(44), b"m")
    s = Stream(fp, 44, resource=BOTH)
    s.event(), s.event()
    cache.delete(key(44, "getUnreadCount"))
    Notifier(notify_dir).send([key(44, "getUnreadCount")])
    assert s.event() == {"event": "miss", "data": ""}
    assert s.block() is None and s.ended
    wait_metric(fp, "fastpath_streams", 0)


def test_a_miss_of_one_before_the_stream_opens_is_django_s_404(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(45), b"m")                       # getUnreadCount's key is missing
    s = Stream(fp, 45, resource=BOTH)
    status, headers = s.head()
    assert status == 404 and headers["x-cache"] == "MISS"
    assert metric(fp, "fastpath_streams_total") == 0
    s.close()


@pytest.mark.parametrize("resource", [
    "getUnreadCount,nope", "getMessages,getMessages", "getMessages,", ",getMessages",
    "getUnreadCount,getMessages,getUnreadCount,getMessages,getUnreadCount",
])
def test_unknown_repeated_or_empty_names_are_django_s_404(fastpath_factory, memcached, cache, resource):
    fp = start(fastpath_factory, memcached)
    cache.set(key(46, "getUnreadCount"), b"u")
    cache.set(key(46), b"m")
    status, headers = Stream(fp, 46, resource=resource).head()
    assert status == 404 and headers["x-cache"] == "MISS"


@pytest.mark.parametrize("resource", ["getUnreadCount%2CgetMessages", "getUnreadCount%2cget%4Dessages"])
def test_a_percent_encoded_path_is_read_decoded_as_django_and_nginx_read_it(fastpath_factory, memcached, cache,
                                                                            resource):
    fp = start(fastpath_factory, memcached)
    cache.set(key(49, "getUnreadCount"), b'{"u":1}')
    cache.set(key(49), b'{"m":1}')
    s = Stream(fp, 49, resource=resource)
    assert s.head()[0] == 200
    assert [s.event()["event"], s.event()["event"]] == ["getUnreadCount", "getMessages"]
    s.close()


@pytest.mark.parametrize("resource", ["getMessages%00", "getMessages%2", "getMessages%zz", "get%25Messages",
                                      "getMessages%3F", "getMessages%20", "%" + "41" * 200])
def test_a_bad_or_unusual_escape_is_django_s_404(fastpath_factory, memcached, cache, resource):
    fp = start(fastpath_factory, memcached)
    cache.set(key(49), b'{"m":1}')
    status, headers = Stream(fp, 49, resource=resource).head()
    assert status == 404 and headers["x-cache"] == "MISS"


def test_several_resources_are_only_a_stream(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(47, "getUnreadCount"), b"u")
    cache.set(key(47), b"m")
    for kwargs in [{"accept": "application/json"}, {"method": "POST", "extra": "Content-Length: 0\r\n"},
                   {"method": "HEAD"}, {"extra": "Accept: text/event-stream\r\n"}]:
        status, headers = Stream(fp, 47, resource=BOTH, **kwargs).head()
        assert status == 404 and headers["x-cache"] == "MISS", kwargs
    # 401 before 404 only where the stream would be (Django answers a poll's path first)
    assert Stream(fp, 47, resource=BOTH, auth="Bearer nope").head()[0] == 401


def test_a_stream_of_several_counts_once_toward_the_user_cap(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-held-per-user", "1")
    cache.set(key(48, "getUnreadCount"), b"u")
    cache.set(key(48), b"m")
    s = Stream(fp, 48, resource=BOTH)
    s.event(), s.event()
    assert Stream(fp, 48).head()[0] == 429
    s.close()
    wait_metric(fp, "fastpath_streams", 0)
    s = Stream(fp, 48, resource="getMessages")
    assert s.event()["data"] == "m"
    s.close()


def test_three_resources_and_the_edge(fastpath_factory, memcached, cache):
    from tests.fastpath.test_edge import edge_stream, start as edge_start
    fp = edge_start(fastpath_factory, memcached)
    cache.set(key(49, "getUnreadCount"), b"u")
    cache.set(key(49), b"m")
    s = edge_stream(fp, uid=49, resource=BOTH)
    assert s.head()[0] == 200
    assert [s.event()["event"], s.event()["event"]] == ["getUnreadCount", "getMessages"]
    s.close()
    # a miss of one: on the edge a stream of one event: miss
    cache.delete(key(49))
    s = edge_stream(fp, uid=49, resource=BOTH)
    assert s.head()[0] == 200 and s.event() == {"event": "miss", "data": ""}
    s.close()
    # the edge refuses what names no resource itself
    assert edge_stream(fp, uid=49, resource="getMessages,getMessages").head()[0] == 404
    assert edge_stream(fp, uid=49, resource=BOTH, accept="application/json").head()[0] == 404


def test_big_answers_of_several_resources(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    big = {"getUnreadCount": b"u" * 3000 + b"\nx", "getMessages": b"m\r\n" * 2000}
    for res, body in big.items():
        cache.set(key(50, res), body)
    s = Stream(fp, 50, resource=BOTH)
    for res in ("getUnreadCount", "getMessages"):
        e = s.event()
        assert e["event"] == res
        assert e["data"].encode() == big[res].replace(b"\r\n", b"\n")
    s.close()


# ---- the shared vectors (tests/vectors/contract.json "streams"; Django reads the same ones in
# tests/fastpoll/test_stream.py) ---------------------------------------------------------------

def _vectors():
    import json
    import os
    with open(os.path.join(os.path.dirname(__file__), "..", "vectors", "contract.json")) as fh:
        return json.load(fh)["streams"]


STREAM_VECTORS = _vectors()


def _opening(s, expected, quiet=0.2):
    """What the stream sends first: as many bytes as ``expected``, and whatever more comes within
    ``quiet`` s (nothing, when it sends exactly what is expected)."""
    s.head()
    deadline = time.monotonic() + SLACK
    while True:
        s._dechunk()
        wait = deadline - time.monotonic() if len(s.text) < len(expected) else quiet if quiet else 0
        if wait <= 0:
            break
        try:
            s._recv(wait)
        except (EOFError, socket.timeout):
            break
        quiet = quiet if len(s.text) < len(expected) else 0.05   # after enough: only what is already there
    s._dechunk()
    return s.text.decode("utf-8")


def test_the_vectors_accept_header_says_what_a_stream_request_is(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(60), b"{}")
    for v in STREAM_VECTORS["accept"]:
        s = Stream(fp, 60, method=v["method"], accept=v["accept"]) if v["accept"] is not None else Poll(fp, 60)
        status, headers = s.head() if isinstance(s, Stream) else s.answer()[:2]
        is_stream = status == 200 and headers.get("content-type") == "text/event-stream"
        assert is_stream == v["stream"], v
        s.close()


def test_the_vectors_events_are_fastpaths_bytes(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    for v in STREAM_VECTORS["events"]:
        cache.set(key(61, v["name"]), v["body"].encode("utf-8"))
        s = Stream(fp, 61, resource=v["name"])
        assert _opening(s, STREAM_VECTORS["prefix"] + v["bytes"]) == STREAM_VECTORS["prefix"] + v["bytes"], v
        s.close()


def test_the_vectors_several_resources_open_as_written(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    for v in STREAM_VECTORS["several"]:
        for name, body in zip(v["names"], v["bodies"]):
            cache.set(key(62, name), body.encode("utf-8"))
        s = Stream(fp, 62, resource=",".join(v["names"]), last_event_id=v["last_event_id"])
        assert _opening(s, v["opening"]) == v["opening"], v["why"]
        s.close()
