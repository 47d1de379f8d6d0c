"""The connection layer (fastpath/src/fp_conn.c) over raw sockets: keep-alive rules, request
framing, pipelining past the read buffer, slow readers, clients that leave mid-request, the
connection cap and lingering close."""
import os
import socket
import time
import urllib.request

import pytest
from pymemcache.client.hash import HashClient

import fastpath._server  # noqa: F401  (a build that does not import fails here, never skips)
from tests.fastpath.conftest import RESOURCES, token


def _req(path="/Poll/getMessages", uid=1, method="GET", version="1.1", extra=b"", body=b""):
    head = f"{method} {path} HTTP/{version}\r\nHost: x\r\nAuthorization: Bearer {token(uid)}\r\n".encode()
    if body:
        head += b"Content-Length: %d\r\n" % len(body)
    return head + extra + b"\r\n" + body


class Reader:
    """Reads whole HTTP responses off a socket, keeping what belongs to the next one."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _more(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed; have {self.buf[:200]!r}")
        self.buf += chunk

    def response(self, to_head=False):
        """(status, headers dict, body), the body read exactly by Content-Length (none when
        ``to_head``: the answer to a HEAD)."""
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        need = 0 if to_head else int(headers.get("content-length", 0))
        while len(self.buf) < need:
            self._more()
        body, self.buf = self.buf[:need], self.buf[need:]
        return status, headers, body


def _read_response(sock, to_head=False):
    return Reader(sock).response(to_head)


def _closed_by_peer(sock, timeout=3.0):
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _seconds_until_cut(sock, data, every, within):
    """``data`` sent a byte at a time, each followed by a wait of up to ``every`` seconds for
    the peer to close: the seconds until it closed (or reset) the connection, or None when it
    was still open after ``within`` seconds or all of ``data``."""
    started = time.monotonic()
    for byte in data:
        if time.monotonic() - started >= within:
            break
        try:
            sock.sendall(bytes([byte]))
            sock.settimeout(every)
            if sock.recv(1) == b"":
                return time.monotonic() - started
        except socket.timeout:
            pass
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - started
    return None


@pytest.fixture
def cache(memcached):
    client = HashClient([memcached.spec], default_noreply=False)
    client.set("p1:getMessages:1:0", b'{"mine":1}')
    client.set("p1:getMessages:2:0", b'{"mine":2}')
    return client


@pytest.fixture
def fp(fastpath_factory, memcached, cache):
    return fastpath_factory([memcached], extra=("--idle-timeout", "3", "--max-body", "4096"))


def _connect(fp):
    return socket.create_connection(("127.0.0.1", fp.port), timeout=5)


def test_http11_keeps_the_connection_and_sends_date(fp):
    with _connect(fp) as sock:
        for _ in range(3):
            sock.sendall(_req())
            status, headers, body = _read_response(sock)
            assert status == 200 and body == b'{"mine":1}'
            assert "connection" not in headers and headers["date"].endswith(" GMT")


def test_http10_closes_unless_asked_to_keep_alive(fp):
    with _connect(fp) as sock:
        sock.sendall(_req(version="1.0", extra=b"Connection: keep-alive\r\n"))
        status, headers, _ = _read_response(sock)
        assert status == 200 and headers["connection"] == "keep-alive"
        sock.sendall(_req(version="1.0"))
        status, headers, _ = _read_response(sock)
        assert status == 200 and headers["connection"] == "close"
        assert _closed_by_peer(sock)


def test_request_split_into_single_bytes(fp):
    with _connect(fp) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for byte in _req(uid=2):
            sock.send(bytes([byte]))
        status, _, body = _read_response(sock)
        assert status == 200 and body == b'{"mine":2}'


def test_chunked_post_body_is_read_and_dropped(fp):
    chunked = (b"POST /Poll/getMessages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
               + token(1).encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n")
    with _connect(fp) as sock:
        sock.sendall(chunked + _req(uid=2))
        reader = Reader(sock)
        assert reader.response()[2] == b'{"mine":1}'
        assert reader.response()[2] == b'{"mine":2}'


@pytest.mark.parametrize("data, status", [
    # beyond --max-headers: not refused but handed to Django (docs/fastpath.md)
    (b"GET /Poll/" + b"a" * 40000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 404),
    (b"GET /Poll/getMessages HTTP/1.1\r\nX-Big: " + b"h" * 40000 + b"\r\n\r\n", 404),
    (b"POST /Poll/getMessages HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n", 413),
    (b"POST /Poll/getMessages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     + b"1000\r\n" + b"z" * 4096 + b"\r\n1000\r\n" + b"z" * 4096 + b"\r\n0\r\n\r\n", 413),
    (b"GET /Poll/getMessages HTTP/2.5\r\nHost: x\r\n\r\n", 505),
    (b"HEAD /Poll/getMessages HTTP/1.1\r\nHost: x\r\n\r\n", 404),       # Django answers HEAD
    # refused HEADs: the head a GET would get, never content (RFC 9110 9.3.2)
    (b"HEAD /Poll/getMessages HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n", 413),
    (b"HEAD /Poll/getMessages HTTP/1.1\r\nHost: x\r\nX-A: b\r\n c\r\n\r\n", 400),
    (b"HEAD /Poll/getMessages HTTP/2.5\r\nHost: x\r\n\r\n", 505),
])
def test_limits_answer_with_their_status_then_close(fp, data, status):
    with _connect(fp) as sock:
        sock.sendall(data)
        head = data.startswith(b"HEAD ")
        got, headers, body = _read_response(sock, head)
        assert got == status and headers["connection"] == "close"
        if status == 404:
            assert headers["x-cache"] == "MISS"
        if head:
            assert int(headers["content-length"]) > 0     # what a GET would get; its content never comes
        else:
            assert body.startswith(b'{"error":"')
        assert _closed_by_peer(sock)


def test_pipelined_requests_beyond_the_read_buffer(fp):
    """200 pipelined requests (~60 KB, far more than one read buffer) come back all, in order."""
    uids = [1 + (i % 2) for i in range(200)]
    with _connect(fp) as sock:
        sock.sendall(b"".join(_req(uid=u) for u in uids))
        reader = Reader(sock)
        bodies = [reader.response()[2] for _ in uids]
    assert bodies == [b'{"mine":%d}' % u for u in uids]


@pytest.mark.slow          # ~20 s: out of `make check`, in `make test`
def test_large_value_to_a_slow_reader(fp, cache):
    value = b'{"items":"' + b"x" * 900_000 + b'"}'
    cache.set("p1:getMessages:1:0", value)
    with _connect(fp) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(_req() + _req(uid=2))
        time.sleep(0.5)               # the server fills the socket and must wait for us
        reader = Reader(sock)
        status, _, body = reader.response()
        assert status == 200 and body == value
        assert reader.response()[2] == b'{"mine":2}'


def test_client_leaving_while_memcached_is_slow(fastpath_factory, memcached, cache):
    fp = fastpath_factory([memcached], extra=("--timeout-ms", "1500"))
    memcached.pause()
    try:
        for _ in range(5):
            with _connect(fp) as sock:
                sock.sendall(_req())
        time.sleep(0.2)
    finally:
        memcached.resume()
    with _connect(fp) as sock:       # the dropped answers went nowhere; the server is fine
        sock.sendall(_req(uid=2))
        assert _read_response(sock)[2] == b'{"mine":2}'


def _connect_and_poll(fp, uid=1, patience=3.0):
    """A connection that got its answer.  The fixture's readiness probe may still hold a slot
    for a moment (fastpath closes it when it sees the probe's FIN), so a refusal is retried."""
    deadline = time.monotonic() + patience
    while True:
        sock = _connect(fp)
        try:
            sock.sendall(_req(uid=uid))
            if _read_response(sock)[0] == 200:
                return sock
        except (ConnectionError, OSError):
            pass
        sock.close()
        if time.monotonic() > deadline:
            raise AssertionError("no connection slot became free")
        time.sleep(0.05)


def _metric(fp, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{fp.admin_port}/metrics", timeout=5).read().decode()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def test_connection_cap_closes_extra_connections_at_once(fastpath_factory, memcached, cache):
    fp = fastpath_factory([memcached], extra=("--max-connections", "3"))
    held = [_connect_and_poll(fp) for _ in range(3)]
    try:
        rejected = _metric(fp, "fastpath_connections_rejected_total")   # /metrics works at the cap
        extra = _connect(fp)
        extra.sendall(_req(uid=2))   # accepted once its request came (TCP_DEFER_ACCEPT)
        started = time.monotonic()
        assert _closed_by_peer(extra)
        assert time.monotonic() - started < 2
        extra.close()
        assert _metric(fp, "fastpath_connections_rejected_total") == rejected + 1
        held.pop().close()
        held.append(_connect_and_poll(fp, uid=2))      # a freed slot is usable again
    finally:
        for sock in held:
            sock.close()


def test_a_connection_that_sends_nothing_takes_no_slot(fastpath_factory, memcached, cache):
    """The TCP listener defers accept until a request's first bytes come (nginx's `deferred`):
    connections that stay silent are not accepted and hold no --max-connections slot, and one
    that sends is read at once."""
    fp = fastpath_factory([memcached], extra=("--max-connections", "2"))
    deadline = time.monotonic() + 5  # the start-up probe's slot is free once fastpath saw it go
    while _metric(fp, "fastpath_connections") > 1:           # /metrics' own connection
        assert time.monotonic() < deadline, "the start-up probe's connection stayed open"
        time.sleep(0.05)
    silent = [_connect(fp) for _ in range(3)]
    try:
        time.sleep(0.2)              # time enough to accept them, were they accepted at once
        accepted = _metric(fp, "fastpath_connections_accepted_total")
        with _connect(fp) as sock:
            sock.sendall(_req())
            status, _, body = _read_response(sock)
        assert (status, body) == (200, b'{"mine":1}')
        # this request's connection and the second /metrics request's own
        assert _metric(fp, "fastpath_connections_accepted_total") == accepted + 2
    finally:
        for sock in silent:
            sock.close()


def test_idle_connections_are_closed_after_the_idle_timeout(fp):
    with _connect(fp) as sock:
        sock.sendall(_req())
        _read_response(sock)
        started = time.monotonic()
        assert _closed_by_peer(sock, timeout=8)
        assert 2 <= time.monotonic() - started < 6


def test_metrics_count_open_connections(fp):
    socks = [_connect(fp) for _ in range(4)]
    try:
        for sock in socks:
            sock.sendall(_req())
            _read_response(sock)
        text = urllib.request.urlopen(f"http://127.0.0.1:{fp.admin_port}/metrics", timeout=5).read().decode()
        # ours plus the metrics request's own connection
        assert "fastpath_connections 5" in text
    finally:
        for sock in socks:
            sock.close()


def test_unix_socket_listener(tmp_path, memcached, cache):
    """--listen unix:/path: every worker accepts on one socket; a stale file is replaced; the
    file is gone after SIGTERM."""
    import os
    import signal
    import subprocess
    import sys

    from tests.fastpath.conftest import ROOT, SECRET
    path = tmp_path / "fp.sock"
    path.write_bytes(b"")                      # not a socket: refused with a clear message
    secret = tmp_path / "secret.key"
    secret.write_bytes(SECRET)
    argv = [sys.executable, "-m", "fastpath", "--listen", f"unix:{path}", "--memcached", memcached.spec,
            "--secret-file", str(secret), "--workers", "2", "--resources", RESOURCES]
    bad = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "exists and is not a socket" in bad.stderr
    path.unlink()
    proc = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for uid in (1, 2, 1, 2):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                sock.connect(str(path))
                sock.sendall(_req(uid=uid))
                assert _read_response(sock)[2] == b'{"mine":%d}' % uid
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert not path.exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_sigterm_drains_a_request_in_flight(fastpath_factory, memcached, cache):
    """SIGTERM: idle connections close at once, a request waiting on memcached still gets its
    answer (with Connection: close), then the process exits 0."""
    import signal
    fp = fastpath_factory([memcached], extra=("--timeout-ms", "3000", "--drain-timeout", "5"))
    idle = _connect_and_poll(fp, uid=2)
    memcached.pause()
    try:
        busy = _connect(fp)
        busy.sendall(_req(uid=1))
        time.sleep(0.3)                       # the get is queued on the frozen memcached
        fp.proc.send_signal(signal.SIGTERM)
        assert _closed_by_peer(idle)          # idle keep-alive connection: closed right away
        time.sleep(0.3)
    finally:
        memcached.resume()
    status, headers, body = _read_response(busy)
    assert status == 200 and body == b'{"mine":1}' and headers["connection"] == "close"
    assert fp.proc.wait(timeout=10) == 0
    busy.close()
    idle.close()


@pytest.mark.skipif(not os.environ.get("FASTPATH_ASAN_ROOT"), reason="checks the `make test-asan` build")
def test_sanitizer_build_has_the_state_checks():
    """`make test-asan` compiles the debug checks in (fp_debug.h: a connection state transition
    that its table forbids aborts, and the abort is a sanitizer report that fails the test that
    caused it), so that every test of this directory runs them."""
    import glob
    [lib] = glob.glob(os.path.join(os.environ["FASTPATH_ASAN_ROOT"], "fastpath", "_server*.so"))
    with open(lib, "rb") as fh:
        assert b"assertion %s failed" in fh.read()
