"""The hardening probes over TLS (issue 32: "the hardening probes that pass on plain HTTP also pass
over TLS").  A real stack on loopback (tests.support.stack, no edge) as the web host, and a
balancer (PLURK_ROLES=balancer, its own runner) on 127.0.0.10 serving https with a certificate of
a CA made here (plurksite.cluster.tls, as `make cluster` makes them).  Each malformed head gets
the same JSON refusal over TLS at the balancer as over plain HTTP at the web host, then a close;
a head trickled byte by byte, a client that never sends its ClientHello and one that sends
nothing after the handshake are cut within client_header_timeout (10 s; nginx 1.22 has no
ssl_handshake_timeout in http and takes the handshake's from it) while other clients are
served; a long-poll is held over TLS until a plurk wakes it, and a stream's first event arrives
before its second exists.  The balancer alone over TLS (a stand-in web host, the handshake's
versions and suites) is tests/plurksite/test_balancer_tls.py."""
import http.client
import json
import os
import socket
import ssl
import subprocess
import threading
import time
import uuid

import pytest
import requests

from plurksite import nginxconf
from plurksite.cluster import tls
from plurksite.config import StackConfig, format_hostport
from plurksite.services import free_port
from plurksite.stack import Stack
from tests.support.sse import open_held_stream, read_event
from tests.support.stack import TestStack, stack_config

pytestmark = pytest.mark.slow

HOST = "127.0.0.10"            # the balancer's address (the web host's is 127.0.0.1)
HEADER_TIMEOUT_S = 10          # client_header_timeout of nginx/balancer.conf.template
MAX_WAIT_S = 30                # PLURK_LONGPOLL_MAX_WAIT_S
PER_ADDRESS = 4                # PLURK_HELD_PER_ADDRESS (the web host's limit_conn; loopback is not capped)


class Site:
    """Where the probes go: the web host's nginx over plain HTTP, the balancer over https."""

    def __init__(self, web, https_port, ca_file):
        self.web = web
        self.https = (HOST, https_port)
        self.ca_file = ca_file
        self.context = ssl.create_default_context(cafile=ca_file)
        self.base_url = f"https://{format_hostport(*self.https)}"

    def address(self, transport):
        return self.https if transport == "tls" else self.web.config.http

    def host_header(self, transport):
        return format_hostport(*self.address(transport))

    def connect(self, transport, timeout=10):
        raw = socket.create_connection(self.address(transport), timeout=timeout)
        if transport != "tls":
            return raw
        return self.context.wrap_socket(raw, server_hostname=HOST)

    def request(self, method, path, token=None, **kwargs):
        headers = kwargs.pop("headers", {})
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return requests.request(method, self.base_url + path, headers=headers, verify=self.ca_file,
                                timeout=10, **kwargs)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    web_config = stack_config(tmp_path_factory.mktemp("web"), PLURK_EDGE="", PLURK_PUBLIC_HOSTS=HOST,
                              PLURK_TRUSTED_PROXIES="127.0.0.1", PLURK_LONGPOLL_MAX_WAIT_S=str(MAX_WAIT_S),
                              PLURK_HELD_PER_ADDRESS=str(PER_ADDRESS))
    lb_dir = str(tmp_path_factory.mktemp("balancer"))
    ca_dir = str(tmp_path_factory.mktemp("ca"))
    tls.ensure_site(os.path.join(lb_dir, nginxconf.TLS_DIR), ca_dir, [f"IP:{HOST}", "DNS:plurk.test"])
    lb_config = StackConfig.from_env({
        "PLURK_ROLES": "balancer", "PLURK_HTTP": f"{HOST}:{free_port(HOST)}",
        "PLURK_WEB_HOSTS": format_hostport(*web_config.http), "PLURK_VAR_DIR": lb_dir,
        "PLURK_SECRET_FILE": os.path.join(lb_dir, "secret.key"),
        "PLURK_LONGPOLL_MAX_WAIT_S": str(MAX_WAIT_S)})
    with pytest.MonkeyPatch.context() as mp:
        https_port = free_port(HOST)
        mp.setattr(nginxconf, "HTTPS_PORT", https_port)        # standing for 443
        with TestStack(web_config, nginx_workers=1, supervise=False) as web:
            balancer = Stack(lb_config, nginx_workers=1, supervise=False)
            balancer.start()          # its runner checks that a poll over https reaches fastpath
            try:
                yield Site(web, https_port, os.path.join(ca_dir, "ca.crt"))
            finally:
                balancer.stop()


def _read_all(sock, timeout=5.0):
    """Everything until the server closes: (bytes, how it ended: "closed", "reset" or "timeout")."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        return data, "reset"
    except (socket.timeout, TimeoutError):
        return data, "timeout"
    return data, "closed"


def _nothing_within(sock, seconds):
    """Nothing of an answer comes on ``sock`` for ``seconds`` (a select would also wake for TLS
    1.3's session tickets, which the ssl module reads and keeps to itself)."""
    sock.settimeout(seconds)
    try:
        got = sock.recv(65536)
    except (socket.timeout, TimeoutError):
        return
    raise AssertionError(f"answered at once instead of held: {got[:300]!r}")


def _parse(reply):
    """(status, headers with lower-case names, body) of one whole response."""
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    assert len(body) == int(headers.get("content-length", -1)), reply[:500]
    return int(lines[0].split(" ", 2)[1]), headers, body


def _warm_etag(site, token, resource="getUnreadCount"):
    """The ETag of the user's answer once fastpath answers it over https (a miss is filled by Django)."""
    deadline = time.monotonic() + 10
    while True:
        resp = site.request("GET", f"/Poll/{resource}", token)
        if resp.headers.get("X-Cache") == "HIT" and resp.headers.get("ETag"):
            return resp.headers["ETag"]
        assert time.monotonic() < deadline, f"fastpath never answered over https: {resp.status_code} {resp.headers}"
        time.sleep(0.1)


def _pair(site):
    """(writer token, reader token): two new users over https, the reader following the writer."""
    names, tokens = [], []
    for prefix in ("writer", "reader"):
        name = f"{prefix}{uuid.uuid4().hex[:10]}"
        resp = site.request("POST", "/api/signup", json={"username": name, "password": "secret-pass-1"})
        assert resp.status_code == 201, resp.text
        names.append(name)
        tokens.append(resp.json()["token"])
    resp = site.request("POST", "/api/follow", tokens[1], json={"username": names[0]})
    assert resp.status_code in (200, 201), resp.text
    return tokens


# -- malformed heads: the same JSON refusal, then a close ------------------------------------------

_GET = b"GET /Poll/getUnreadCount HTTP/1.1\r\nHost: {host}\r\n"
_POST = b"POST /api/plurks HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
PROBES = {
    # nginx's limits (large_client_header_buffers 4 8k): the request line, one header line, the head
    "long-request-line": (b"GET /Poll/getUnreadCount?q=" + b"x" * 9000 + b" HTTP/1.1\r\nHost: {host}\r\n\r\n",
                          414, "request URI too long"),
    "long-header-line": (_GET + b"X-Big: " + b"h" * 9000 + b"\r\n\r\n", 400, "bad request"),
    "head-over-32k": (_GET + b"".join(b"X-Big-%d: %s\r\n" % (i, b"h" * 7000) for i in range(5)) + b"\r\n",
                      400, "bad request"),
    "obs-fold": (_GET + b"X-Note: one\r\n two\r\n\r\n", 400, "bad request"),
    "control-in-header-name": (_GET + b"X-No\x01te: one\r\n\r\n", 400, "bad request"),
    "nul-in-header-value": (_GET + b"X-Note: o\x00ne\r\n\r\n", 400, "bad request"),
    "control-in-request-line": (b"GET /Poll/getUnread\x01Count HTTP/1.1\r\nHost: {host}\r\n\r\n", 400, "bad request"),
    "bad-content-length": (_POST + b"Content-Length: abc\r\n\r\n{}", 400, "bad request"),
    "two-content-lengths": (_POST + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{} ", 400, "bad request"),
    "content-length-and-chunked": (_POST + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                                   400, "bad request"),
}


def _probe(site, transport, data):
    """The answer to ``data`` (no Connection: close: the server must close by itself)."""
    with site.connect(transport) as sock:
        sock.sendall(data.replace(b"{host}", site.host_header(transport).encode()))
        reply, ending = _read_all(sock)
    assert ending in ("closed", "reset"), f"the connection was left open after {reply[:200]!r}"
    return _parse(reply)


@pytest.mark.parametrize("name", list(PROBES))
def test_a_malformed_head_is_refused_as_json_over_tls_as_over_plain_http(site, name):
    data, status, words = PROBES[name]
    answers = {}
    for transport in ("plain", "tls"):
        got, headers, body = _probe(site, transport, data)
        assert got == status, (transport, got, body[:300])
        assert headers["content-type"].startswith("application/json"), (transport, headers, body[:300])
        assert json.loads(body) == {"error": words}, (transport, body[:300])
        assert headers.get("connection") == "close", (transport, headers)
        answers[transport] = (got, body)
    assert answers["tls"] == answers["plain"]
    # and the site is still served over TLS
    with site.connect("tls") as sock:
        sock.sendall(_GET.replace(b"{host}", site.host_header("tls").encode()) + b"Connection: close\r\n\r\n")
        got, headers, _ = _parse(_read_all(sock)[0])
    assert got == 401 and headers["content-type"].startswith("application/json")


# -- slow clients: cut within the header timeout, everyone else served meanwhile -------------------

class SlowClient(threading.Thread):
    """A client that stalls at one stage; ``cut_after`` is the seconds from its connect until the
    balancer closed it (None: still open when the client gave up)."""

    def __init__(self, site, stage, give_up_s=HEADER_TIMEOUT_S + 12):
        super().__init__(daemon=True)
        self.site, self.stage, self.give_up_s = site, stage, give_up_s
        self.cut_after = self.sent = self.total = self.error = None

    def run(self):
        try:
            self._run()
        except Exception as exc:        # reported by the test, not lost in the thread
            self.error = repr(exc)

    def _closed(self, sock, wait):
        """Whether the server closed ``sock`` within ``wait`` seconds (any bytes it sent ignored;
        TLS 1.3's session tickets make the socket readable with nothing for the client)."""
        sock.settimeout(wait)
        try:
            return sock.recv(4096) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except (socket.timeout, TimeoutError):
            return False

    def _run(self):
        raw = socket.create_connection(self.site.https, timeout=10)
        began = time.monotonic()
        sock = raw
        try:
            if self.stage == "no-client-hello":         # TCP is up; no TLS record ever comes
                chunks = []
            else:
                context = self.site.context
                if self.stage == "h2-nothing-after-handshake":     # HTTP/2 agreed, no preface
                    context = ssl.create_default_context(cafile=self.site.ca_file)
                    context.set_alpn_protocols(["h2"])
                sock = context.wrap_socket(raw, server_hostname=HOST)
                if self.stage == "h2-nothing-after-handshake":
                    assert sock.selected_alpn_protocol() == "h2"
                    chunks = []
                elif self.stage == "nothing-after-handshake":
                    chunks = []
                else:                                    # "slowloris": the head, a byte every 0.2 s
                    head = (_GET.replace(b"{host}", self.site.host_header("tls").encode())
                            + b"".join(b"X-Slow-%d: %s\r\n" % (i, b"s" * 8) for i in range(8)) + b"\r\n")
                    assert len(head) * 0.2 > self.give_up_s        # it could never finish in time
                    chunks = [head[i:i + 1] for i in range(len(head))]
            self.sent, self.total = 0, len(chunks)
            while time.monotonic() - began < self.give_up_s:
                if chunks and self.sent < len(chunks):
                    try:
                        sock.sendall(chunks[self.sent])
                    except (BrokenPipeError, ConnectionResetError):
                        self.cut_after = time.monotonic() - began
                        return
                    self.sent += 1
                if self._closed(sock, 0.2):
                    self.cut_after = time.monotonic() - began
                    return
        finally:
            sock.close()


def test_slow_clients_are_cut_within_the_header_timeout_while_others_are_served(site):
    clients = [SlowClient(site, stage) for stage in ("slowloris", "no-client-hello", "nothing-after-handshake",
                                                     "h2-nothing-after-handshake")]
    for client in clients:
        client.start()
    timings = []
    while any(c.is_alive() for c in clients):
        began = time.monotonic()
        with site.connect("tls", timeout=5) as sock:       # a new handshake each time
            sock.sendall(_GET.replace(b"{host}", site.host_header("tls").encode()) + b"Connection: close\r\n\r\n")
            got, _, _ = _parse(_read_all(sock)[0])
        timings.append(time.monotonic() - began)
        assert got == 401
        time.sleep(0.5)
    for client in clients:
        client.join()
    cuts = {c.stage: c.cut_after for c in clients}
    print(f"cut after (s): {cuts}; {len(timings)} other clients served meanwhile, worst "
          f"{max(timings) * 1000:.0f} ms")
    assert [c.error for c in clients] == [None] * len(clients), [c.error for c in clients]
    for client in clients:
        assert client.cut_after is not None, f"{client.stage}: still open after {client.give_up_s} s"
        # the header timeout cut it (not an error at once), well before the head could be whole
        assert HEADER_TIMEOUT_S - 1 < client.cut_after < HEADER_TIMEOUT_S + 3, (client.stage, client.cut_after)
    slowloris = clients[0]
    assert 0 < slowloris.sent < slowloris.total, (slowloris.sent, slowloris.total)   # cut while trickling
    assert len(timings) >= HEADER_TIMEOUT_S and max(timings) < 1.0, timings


# -- held answers pass over TLS as they come ------------------------------------------------------

def test_a_long_poll_is_held_over_tls_until_a_plurk_wakes_it(site):
    writer, reader = _pair(site)
    etag = _warm_etag(site, reader)
    with site.connect("tls") as sock:
        sock.sendall((f"GET /Poll/getUnreadCount HTTP/1.1\r\nHost: {site.host_header('tls')}\r\n"
                      f"Authorization: Bearer {reader}\r\nPrefer: wait={MAX_WAIT_S}\r\nIf-None-Match: {etag}\r\n"
                      f"Connection: close\r\n\r\n").encode())
        _nothing_within(sock, 1.5)
        resp = site.request("POST", "/api/plurks", writer, json={"content": "wake up over TLS"})
        assert resp.status_code == 201, resp.text
        posted = time.monotonic()
        reply, _ = _read_all(sock, timeout=MAX_WAIT_S + 10)
        arrived = time.monotonic() - posted
    status, headers, body = _parse(reply)
    assert status == 200 and json.loads(body) == {"count": 1}, reply[:500]
    assert headers["x-cache"] == "HIT" and headers["etag"] != etag
    assert arrived < 1.5, f"woken {arrived:.2f} s after the plurk: by the notice, not the wait's end?"


def test_a_stream_over_tls_is_not_buffered(site):
    writer, reader = _pair(site)
    _warm_etag(site, reader)
    conn, resp, _ = open_held_stream(
        lambda: http.client.HTTPSConnection(*site.https, timeout=10, context=site.context), reader)
    try:
        conn.sock.settimeout(5)           # the first event comes at once, not when a buffer fills
        began = time.monotonic()
        try:
            first = read_event(resp.readline)
        except (socket.timeout, TimeoutError):
            raise AssertionError("no first event within 5 s: the balancer holds it back (buffered)") from None
        assert first["event"] == "getUnreadCount" and time.monotonic() - began < 3, first
        posted = time.monotonic()
        assert site.request("POST", "/api/plurks", writer, json={"content": "an event"}).status_code == 201
        second = read_event(resp.readline)
        arrived = time.monotonic() - posted
        assert second["event"] == "getUnreadCount" and second["data"] == '{"count":1}', second
        assert second["id"] != first["id"]
        assert arrived < 1.5, f"the event took {arrived:.2f} s through the balancer"
    finally:
        conn.close()


# -- HTTP/2 at the balancer: held answers and streams as over HTTP/1.1 ------------------------------

def _curl_h2(site, token, *args):
    return ["curl", "-sS", "--http2", "--max-time", "60", "--cacert", site.ca_file,
            "-H", f"Authorization: Bearer {token}", *args]


def test_a_long_poll_is_held_over_http2_until_a_plurk_wakes_it(site):
    writer, reader = _pair(site)
    etag = _warm_etag(site, reader)
    curl = subprocess.Popen(_curl_h2(site, reader, "-H", f"Prefer: wait={MAX_WAIT_S}", "-H", f"If-None-Match: {etag}",
                                     "-w", "\n%{http_version} %{http_code} %header{x-cache}",
                                     f"{site.base_url}/Poll/getUnreadCount"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        assert curl.poll() is None, f"answered at once instead of held: {curl.communicate()}"
        post = subprocess.run(_curl_h2(site, writer, "-H", "Content-Type: application/json", "-o", "/dev/null",
                                       "-w", "%{http_version} %{http_code}", "--data", '{"content":"over HTTP/2"}',
                                       f"{site.base_url}/api/plurks"), capture_output=True, text=True, timeout=30)
        assert post.stdout == "2 201", post.stdout + post.stderr         # a POST's body over HTTP/2 too
        posted = time.monotonic()
        out, err = curl.communicate(timeout=MAX_WAIT_S + 10)
        arrived = time.monotonic() - posted
    finally:
        curl.kill()
    body, _, written = out.rpartition("\n")
    assert written == "2 200 HIT" and json.loads(body) == {"count": 1}, (out, err)
    assert arrived < 1.5, f"woken {arrived:.2f} s after the plurk: by the notice, not the wait's end?"


def test_a_stream_over_http2_is_not_buffered(site):
    writer, reader = _pair(site)
    _warm_etag(site, reader)
    deadline = time.monotonic() + 10
    while True:            # as EventSource: until fastpath holds the stream (not Django's one event)
        curl = subprocess.Popen(_curl_h2(site, reader, "-N", "-D", "-", "-H", "Accept: text/event-stream",
                                         f"{site.base_url}/Poll/getUnreadCount"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        head = []
        while (line := curl.stdout.readline().strip()) or not head:
            head.append(line.decode("latin-1").lower())
            assert line, curl.stderr.read()
        if head[0].startswith("http/2 200") and "x-cache: hit" in head:
            break
        curl.kill()
        curl.wait()
        assert time.monotonic() < deadline, f"fastpath never held the stream: {head}"
        time.sleep(1.0)

    try:
        assert "content-type: text/event-stream" in head, head
        began = time.monotonic()
        first = read_event(curl.stdout.readline)      # fastpath's answer, at once
        assert first["event"] == "getUnreadCount" and time.monotonic() - began < 3, first
        posted = time.monotonic()
        assert site.request("POST", "/api/plurks", writer, json={"content": "an event over HTTP/2"}).status_code == 201
        second = read_event(curl.stdout.readline)
        arrived = time.monotonic() - posted
        assert second["data"] == '{"count":1}' and second["id"] != first["id"], second
        assert arrived < 1.5, f"the event took {arrived:.2f} s through the balancer over HTTP/2"
    finally:
        curl.kill()
        curl.wait()


def test_held_polls_on_one_http2_connection_count_against_the_per_address_cap(site):
    """Many requests on one HTTP/2 connection are capped as many connections: the balancer sends
    each to the web host on its own, and the web host's limit_conn counts them per client
    address (a client behind the balancer: 203.0.113.7, as the balancer's X-Forwarded-For says)."""
    _, reader = _pair(site)
    etag = _warm_etag(site, reader)
    urls = [f"{site.base_url}/Poll/getUnreadCount?h2={i}" for i in range(PER_ADDRESS + 1)]
    done = subprocess.run(_curl_h2(site, reader, "-H", "Prefer: wait=3", "-H", f"If-None-Match: {etag}",
                                   "-H", "X-Forwarded-For: 203.0.113.7", "--parallel", "--parallel-max", "10",
                                   *[a for _ in urls for a in ("-o", "/dev/null")],
                                   "-w", "%{http_code} %{http_version} %{num_connects} %header{retry-after}\n", *urls),
                          capture_output=True, text=True, timeout=60)
    answers = sorted(line.split() for line in done.stdout.splitlines())
    assert len(answers) == PER_ADDRESS + 1, done.stdout + done.stderr
    assert [a[:2] for a in answers] == [["304", "2"]] * PER_ADDRESS + [["429", "2"]], answers
    assert [a for a in answers if a[0] == "429"][0][3] == "5", answers          # Retry-After
    assert sum(int(a[2]) for a in answers) == 1, answers                        # one connection
