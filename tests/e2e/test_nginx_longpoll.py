"""The rendered nginx config routes long-polls (docs/contract.md section 7, docs/web.md): a poll
with `Prefer: wait=N` goes to fastpath with a read timeout above fastpath's max wait and falls
back to Django only on 404/502/503, never on 504; Prefer and If-None-Match reach fastpath.

fastpath and Django are small recording HTTP servers here, so the test sees exactly what nginx
forwarded and can make "fastpath" slow or answer any status.
"""
import json
import time
from http.server import BaseHTTPRequestHandler

import pytest
import requests

from plurksite import nginxconf, services
from tests.support.stack import nginx_in_front_of, stack_config


def _recorder(who, seen):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            record = {"who": who, "method": self.command, "path": self.path, "body": body.decode("latin-1"),
                      "prefer": self.headers.get("Prefer"), "inm": self.headers.get("If-None-Match")}
            seen.append(record)
            status = 200
            if who == "fastpath":
                if "/slow" in self.path:
                    time.sleep(2.5)           # longer than the short-poll read timeout (1 s)
                for word, code in (("/miss", 404), ("/down", 503), ("/gateway", 504), ("/same", 304)):
                    if word in self.path:
                        status = code
            self.send_response(status)
            self.send_header("X-Cache", "HIT" if who == "fastpath" else "MISS")
            if record["prefer"] and who == "fastpath":
                self.send_header("Preference-Applied", "wait=30")
            if status == 304:
                self.send_header("ETag", '"abc"')
                self.end_headers()
                return
            out = json.dumps(record).encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    return Handler


@pytest.fixture
def nginx_with_fakes(tmp_path):
    config = stack_config(tmp_path, PLURK_LONGPOLL_MAX_WAIT_S="5")
    seen = []
    with nginx_in_front_of(config, {config.django: _recorder("django", seen),
                                    config.fastpath: _recorder("fastpath", seen)}):
        yield config, seen


def test_the_long_poll_read_timeout_follows_the_max_wait(tmp_path):
    text = open(nginxconf.render(stack_config(tmp_path, PLURK_LONGPOLL_MAX_WAIT_S="40"))).read()
    assert "proxy_read_timeout 55s;" in text          # 40 + 15
    assert "worker_rlimit_nofile 20000;" in text       # the machine's hard limit per process


def test_every_client_a_worker_carries_may_keep_its_upstream_connection(tmp_path):
    text = open(nginxconf.render(stack_config(tmp_path))).read()
    assert "worker_connections 19000;" in text
    # a fan-out answers thousands of held polls at once: 1,024 kept closed the rest on both sides
    assert "keepalive 9500;" in text and "keepalive 1024;" not in text


@pytest.mark.parametrize("prefer", ["wait=30", "respond-async, wait=30", "handling=lenient,wait = 30", "WAIT=30"])
def test_a_long_poll_is_held_by_fastpath_not_cut_after_a_second(nginx_with_fakes, prefer):
    config, seen = nginx_with_fakes
    resp = requests.get(config.base_url + "/Poll/slow?cursor=1", timeout=20,
                        headers={"Prefer": prefer, "If-None-Match": '"abc"'})
    assert resp.status_code == 200
    assert resp.headers["X-Cache"] == "HIT"
    assert resp.headers["Preference-Applied"] == "wait=30"
    assert [r["who"] for r in seen] == ["fastpath"]
    assert seen[0]["path"] == "/Poll/slow?cursor=1"
    assert seen[0]["prefer"] == prefer and seen[0]["inm"] == '"abc"'


@pytest.mark.parametrize("prefer", [None, "handling=strict", "respond-async; wait=30", "nowait=30"])
def test_a_slow_short_poll_still_falls_back_after_a_second(nginx_with_fakes, prefer):
    """Without a wait preference (a `;wait=` is a parameter of another one) nothing changes."""
    config, seen = nginx_with_fakes
    resp = requests.get(config.base_url + "/Poll/slow", timeout=20, headers={"Prefer": prefer} if prefer else {})
    assert resp.status_code == 200 and resp.headers["X-Cache"] == "MISS"
    assert [r["who"] for r in seen] == ["fastpath", "django"]


def test_if_none_match_reaches_fastpath_and_its_304_reaches_the_client(nginx_with_fakes):
    config, seen = nginx_with_fakes
    resp = requests.get(config.base_url + "/Poll/same", timeout=5, headers={"If-None-Match": '"abc"'})
    assert resp.status_code == 304 and resp.headers["ETag"] == '"abc"'
    assert [(r["who"], r["inm"]) for r in seen] == [("fastpath", '"abc"')]


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("where", ["/Poll/miss", "/Poll/down"])
def test_a_long_poll_miss_falls_back_to_django_with_body_and_headers(nginx_with_fakes, method, where):
    config, seen = nginx_with_fakes
    body = "cursor=42&x=" + "y" * 3000 if method == "POST" else None
    resp = requests.request(method, config.base_url + where + "?q=1", data=body, timeout=5,
                            headers={"Prefer": "wait=30", "If-None-Match": 'W/"abc"'})
    assert resp.status_code == 200 and resp.headers["X-Cache"] == "MISS"
    assert "Preference-Applied" not in resp.headers
    django = resp.json()
    assert (django["who"], django["method"], django["path"]) == ("django", method, where + "?q=1")
    assert django["body"] == (body or "")
    assert django["prefer"] == "wait=30" and django["inm"] == 'W/"abc"'


def test_a_long_poll_that_times_out_never_reaches_django(nginx_with_fakes):
    """A 504 (here fastpath's own; nginx's read timeout is max wait + 15 s) is answered as JSON:
    a hold must never land on Django's few workers."""
    config, seen = nginx_with_fakes
    resp = requests.get(config.base_url + "/Poll/gateway", timeout=5, headers={"Prefer": "wait=30"})
    assert resp.status_code == 504 and resp.json() == {"error": "backend timed out"}
    assert [r["who"] for r in seen] == ["fastpath"]


def test_the_internal_long_poll_location_is_not_public(nginx_with_fakes):
    config, seen = nginx_with_fakes
    resp = requests.get(config.base_url + "/_plurk_wait/Poll/getMessages", timeout=5)
    assert resp.status_code != 200 or resp.json()["who"] == "django"
    assert all(r["who"] == "django" for r in seen)
