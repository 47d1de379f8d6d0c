"""Long-polling in fastpath (issue 14, docs/contract.md section 7): a poll that sends
``Prefer: wait=N`` and the ETag it has is held until its answer changes, and ended by the
notices plurkcore sends (unix datagrams), by the periodic re-read, by a miss, or by its timeout.
Real memcached, real fastpath, real sockets; notices are sent from here in the fixed format."""
import hashlib
import os
import socket
import time
import urllib.request

import pytest
from pymemcache.client.base import Client

import fastpath._server  # noqa: F401  (a build that does not import fails here, never skips)
from tests.fastpath.conftest import token

SLACK = 10          # seconds: "within N seconds" bounds are generous on a shared machine


def etag(body):
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def metric(fp, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{fp.admin_port}/metrics", timeout=5).read().decode()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def wait_metric(fp, name, value, timeout=SLACK):
    deadline = time.monotonic() + timeout
    while metric(fp, name) != value:
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} is {metric(fp, name)}, not {value}")
        time.sleep(0.02)


def key(uid, resource="getMessages"):
    return f"p1:{resource}:{uid}:0"


class Poll:
    """One raw HTTP/1.1 poll on its own connection: send now, read the answer later."""

    def __init__(self, fp, uid, tag=None, wait=None, resource="getMessages", extra=""):
        self.sock = socket.create_connection(("127.0.0.1", fp.port), timeout=SLACK + 60)
        head = f"GET /Poll/{resource} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token(uid)}\r\n"
        if tag is not None:
            head += f"If-None-Match: {tag}\r\n"
        if wait is not None:
            head += f"Prefer: wait={wait}\r\n"
        self.sock.sendall((head + extra + "\r\n").encode())

    def ready(self, timeout=0.0):
        import select
        return bool(select.select([self.sock], [], [], timeout)[0])

    def answer(self, timeout=SLACK):
        self.sock.settimeout(timeout)
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError(f"closed after {raw!r}")
            raw += chunk
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        length = int(headers.get("content-length", 0))
        while len(body) < length:
            body += self.sock.recv(65536)
        return int(lines[0].split()[1]), headers, body

    def close(self):
        self.sock.close()


@pytest.fixture
def cache(memcached):
    client = Client(memcached.spec, default_noreply=False)
    yield client
    client.close()


def start(fastpath_factory, memcached, *extra, notify=None):
    args = ["--reread-interval", "60", "--timeout-ms", "2000", *extra]
    if notify is not None:
        args += ["--notify-dir", str(notify)]
    return fastpath_factory([memcached], extra=tuple(args))


# ---- without notices ----------------------------------------------------------------------

def test_matching_tag_without_wait_is_304_at_once(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(1), b'{"count":1}')
    status, headers, body = Poll(fp, 1, etag(b'{"count":1}')).answer()
    assert status == 304 and headers["etag"] == etag(b'{"count":1}') and body == b""
    assert "preference-applied" not in headers
    assert metric(fp, "fastpath_holds_total") == 0


def test_differing_tag_with_wait_is_answered_at_once(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(2), b'{"count":2}')
    status, headers, body = Poll(fp, 2, etag(b"old"), wait=30).answer(timeout=SLACK)
    assert (status, body) == (200, b'{"count":2}')
    assert headers["etag"] == etag(body) and headers["preference-applied"] == "wait=30"


def test_hold_times_out_with_304_and_the_same_etag(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-wait", "2")
    cache.set(key(3), b"")
    started = time.monotonic()
    poll = Poll(fp, 3, "W/" + etag(b""), wait=40)
    wait_metric(fp, "fastpath_held_polls", 1)
    status, headers, body = poll.answer(timeout=SLACK)
    took = time.monotonic() - started
    assert status == 304 and headers["etag"] == etag(b"") and body == b""
    assert headers["preference-applied"] == "wait=2" and headers["x-cache"] == "HIT"
    assert 1.5 <= took < 2 + SLACK            # jittered down by at most 10%
    assert metric(fp, "fastpath_hold_timeouts_total") == 1
    assert metric(fp, "fastpath_held_polls") == 0


def test_change_is_found_by_the_periodic_reread_when_notices_are_off(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--reread-interval", "1")
    cache.set(key(4), b'{"count":1}')
    poll = Poll(fp, 4, etag(b'{"count":1}'), wait=50)
    wait_metric(fp, "fastpath_held_polls", 1)
    time.sleep(0.3)
    assert not poll.ready()
    cache.set(key(4), b'{"count":2}')
    status, headers, body = poll.answer(timeout=1 + SLACK)
    assert (status, body, headers["etag"]) == (200, b'{"count":2}', etag(b'{"count":2}'))
    assert metric(fp, "fastpath_holds_woken_total") == 1
    assert metric(fp, "fastpath_wait_rereads_total") >= 1
    assert metric(fp, "fastpath_held_polls") == 0


def test_same_bytes_stored_again_do_not_wake(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--reread-interval", "1", "--max-wait", "4")
    cache.set(key(5), b'{"count":5}')
    poll = Poll(fp, 5, etag(b'{"count":5}'), wait=50)
    wait_metric(fp, "fastpath_held_polls", 1)
    cache.set(key(5), b'{"count":5}')
    before = metric(fp, "fastpath_wait_rereads_total")
    deadline = time.monotonic() + SLACK
    while metric(fp, "fastpath_wait_rereads_total") < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(fp, "fastpath_wait_rereads_total") >= before + 2    # read again, unchanged
    status, headers, _ = poll.answer()
    assert status == 304 and metric(fp, "fastpath_holds_woken_total") == 0


@pytest.mark.parametrize("how", ["delete", "flush"])
def test_key_deleted_or_flushed_while_held_is_404(fastpath_factory, memcached, cache, how):
    fp = start(fastpath_factory, memcached, "--reread-interval", "1")
    cache.set(key(6), b'{"count":6}')
    poll = Poll(fp, 6, etag(b'{"count":6}'), wait=50)
    wait_metric(fp, "fastpath_held_polls", 1)
    if how == "delete":
        cache.delete(key(6))
    else:
        cache.flush_all()
    status, headers, body = poll.answer(timeout=1 + SLACK)
    assert status == 404 and headers["x-cache"] == "MISS" and headers["preference-applied"] == "wait=50"
    assert metric(fp, "fastpath_held_polls") == 0


def test_memcached_restarted_while_held_ends_the_hold(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--reread-interval", "1")
    cache.set(key(7), b'{"count":7}')
    poll = Poll(fp, 7, etag(b'{"count":7}'), wait=50)
    wait_metric(fp, "fastpath_held_polls", 1)
    memcached.stop()
    memcached.start()
    status, headers, _ = poll.answer(timeout=1 + SLACK)
    assert status in (404, 503) and headers["x-cache"] == "MISS"     # empty after restart, or down
    assert metric(fp, "fastpath_held_polls") == 0


def test_client_that_leaves_while_held_is_freed(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(8), b"")
    polls = [Poll(fp, 8, etag(b""), wait=50) for _ in range(3)]
    wait_metric(fp, "fastpath_held_polls", 3)
    for p in polls:
        p.close()
    wait_metric(fp, "fastpath_held_polls", 0, timeout=5)
    wait_metric(fp, "fastpath_connections", 1, timeout=5)     # the /metrics request itself


def test_keep_alive_after_a_held_poll(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-wait", "1")
    cache.set(key(9), b"x")
    poll = Poll(fp, 9, etag(b"x"), wait=5)
    assert poll.answer()[0] == 304
    poll.sock.sendall(f"GET /Poll/getMessages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token(9)}\r\n\r\n".encode())
    status, headers, body = poll.answer()
    assert (status, body) == (200, b"x") and "preference-applied" not in headers


def test_max_wait_zero_never_holds(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-wait", "0")
    cache.set(key(10), b"x")
    status, headers, _ = Poll(fp, 10, etag(b"x"), wait=30).answer(timeout=SLACK)
    assert status == 304 and "preference-applied" not in headers
