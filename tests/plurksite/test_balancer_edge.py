"""The edge over TLS at the balancer (issue 32 item 2): with PLURK_WEB_EDGES and its certificate,
the balancer's nginx terminates TLS in a ``stream {}`` (nginx/balancer-edge.conf.template) before
the web hosts' edges.  A real nginx on loopback, stand-in edges that record what reached them and
a certificate of a CA made here; through the cluster with fastpath's own edges:
tests/cluster/test_tls.py."""
import os
import socket
import ssl
import threading
import time

import pytest

from plurksite import nginxconf, services
from plurksite.config import ConfigError, StackConfig
from plurksite.services import ServiceError, fastpath_command, free_port
from plurksite.stack import Stack
from tests.plurksite.test_balancer_tls import (HOST, _client, _config, _with_certificate, ca,  # noqa: F401 (ca: the fixture)
                                              tls_balancer)
from tests.plurksite.test_roles import _Recorder, _web_addresses
from tests.support.stack import stack_config

class Edge(_Recorder):
    """A stand-in web host's edge: records who answered; /stream sends two events, the second
    only once the client has read the first (which it cannot if the balancer buffers)."""
    seen = []
    first_read = threading.Event()

    def do_GET(self):
        type(self).seen.append({"at": self.server.server_address, "peer": self.client_address[0],
                                "path": self.path})
        if self.path != "/Poll/stream":
            body = b'{"count": 1}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.close_connection = True
        self.wfile.write(b"event: e\ndata: 1\n\n")
        self.wfile.flush()
        type(self).first_read.wait(10)
        self.wfile.write(b"event: e\ndata: 2\n\n")
        self.wfile.flush()


@pytest.fixture(scope="module")
def balancer(tmp_path_factory, ca):
    """A TLS balancer on HOST before one stand-in web host and two stand-in edges; its TLS edge
    on a free port standing for 8443."""
    var_dir = tmp_path_factory.mktemp("balancer")
    _with_certificate(str(var_dir), ca)
    web = _web_addresses(1)
    edges = _web_addresses(2)
    config = _config(var_dir, web, edges)
    edge_port = free_port(HOST)
    with tls_balancer(config, {web[0]: _Recorder, edges[0]: Edge, edges[1]: Edge}, edge_port):
        yield config, edge_port, edges


def _get(port, context, path="/Poll/getUnreadCount", source=None):
    raw = socket.create_connection((HOST, port), timeout=10, source_address=(source, 0) if source else None)
    with context.wrap_socket(raw, server_hostname=HOST) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data, sock.version(), sock.session


def test_the_stream_block_is_rendered_only_for_a_balancer_with_edges(tmp_path, ca):
    _with_certificate(str(tmp_path), ca)
    edges = [("10.77.0.21", 8003), ("10.77.0.22", 8003)]
    text = nginxconf.render_full(_config(tmp_path, [("10.77.0.21", 8080)], edges))
    stream = text[text.index("\nstream {"):]
    assert text.index("load_module ") < text.index("events {")                   # main level, first
    assert "hash $remote_addr consistent;" in stream
    assert all(f"server {h}:{p} max_fails=" in stream for h, p in edges)
    assert f"listen {HOST}:{nginxconf.EDGE_TLS_PORT} ssl" in stream
    for line in ("ssl_protocols TLSv1.2 TLSv1.3;", "ssl_session_tickets off;", "proxy_buffer_size 4k;",
                 "proxy_timeout 75s;"):                  # 55 s long-poll + the balancer's 20 s margin
        assert line in stream
    assert "stream {" not in nginxconf.render_include(_config(tmp_path, [("10.77.0.21", 8080)], edges))
    plain = nginxconf.render_full(_config(tmp_path, [("10.77.0.21", 8080)], []))
    assert "\nstream {" not in plain and "load_module" not in plain


def test_edges_without_a_certificate_or_on_a_web_host_or_without_the_module_are_one_line(tmp_path):
    config = _config(tmp_path, [("127.0.0.21", 8080)], [("127.0.0.21", 8003)])
    with pytest.raises(ConfigError, match="PLURK_WEB_EDGES is set but .*tls holds no fullchain.pem and "
                                          "privkey.pem: the balancer serves the edges over TLS only"):
        nginxconf.render_full(config)
    with pytest.raises(ServiceError, match="^PLURK_WEB_EDGES is set but"):           # runstack's one line
        Stack(config).preflight()
    with pytest.raises(ConfigError, match="^PLURK_WEB_EDGES is the balancer's"):
        stack_config(tmp_path, PLURK_WEB_EDGES="127.0.0.21:8003")
    with pytest.raises(ConfigError, match="apt-get install libnginx-mod-stream"):
        nginxconf.stream_module_line("nginx version: nginx/1.22.1 configure arguments: --with-http_ssl_module")
    assert nginxconf.stream_module_line("--with-stream --with-stream_ssl_module").startswith("# ")


def test_behind_the_balancer_the_edge_caps_users_not_the_balancers_address(tmp_path):
    config = stack_config(tmp_path, PLURK_EDGE_MAX_PER_ADDRESS="0", PLURK_MAX_HELD_PER_USER="32")
    argv = " ".join(fastpath_command(config))
    assert "--edge-max-per-address 0" in argv or "--edge-max-per-address=0" in argv, argv
    assert "--max-held-per-user 32" in argv or "--max-held-per-user=32" in argv, argv
    assert "--edge-max-per-address 64" in " ".join(fastpath_command(stack_config(tmp_path))).replace("=", " ")


def test_a_poll_over_tls_reaches_an_edge_and_a_client_sticks_to_one(balancer, ca):
    _, port, edges = balancer
    Edge.seen.clear()
    for source in ("127.0.0.51", "127.0.0.51", "127.0.0.52", "127.0.0.53", "127.0.0.54", "127.0.0.51"):
        data, version, session = _get(port, _client(ca), source=source)
        assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b'{"count": 1}'), data
        assert version == "TLSv1.3"
    # the edge sees the balancer, never the client (hence PLURK_EDGE_MAX_PER_ADDRESS=0 behind it)
    assert all(seen["path"] == "/Poll/getUnreadCount" and not seen["peer"].startswith("127.0.0.5") for seen in Edge.seen)
    by_source = [seen["at"] for seen in Edge.seen]
    assert by_source[0] == by_source[1] == by_source[5]           # 127.0.0.51's, every time
    assert {tuple(a) for a in by_source} <= {tuple(e) for e in edges}


def test_a_stream_over_tls_is_not_buffered(balancer, ca):
    _, port, _ = balancer
    Edge.first_read.clear()
    raw = socket.create_connection((HOST, port), timeout=10)
    with _client(ca).wrap_socket(raw, server_hostname=HOST) as sock:
        sock.sendall(f"GET /Poll/stream HTTP/1.1\r\nHost: {HOST}\r\nAccept: text/event-stream\r\n\r\n".encode())
        got, started = b"", time.monotonic()
        while b"data: 1\n\n" not in got:
            got += sock.recv(4096)
            assert time.monotonic() - started < 5
        assert b"data: 2" not in got
        Edge.first_read.set()
        while b"data: 2\n\n" not in got:
            chunk = sock.recv(4096)
            assert chunk, got
            got += chunk


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")     # offered to be refused
def test_only_tls_1_2_and_1_3_and_an_untrusted_certificate_is_refused(balancer, ca):
    _, port, _ = balancer
    _, version, session = _get(port, _client(ca, maximum_version=ssl.TLSVersion.TLSv1_2))
    assert version == "TLSv1.2" and not session.has_ticket             # ssl_session_tickets off
    old = _client(ca, minimum_version=ssl.TLSVersion.TLSv1_1, maximum_version=ssl.TLSVersion.TLSv1_1)
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with pytest.raises(ssl.SSLError, match="TLSV1_ALERT_PROTOCOL_VERSION|UNSUPPORTED_PROTOCOL"):
        _get(port, old)
    weak = _client(ca, maximum_version=ssl.TLSVersion.TLSv1_2)
    weak.set_ciphers("AES128-GCM-SHA256")                               # no forward secrecy
    with pytest.raises(ssl.SSLError, match="HANDSHAKE_FAILURE|NO_SHARED_CIPHER"):
        _get(port, weak)
    with pytest.raises(ssl.SSLCertVerificationError):
        _get(port, ssl.create_default_context())


def test_connections_per_client_address_are_capped_on_the_tls_edge(tmp_path, ca):
    """PLURK_HELD_PER_ADDRESS caps one address's open connections to 8443, held or idle; beyond
    it nginx closes the next before its handshake, while another address still gets a stream.
    The balancer's own 127.0.0.1 (its probes, bench/edgetls.py) is not capped."""
    _with_certificate(str(tmp_path), ca)
    web, edges = _web_addresses(1), _web_addresses(1)
    config = StackConfig.from_env(dict(_config(tmp_path, web, edges).to_env(), PLURK_HELD_PER_ADDRESS="3"))
    edge_port = free_port(HOST)
    text = nginxconf.render_edge_stream(config)
    assert "limit_conn_zone $plurk_edge_key zone=plurk_edge_conns:10m;" in text
    assert "limit_conn plurk_edge_conns 3;" in text
    off = nginxconf.render_edge_stream(StackConfig.from_env(dict(config.to_env(), PLURK_HELD_PER_ADDRESS="0")))
    assert "limit_conn_zone $" not in off and "limit_conn plurk_edge_conns" not in off

    def handshake(source=None):
        raw = socket.create_connection((HOST, edge_port), timeout=10,
                                       source_address=(source, 0) if source else None)
        return _client(ca).wrap_socket(raw, server_hostname=HOST)

    with tls_balancer(config, {web[0]: _Recorder, edges[0]: Edge}, edge_port):
        time.sleep(0.2)                 # wait_for_port's own connection is gone
        held = [handshake("127.0.0.61") for _ in range(3)]
        try:
            for _ in range(3):          # one over the cap: closed, every time
                with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                    handshake("127.0.0.61").close()
            # another address is served at once: a poll, and a stream's first event
            data, _, _ = _get(edge_port, _client(ca), source="127.0.0.62")
            assert data.startswith(b"HTTP/1.1 200 "), data
            Edge.first_read.clear()
            with handshake("127.0.0.62") as sock:
                sock.sendall(f"GET /Poll/stream HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
                got = b""
                while b"data: 1\n\n" not in got:
                    chunk = sock.recv(4096)
                    assert chunk, got
                    got += chunk
                Edge.first_read.set()
            # the balancer's own address is not capped
            local = [handshake() for _ in range(5)]
            for sock in local:
                sock.close()
        finally:
            for sock in held:
                sock.close()
        # once the held ones close, the address is served again
        time.sleep(0.3)
        data, _, _ = _get(edge_port, _client(ca), source="127.0.0.61")
        assert data.startswith(b"HTTP/1.1 200 "), data


def test_the_runner_rotates_the_edge_log_and_nginx_goes_on_logging_there(tmp_path, ca):
    """nginx-edge.log (the stream block's) is rotated past PLURK_NGINX_LOG_KB like the others:
    renamed to .1, and nginx, signalled by the runner, logs into a new one."""
    _with_certificate(str(tmp_path), ca)
    web, edges = _web_addresses(1), _web_addresses(1)
    config = StackConfig.from_env(dict(_config(tmp_path, web, edges).to_env(), PLURK_NGINX_LOG_KB="1"))
    log_path = os.path.join(config.log_dir(), "nginx-edge.log")
    edge_port = free_port(HOST)
    from http.server import ThreadingHTTPServer
    stand_ins = [ThreadingHTTPServer(web[0], _Recorder), ThreadingHTTPServer(edges[0], Edge)]
    for server in stand_ins:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    stack = Stack(config, nginx_workers=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nginxconf, "HTTPS_PORT", free_port(HOST))
        mp.setattr(nginxconf, "EDGE_TLS_PORT", edge_port)
        os.makedirs(config.log_dir(), exist_ok=True)
        stack.services = stack.build()
    nginx = stack.service("balancer")
    try:
        nginx.start()
        nginx.wait_ready()
        services.wait_for_port(HOST, edge_port, name="nginx's TLS edge")

        def logged(marker_source):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                _get(edge_port, _client(ca), source=marker_source)
                time.sleep(1.2)                     # the stream log's flush=1s
                with open(log_path) as fh:
                    if marker_source in fh.read():
                        return True
            return False

        for _ in range(12):                         # ~120 bytes a line: past 1 KiB
            _get(edge_port, _client(ca), source="127.0.0.71")
        assert logged("127.0.0.71") and os.path.getsize(log_path) >= 1024
        rotated = stack.rotate_nginx_logs()
        assert "nginx-edge.log" in rotated, rotated
        with open(log_path + ".1") as fh:
            assert "127.0.0.71" in fh.read()
        assert logged("127.0.0.72")                 # nginx reopened it: the new file gets the line
        assert "127.0.0.72" not in open(log_path + ".1").read()
    finally:
        nginx.stop()
        for server in stand_ins:
            server.shutdown()
            server.server_close()
