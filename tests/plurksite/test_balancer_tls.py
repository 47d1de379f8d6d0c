"""The balancer over TLS (issue 32): a certificate in <var dir>/tls/ turns on https with modern
settings only, and plain HTTP redirects.  A real nginx on loopback with a stand-in web host and a
certificate of a CA made here (plurksite.cluster.tls, as `make cluster` makes them); the whole
site over https is tests/cluster/test_tls.py."""
import contextlib
import http.client
import json
import os
import socket
import ssl
import subprocess
import threading
import time

import pytest
import requests

from plurksite import nginxconf, services
from plurksite.cluster import tls
from plurksite.config import ConfigError, StackConfig
from plurksite.services import ServiceError, free_port
from plurksite.stack import Stack
from tests.plurksite.test_roles import _Recorder, _web_addresses
from tests.support.stack import manage, nginx_in_front_of

HOST = "127.0.0.10"


def _config(var_dir, web_hosts, edges=None):
    """A balancer on HOST before ``web_hosts`` (and their ``edges``: PLURK_WEB_EDGES)."""
    env = {"PLURK_ROLES": "balancer", "PLURK_HTTP": f"{HOST}:{free_port(HOST)}",
           "PLURK_WEB_HOSTS": ",".join(f"{h}:{p}" for h, p in web_hosts), "PLURK_VAR_DIR": str(var_dir),
           "PLURK_SECRET_FILE": os.path.join(var_dir, "secret.key")}
    if edges is not None:
        env["PLURK_WEB_EDGES"] = ",".join(f"{h}:{p}" for h, p in edges)
    return StackConfig.from_env(env)


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return str(tmp_path_factory.mktemp("ca"))


def _with_certificate(var_dir, ca_dir):
    return tls.ensure_site(os.path.join(var_dir, nginxconf.TLS_DIR), ca_dir, [f"IP:{HOST}", "DNS:plurk.test"])


class Web(_Recorder):
    """The stand-in web host: what reached it, and a stream of two events (the second sent only
    once the client has the first, which it cannot if anything between buffers); /held answers
    only once HELD requests are there at once (held polls)."""
    seen = []
    first_read = threading.Event()
    held = threading.Barrier(3, timeout=10)

    def do_GET(self):
        if self.path.startswith("/held"):
            return self._held()
        if self.path != "/stream":
            return self._answer()
        type(self).seen.append({"path": self.path, "proto": self.headers.get("X-Forwarded-Proto"),
                                "host": self.headers.get("Host")})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("X-Accel-Buffering", "no")        # as fastpath's stream (the web host passes it on)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event, wait in ((b"data: 1\n\n", True), (b"data: 2\n\n", False)):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
            if wait:
                type(self).first_read.wait(10)
        self.wfile.write(b"0\r\n\r\n")

    def _held(self):
        try:
            type(self).held.wait()
            status = 200
        except threading.BrokenBarrierError:
            status = 504
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture(scope="module")
def balancer(tmp_path_factory, ca):
    """A TLS balancer on HOST (https on a free port standing for 443) before one stand-in web host."""
    var_dir = tmp_path_factory.mktemp("balancer")
    _with_certificate(str(var_dir), ca)
    hosts = _web_addresses(1)
    config = _config(var_dir, hosts)
    with tls_balancer(config, {hosts[0]: Web}) as https_port:
        yield config, https_port


@contextlib.contextmanager
def tls_balancer(config, handlers, edge_port=None):
    """nginx as ``config``'s balancer before the stand-ins ``handlers`` ({address: handler
    class}), its https on a free port of HOST standing for 443, and its TLS edge (with
    ``edge_port``) there standing for 8443: the https port, once nginx accepts (on the edge's
    port, with one)."""
    https_port = free_port(HOST)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nginxconf, "HTTPS_PORT", https_port)
        if edge_port is not None:
            mp.setattr(nginxconf, "EDGE_TLS_PORT", edge_port)
        with nginx_in_front_of(config, handlers):
            if edge_port is None:
                services.wait_for_port(HOST, https_port, name="nginx https")
            else:
                services.wait_for_port(HOST, edge_port, name="nginx's TLS edge")
            yield https_port


def _client(ca, **versions):
    context = ssl.create_default_context(cafile=os.path.join(ca, "ca.crt"))
    for key, value in versions.items():
        setattr(context, key, value)
    return context


def test_https_is_served_with_the_sites_certificate_and_http_redirects(balancer, ca):
    config, port = balancer
    Web.seen.clear()
    got = requests.get(f"https://{HOST}:{port}/Poll/getUnreadCount?x=1", verify=os.path.join(ca, "ca.crt"),
                       timeout=10)
    assert got.status_code == 200
    assert Web.seen[-1]["path"] == "/Poll/getUnreadCount?x=1"
    plain = requests.get(f"{config.base_url}/api/timeline?limit=5", allow_redirects=False, timeout=10)
    assert plain.status_code == 301
    assert plain.headers["Location"] == f"https://{HOST}:{port}/api/timeline?limit=5"
    assert len(Web.seen) == 1                               # the plain request never reached a web host
    with pytest.raises(requests.exceptions.SSLError):      # the CA is what makes it trusted
        requests.get(f"https://{HOST}:{port}/", timeout=10, verify=True)


def test_a_stream_is_not_buffered_over_tls(balancer, ca):
    _, port = balancer
    Web.first_read.clear()
    conn = http.client.HTTPSConnection(HOST, port, timeout=10, context=_client(ca))
    try:
        conn.request("GET", "/stream", headers={"Accept": "text/event-stream"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("X-Accel-Buffering") is None
        started = time.monotonic()
        assert resp.readline() == b"data: 1\n"             # before the web host sends anything more
        assert time.monotonic() - started < 5
        Web.first_read.set()
        assert resp.read() == b"\ndata: 2\n\n"
    finally:
        conn.close()
    assert Web.seen[-1] == {"path": "/stream", "proto": "https", "host": f"{HOST}:{port}"}


def _handshake(port, context):
    with socket.create_connection((HOST, port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=HOST) as sock:
            return sock.version(), sock.cipher()[0], sock.session


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")     # offered to be refused
def test_only_tls_1_2_and_1_3_with_forward_secret_aead_ciphers_and_no_tickets(balancer, ca):
    _, port = balancer
    assert _handshake(port, _client(ca, maximum_version=ssl.TLSVersion.TLSv1_3))[0] == "TLSv1.3"
    version, cipher, session = _handshake(port, _client(ca, maximum_version=ssl.TLSVersion.TLSv1_2))
    assert version == "TLSv1.2" and cipher in ("ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES128-GCM-SHA256",
                                               "ECDHE-ECDSA-CHACHA20-POLY1305")
    assert not session.has_ticket                        # ssl_session_tickets off
    for old in (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1):
        # a client willing to speak them (OpenSSL's level 0: SHA-1 handshakes), refused by nginx
        context = _client(ca, minimum_version=old, maximum_version=old)
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
        with pytest.raises(ssl.SSLError, match="TLSV1_ALERT_PROTOCOL_VERSION|UNSUPPORTED_PROTOCOL"):
            _handshake(port, context)
    for weak in ("AES128-SHA256", "ECDHE-ECDSA-AES128-SHA", "AES128-GCM-SHA256"):   # no PFS or no AEAD
        context = _client(ca, maximum_version=ssl.TLSVersion.TLSv1_2)
        context.set_ciphers(weak)
        with pytest.raises(ssl.SSLError, match="HANDSHAKE_FAILURE|NO_SHARED_CIPHER"):
            _handshake(port, context)


def test_openssl_s_client_offering_tls_1_1_is_refused(balancer):
    _, port = balancer
    offered = subprocess.run(["openssl", "s_client", "-connect", f"{HOST}:{port}", "-tls1_1",
                              "-cipher", "DEFAULT:@SECLEVEL=0"], input="", capture_output=True, text=True, timeout=20)
    assert offered.returncode != 0 and "Cipher is (NONE)" in offered.stdout, offered.stdout + offered.stderr
    accepted = subprocess.run(["openssl", "s_client", "-connect", f"{HOST}:{port}", "-tls1_2"], input="",
                              capture_output=True, text=True, timeout=20)
    assert accepted.returncode == 0 and "Protocol  : TLSv1.2" in accepted.stdout, accepted.stdout


def test_without_a_certificate_plain_http_serves_and_one_file_alone_is_named(tmp_path, ca):
    config = _config(tmp_path, [("127.0.0.21", 8080)])
    text = nginxconf.render_include(config)
    assert "ssl" not in text.replace("# plain HTTP only", "") and "plain HTTP only: no fullchain.pem" in text
    chain, key = _with_certificate(str(tmp_path), ca)
    os.unlink(key)
    with pytest.raises(ConfigError, match=f"^{chain} is there but {key} is not: put the certificate chain"):
        nginxconf.render_include(config)
    with pytest.raises(ServiceError, match=f"^{chain} is there but {key} is not"):      # runstack's one line
        Stack(config).preflight()


def test_the_certificate_is_made_once_and_again_when_it_no_longer_fits(tmp_path, ca):
    directory = str(tmp_path / "tls")
    chain, key = tls.ensure_site(directory, ca, [f"IP:{HOST}"])
    made = os.stat(chain).st_mtime_ns, open(key).read()
    assert oct(os.stat(key).st_mode & 0o777) == "0o600"
    assert tls.ensure_site(directory, ca, [f"IP:{HOST}"]) == (chain, key)
    assert (os.stat(chain).st_mtime_ns, open(key).read()) == made                  # reused
    tls.ensure_site(directory, ca, [f"IP:{HOST}", "DNS:plurk.test"])                # a new name: made again
    assert open(key).read() != made[1]
    assert subprocess.run(["openssl", "verify", "-CAfile", os.path.join(ca, "ca.crt"), chain],
                          capture_output=True).returncode == 0


def _acme_token(var_dir):
    """An ACME challenge's token in <var dir>/acme/, as certbot --webroot leaves it."""
    root = os.path.join(var_dir, "acme", ".well-known", "acme-challenge")
    os.makedirs(root, exist_ok=True)
    path = os.path.abspath(var_dir)                 # nginx's workers (nobody, as root) read the token
    while path not in ("/", "/tmp"):
        os.chmod(path, os.stat(path).st_mode | 0o001)
        path = os.path.dirname(path)
    for d in ("acme", "acme/.well-known", "acme/.well-known/acme-challenge"):
        os.chmod(os.path.join(var_dir, d), 0o755)
    with open(os.path.join(root, "tok3n"), "w") as fh:
        fh.write("tok3n.key-authorization")
    os.chmod(os.path.join(root, "tok3n"), 0o644)


def test_plain_http_serves_only_an_acme_challenge_from_the_var_dir(balancer):
    config, port = balancer
    _acme_token(config.var_dir)
    got = requests.get(f"{config.base_url}/.well-known/acme-challenge/tok3n", allow_redirects=False, timeout=10)
    assert (got.status_code, got.text) == (200, "tok3n.key-authorization")
    other = requests.get(f"{config.base_url}/.well-known/other", allow_redirects=False, timeout=10)
    assert other.status_code == 301


def test_the_first_certificate_comes_by_the_acme_webroot_before_there_is_one(tmp_path):
    """Without a certificate the balancer serves plain HTTP, and the ACME challenge already from
    <var dir>/acme/ (certbot --webroot gets the first certificate): not passed to a web host,
    whose Django would answer it 404; every other path still is."""
    web = _web_addresses(1)
    config = _config(tmp_path, web)
    assert nginxconf.site_tls(config) is None
    _acme_token(config.var_dir)
    Web.seen.clear()
    with nginx_in_front_of(config, {web[0]: Web}):
        got = requests.get(f"{config.base_url}/.well-known/acme-challenge/tok3n", allow_redirects=False, timeout=10)
        assert (got.status_code, got.text) == (200, "tok3n.key-authorization")
        missing = requests.get(f"{config.base_url}/.well-known/acme-challenge/nope", allow_redirects=False,
                               timeout=10)
        assert missing.status_code == 404
        assert not Web.seen                                 # neither reached the web host
        page = requests.get(f"{config.base_url}/login", allow_redirects=False, timeout=10)
        assert page.status_code == 200 and [r["path"] for r in Web.seen] == ["/login"]


def test_tls_1_3_offers_no_finite_field_groups(balancer, ca):
    """ffdhe2048-8192 cost the server ~100 ms of CPU a handshake: elliptic curves only."""
    _, port = balancer
    def offer(groups):
        return subprocess.run(["openssl", "s_client", "-connect", f"{HOST}:{port}", "-tls1_3", "-groups", groups,
                               "-CAfile", os.path.join(ca, "ca.crt")], input="", capture_output=True, text=True,
                              timeout=30)
    assert offer("ffdhe2048").returncode != 0
    assert offer("X25519").returncode == 0



def test_another_host_is_closed_not_redirected_to_its_name(balancer):
    config, _ = balancer
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{config.base_url}/x", headers={"Host": "evil.example"}, allow_redirects=False, timeout=10)


def test_plain_http_to_the_https_port_gets_a_json_400_naming_https(balancer):
    """nginx's 497 (plain HTTP on an ssl port) is the site's JSON, not nginx's HTML 400 page."""
    _, port = balancer
    with socket.create_connection((HOST, port), timeout=10) as sock:
        sock.sendall(f"GET /Poll/getUnreadCount HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode())
        sock.settimeout(10)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    assert lines[0].split(" ", 2)[1] == "400", reply[:300]
    assert headers["content-type"].startswith("application/json"), reply[:300]
    assert json.loads(body) == {"error": "plain HTTP sent to the HTTPS port: use https://"}
    assert headers.get("connection") == "close"


def _curl_h2(ca, *args):
    return ["curl", "-sS", "--http2", "--cacert", os.path.join(ca, "ca.crt"), *args]


def test_http2_carries_a_stream_unbuffered_and_held_requests_side_by_side_on_one_connection(balancer, ca):
    """HTTP/2 at the https port (browsers allow 6 HTTP/1.1 connections a site: tabs with a
    stream each would block each other); each stream is a request of its own upstream."""
    _, port = balancer
    Web.first_read.clear()
    curl = subprocess.Popen(_curl_h2(ca, "-N", "-w", "%{http_version}\n", f"https://{HOST}:{port}/stream"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        started = time.monotonic()
        assert curl.stdout.readline() == b"data: 1\n"        # before the web host sends anything more
        assert time.monotonic() - started < 5
        Web.first_read.set()
        out = curl.stdout.read()
        assert curl.wait(timeout=10) == 0, curl.stderr.read()
    finally:
        curl.kill()
        curl.stdout.close()
        curl.stderr.close()
    assert out == b"\ndata: 2\n\n2\n", out           # the rest, and HTTP version 2
    assert Web.seen[-1] == {"path": "/stream", "proto": "https", "host": f"{HOST}:{port}"}
    # three requests held at once upstream (each answered only when all three are there), one
    # TCP connection from the client
    Web.held.reset()
    urls = [f"https://{HOST}:{port}/held?{i}" for i in range(3)]
    done = subprocess.run(_curl_h2(ca, "--parallel", "--parallel-max", "3", "-o", "/dev/null", "-o", "/dev/null",
                                   "-o", "/dev/null", "-w", "%{http_code} %{http_version} %{num_connects}\n", *urls),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 3, done.stdout + done.stderr
    answers = [line.split() for line in done.stdout.splitlines()]
    assert [a[:2] for a in answers] == [["200", "2"]] * 3, done.stdout
    assert sum(int(a[2]) for a in answers) == 1, done.stdout      # one connection for the three


def test_plain_http_to_the_https_port_is_the_json_400_with_http2_on(balancer):
    """The listen line says http2: plain HTTP/1.1 there is still nginx's 497, answered as JSON."""
    _, port = balancer
    got = requests.get(f"http://{HOST}:{port}/login", timeout=10)
    assert got.status_code == 400 and got.json() == {"error": "plain HTTP sent to the HTTPS port: use https://"}


def test_a_balancer_told_https_without_a_certificate_refuses_in_one_line(tmp_path):
    """PLURK_HTTPS=1 (cluster.env is shared) and no certificate in <var>/tls: plain HTTP would
    serve the login page unencrypted and browsers would drop the web hosts' Secure cookies."""
    config = StackConfig.from_env({"PLURK_ROLES": "balancer", "PLURK_HTTP": "127.0.0.10:8080",
                                   "PLURK_WEB_HOSTS": "127.0.0.21:8080", "PLURK_VAR_DIR": str(tmp_path / "var"),
                                   "PLURK_SECRET_FILE": str(tmp_path / "secret.key"), "PLURK_HTTPS": "1"})
    assert nginxconf.site_tls(config) is None            # no certificate there
    done = manage(config, "rendernginx", check=False)
    assert done.returncode != 0, "rendered plain HTTP for a site told it is https"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "PLURK_HTTPS" in lines[0] and "fullchain.pem" in lines[0], done.stderr
