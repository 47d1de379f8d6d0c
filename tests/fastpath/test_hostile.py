"""Malformed and hostile input over raw sockets: clear 4xx, no crash, no hang, no leak of
another user's entry.  Ends with a seeded mutation fuzz over the request path."""
import random
import socket
import time

import pytest
from pymemcache.client.hash import HashClient

from tests.fastpath.conftest import token

pytest.importorskip("fastpath._server")


def _raw(port, data, timeout=3.0, read_all=True):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                if not read_all:
                    break
        except socket.timeout:
            pass
        return b"".join(chunks)


def _status(response):
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.") else None


@pytest.fixture
def fp(fastpath_factory, memcached):
    cache = HashClient([memcached.spec], default_noreply=False)
    cache.set("p1:getMessages:1:0", b'{"mine":1}')
    cache.set("p1:getMessages:2:0", b'{"mine":2}')
    return fastpath_factory([memcached], extra=("--idle-timeout", "2", "--max-body", "1024"))


def _req(path="/Poll/getMessages", tok=None, method="GET", extra=b"", body=b"", close=True):
    tok = tok or token(1)
    head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tok}\r\n").encode()
    if body:
        head += b"Content-Length: %d\r\n" % len(body)
    if close:
        head += b"Connection: close\r\n"
    return head + extra + b"\r\n" + body


def test_pipelined_requests_are_answered_in_order(fp):
    data = _req(tok=token(1), close=False) + _req(tok=token(2), close=False) + _req(tok=token(1))
    out = _raw(fp.port, data)
    assert out.count(b"HTTP/1.1 200") == 3
    assert out.index(b'{"mine":1}') < out.index(b'{"mine":2}') < out.rindex(b'{"mine":1}')


@pytest.mark.parametrize("data, allowed", [
    (b"\x00\x01\x02garbage\r\n\r\n", {400, None}),
    (b"GET /Poll/getMessages HTTP/9.9\r\n\r\n", {400, 505, None}),
    (b"GET " + b"/Poll/" + b"a" * 10000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", {400, 414, None}),
    (b"GET /Poll/getMessages HTTP/1.1\r\nX: " + b"h" * 20000 + b"\r\n\r\n", {400, 431, None}),
    (b"GET /Poll/getMes\x00sages HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", {400, 401, 404, None}),
    (b"BREW /Poll/getMessages HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", {400, 405, 501, None}),
])
def test_malformed_requests_get_4xx_or_close(fp, data, allowed):
    assert _status(_raw(fp.port, data)) in allowed
    assert _status(_raw(fp.port, _req())) == 200          # and the server is still fine


def test_oversized_body_is_413(fp):
    assert _status(_raw(fp.port, _req(method="POST", body=b"x" * 5000))) == 413


def test_path_tricks_never_reach_a_key(fp):
    for path in ("/Poll/../Poll/getMessages", "/Poll/getMessages/../getUnreadCount",
                 "/Poll//getMessages", "/Poll/getMessages%00", "/poll/getMessages", "/Poll/getMessages;x"):
        assert _status(_raw(fp.port, _req(path=path))) == 404, path


def test_slowloris_is_cut_off(fp):
    with socket.create_connection(("127.0.0.1", fp.port), timeout=10) as sock:
        sock.sendall(b"GET /Poll/getMessages HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        sock.settimeout(10)
        answer = sock.recv(100)
        assert answer == b"" or _status(answer) in (400, 408)
        assert time.monotonic() - started < 6                # closed by --idle-timeout 2
    assert _status(_raw(fp.port, _req())) == 200


def test_token_of_user_2_in_cookie_with_bearer_of_user_1(fp):
    data = _req(tok=token(1), extra=f"Cookie: plurk_token={token(2)}\r\n".encode())
    assert b'{"mine":1}' in _raw(fp.port, data)


def test_seeded_mutation_fuzz(fp):
    """Random byte flips, truncations and splices of valid requests: every answer is a
    well-formed HTTP response or a close, user 1 never sees user 2's entry, and the server lives."""
    rng = random.Random(20091122)
    seeds = [_req(), _req(method="POST", body=b"a=1"), _req(path="/Poll/getUnreadCount"),
             _req(extra=f"Cookie: plurk_token={token(1)}\r\n".encode())]
    for i in range(300):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 6)):
            op = rng.random()
            pos = rng.randrange(len(data))
            if op < 0.4:
                data[pos] = rng.randrange(256)
            elif op < 0.6:
                del data[pos:pos + rng.randint(1, 20)]
            elif op < 0.8:
                data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
            else:
                data[pos:pos] = rng.choice(seeds)[:rng.randint(1, 60)]
        out = _raw(fp.port, bytes(data), timeout=0.3)
        assert out == b"" or out.startswith(b"HTTP/1."), (i, bytes(data)[:200], out[:200])
        assert b'{"mine":2}' not in out
    assert _status(_raw(fp.port, _req())) == 200
