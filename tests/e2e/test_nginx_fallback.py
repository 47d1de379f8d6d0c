"""The rendered nginx config itself: polls fall back from fastpath to Django with method and
body intact, whether fastpath is down (502) or answers a miss (404).

Django is replaced here by a small recording HTTP server, only so the test can see exactly what
nginx forwarded; the end-to-end tests in test_stack.py do the same through the real Django.
"""
import json
import os
import subprocess
from http.server import BaseHTTPRequestHandler

import pytest
import requests

from plurksite import nginxconf, services
from tests.support.stack import nginx_in_front_of, stack_config


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen = []

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        record = {"method": self.command, "path": self.path, "body": body.decode("latin-1"),
                  "xff": self.headers.get("X-Forwarded-For"), "host": self.headers.get("Host")}
        Recorder.seen.append(record)
        out = json.dumps(record).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Cache", "MISS")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = _answer

    def do_HEAD(self):
        Recorder.seen.append({"method": self.command, "path": self.path})
        self.send_response(200)
        self.send_header("X-Cache", "MISS")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def nginx_with_recorder(tmp_path):
    config = stack_config(tmp_path)
    with nginx_in_front_of(config, {config.django: Recorder}):
        Recorder.seen.clear()
        yield config


def test_rendered_config_has_no_placeholders(tmp_path):
    config = stack_config(tmp_path)
    text = open(nginxconf.render(config)).read()
    assert "{{" not in text and "}}" not in text
    assert f"listen 127.0.0.1:{config.http[1]}" in text
    assert "error_page 404 502 503 504 = @plurk_django;" in text
    services.nginx_test(os.path.join(config.var_dir, "nginx.conf"), config.var_dir)


def test_render_rejects_unknown_placeholder():
    with pytest.raises(KeyError, match="nope"):
        nginxconf.render_text("x {{ nope }} y", {})


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_fallback_when_fastpath_is_down_keeps_method_and_body(nginx_with_recorder, method):
    base = nginx_with_recorder.base_url
    body = "cursor=42&x=" + "y" * 5000 if method == "POST" else None
    resp = requests.request(method, base + "/Poll/getMessages?q=1", data=body, timeout=5,
                            headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert resp.status_code == 200
    record = resp.json()
    assert record["method"] == method
    assert record["path"] == "/Poll/getMessages?q=1"
    assert record["body"] == (body or "")
    assert record["xff"] == "127.0.0.1"
    assert record["host"] == f"127.0.0.1:{nginx_with_recorder.http[1]}"


def test_fallback_on_fastpath_miss_keeps_body(nginx_with_recorder, memcached, tmp_path):
    """Real fastpath, empty memcached: fastpath says 404, nginx resends the POST to 'Django'."""
    from fastpoll import tokens
    from fastpoll.secret import ensure_secret
    import dataclasses
    import time

    config = dataclasses.replace(nginx_with_recorder, memcached=((memcached.host, memcached.port),))
    key = ensure_secret(config.secret_file)
    log = tmp_path / "fastpath.log"
    proc = subprocess.Popen(services.fastpath_command(config), stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            services.wait_for_port(*config.fastpath, process=proc, name="fastpath")
        except services.ServiceError as exc:
            raise AssertionError(f"{exc}: {log.read_text()[-2000:]}") from None
        token = tokens.sign(key, 7, 0, int(time.time()) + 60)
        body = json.dumps({"hello": "world", "pad": "z" * 3000})
        resp = requests.post(config.base_url + "/Poll/getUnreadCount", data=body, timeout=5,
                             headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["body"] == body
        assert resp.json()["method"] == "POST"
        assert resp.headers["X-Cache"] == "MISS"
        # HEAD is a read Django answers (fastpath says 404 MISS to it), not a 405
        head = requests.head(config.base_url + "/Poll/getUnreadCount", timeout=5,
                             headers={"Authorization": f"Bearer {token}"})
        assert head.status_code == 200 and head.headers["X-Cache"] == "MISS"
        assert Recorder.seen[-1] == {"method": "HEAD", "path": "/Poll/getUnreadCount"}
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(timeout=10)


@pytest.fixture
def nginx_alone(tmp_path):
    """The rendered config with nothing behind it: Django and fastpath are closed ports."""
    config = stack_config(tmp_path)
    conf = nginxconf.render(config, worker_processes=1)
    proc = subprocess.Popen(services.nginx_command(conf, config.var_dir),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        services.wait_for_port(*config.http, process=proc, name="nginx")
        yield config
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _json_error(resp, status):
    assert resp.status_code == status, resp.text
    assert resp.headers["Content-Type"] == "application/json"
    assert "error" in resp.json()


@pytest.mark.parametrize("method, path", [("GET", "/api/me"), ("POST", "/api/plurks"),
                                          ("GET", "/Poll/getUnreadCount"), ("POST", "/Poll/getMessages")])
def test_django_down_is_a_json_502(nginx_alone, method, path):
    """Also after a /Poll/ fallback (fastpath down too): recursive_error_pages."""
    resp = requests.request(method, nginx_alone.base_url + path, data="{}", timeout=5)
    _json_error(resp, 502)


def test_nginx_own_limits_answer_json(nginx_with_recorder):
    base = nginx_with_recorder.base_url
    limit = nginx_with_recorder.max_body_bytes
    for path in ("/api/plurks", "/Poll/getMessages"):
        _json_error(requests.post(base + path, data=b"x" * (limit + 1), timeout=5), 413)
        _json_error(requests.get(base + path + "?q=" + "a" * 9000, timeout=5), 414)
        _json_error(requests.get(base + path, headers={"X-Big": "b" * 9000}, timeout=5), 400)
    # nginx's other refusals, and its internal error locations asked for from outside
    _json_error(requests.request("TRACE", base + "/api/me", timeout=5), 405)
    _json_error(requests.post(base + "/api/plurks", data=b"x", headers={"Transfer-Encoding": "gzip"},
                              timeout=5), 501)
    _json_error(requests.get(base + "/_plurk_error/502", timeout=5), 404)
    import socket
    with socket.create_connection(("127.0.0.1", nginx_with_recorder.http[1]), timeout=5) as sock:
        sock.sendall(b"GET /api/me HTTP/2.0\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 505 ") and b"application/json" in answer and answer.endswith(b"}")
    # within the limit the body reaches Django whole
    resp = requests.post(base + "/api/plurks", data=b"y" * limit, timeout=5)
    assert resp.status_code == 200 and len(resp.json()["body"]) == limit
