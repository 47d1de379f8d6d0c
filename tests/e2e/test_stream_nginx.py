"""The rendered nginx config routes streams (docs/contract.md section 9): a GET whose Accept
lists text/event-stream (as fastpath and Django read it) goes to the stream location, which
forwards Accept and Last-Event-ID, passes each event on at once (unbuffered) and falls back to
Django on 404/502/503; anything else stays a poll.

fastpath and Django are small recording HTTP servers here, so the test sees exactly what nginx
forwarded and when."""
import socket
import time
from http.server import BaseHTTPRequestHandler

import pytest

from tests.support.stack import nginx_in_front_of, stack_config

GAP_S = 2.0             # between a stand-in fastpath's two events: buffering would hold the first


def _recorder(who, seen):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            seen.append({"who": who, "method": self.command, "path": self.path,
                         "accept": self.headers.get("Accept"), "last": self.headers.get("Last-Event-ID")})
            if who == "fastpath" and "/miss" in self.path:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if who == "fastpath" and self.headers.get("Accept") == "text/event-stream":
                # as fastpath streams: chunked, one chunk per event, "X-Accel-Buffering: no"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("X-Accel-Buffering", "no")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for data in (b"id: 1\nevent: r\ndata: one\n\n", b"id: 2\nevent: r\ndata: two\n\n"):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                    time.sleep(GAP_S)
                self.wfile.write(b"0\r\n\r\n")
                return
            body = f"{who}\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_HEAD = _answer

        def log_message(self, *args):
            pass

    return Handler


@pytest.fixture
def nginx_with_fakes(tmp_path):
    config = stack_config(tmp_path)
    seen = []
    with nginx_in_front_of(config, {config.django: _recorder("django", seen),
                                    config.fastpath: _recorder("fastpath", seen)}):
        yield config, seen


def _request(config, method, path, headers):
    sock = socket.create_connection(config.http, timeout=10)
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    if method == "POST":
        head += "Content-Length: 0\r\n"
    sock.sendall((head + "\r\n").encode())
    return sock


def test_a_stream_reaches_fastpath_with_its_headers_and_each_event_at_once(nginx_with_fakes):
    config, seen = nginx_with_fakes
    t0 = time.monotonic()
    sock = _request(config, "GET", "/Poll/getMessages?x=1", {"Accept": "text/event-stream", "Last-Event-ID": '"a"',
                                                             "Prefer": "wait=30"})
    got = b""
    while b"data: one" not in got:
        got += sock.recv(65536)
    first = time.monotonic() - t0
    sock.close()
    assert first < GAP_S * 0.75, f"the first event took {first:.2f} s: buffered"
    assert b"text/event-stream" in got
    assert b"\r\nX-Accel-Buffering: no\r\n" in got       # for a balancer in front, also nginx
    assert seen == [{"who": "fastpath", "method": "GET", "path": "/Poll/getMessages?x=1",
                     "accept": "text/event-stream", "last": '"a"'}]


@pytest.mark.parametrize("accept", ["text/event-stream", "text/html, Text/Event-Stream;q=0.5"])
def test_a_stream_that_misses_falls_back_to_django(nginx_with_fakes, accept):
    config, seen = nginx_with_fakes
    sock = _request(config, "GET", "/Poll/miss", {"Accept": accept})
    got = b""
    while not got.endswith(b"django\n"):
        got += sock.recv(65536)
    sock.close()
    assert [(r["who"], r["path"], r["accept"]) for r in seen] == [("fastpath", "/Poll/miss", accept),
                                                                  ("django", "/Poll/miss", accept)]


@pytest.mark.parametrize("method, accept", [("POST", "text/event-stream"), ("GET", "text/event-streams"),
                                            ("GET", "application/json")])
def test_anything_else_is_a_poll(nginx_with_fakes, method, accept):
    """The poll location forwards no Accept: fastpath reads it only on the stream location."""
    config, seen = nginx_with_fakes
    sock = _request(config, method, "/Poll/getMessages", {"Accept": accept})
    got = b""
    while not got.endswith(b"fastpath\n"):
        got += sock.recv(65536)
    sock.close()
    assert [(r["who"], r["accept"]) for r in seen] == [("fastpath", None)]
