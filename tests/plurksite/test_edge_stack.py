"""The edge through a real stack started as `make run` starts it (manage.py runstack): the page
learns the edge's URL, a poll there with the page's cookie and Origin is answered by fastpath
with CORS headers, a miss is a 409 that sends the page to the site once, after which the edge
answers HIT (docs/contract.md section 10, docs/deploy.md "The edge")."""
import os
import re
import signal
import threading
import time

import pytest
import requests
from pymemcache.client.hash import HashClient

from plurksite.config import format_hostport
from tests.support.stack import manage, output_until, stack_config, start_runstack

pytestmark = pytest.mark.slow

PASSWORD = "secret-pass-1"


@pytest.fixture(scope="module")
def runstack(tmp_path_factory):
    """`manage.py runstack` (what `make run` ends in) on free ports: (config, its output so far)."""
    config = stack_config(tmp_path_factory.mktemp("edge"), PLURK_GUNICORN_WORKERS="1")
    manage(config, "migrate", "--noinput", "-v", "0")
    proc = start_runstack(config, start_new_session=True)
    try:
        output = output_until(proc, "Press Ctrl-C", 120)
        assert "The stack is up." in output, output
        yield config, output
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=60)


def _edge_url(config):
    return f"http://{format_hostport(*config.edge)}"


def _browser(config, prefix):
    """A requests.Session that signed up as a browser does: it holds the page's poll cookie
    (host-only, so it goes to the edge's port of the same host too, as in a browser)."""
    session = requests.Session()
    name = f"{prefix}{os.urandom(4).hex()}"
    resp = session.post(f"{config.base_url}/api/signup", json={"username": name, "password": PASSWORD}, timeout=10)
    assert resp.status_code == 201, resp.text
    assert "plurk_token" in session.cookies
    return session, name, resp.json()["token"]


def _post(config, token, text):
    resp = requests.post(f"{config.base_url}/api/plurks", json={"content": text},
                         headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert resp.status_code == 201, resp.text


def _follow(config, token, name):
    resp = requests.post(f"{config.base_url}/api/follow", json={"username": name},
                         headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert resp.status_code in (200, 201), resp.text


def _cors(resp, origin):
    return (resp.headers.get("Access-Control-Allow-Origin"), resp.headers.get("Access-Control-Allow-Credentials"),
            resp.headers.get("Vary"))


def test_runstack_prints_the_edge_and_the_page_carries_it(runstack):
    config, output = runstack
    edge = _edge_url(config)
    assert f"  edge    {edge}  " in output, output
    session, _, _ = _browser(config, "page")
    page = session.get(config.base_url + "/", timeout=10)
    assert page.status_code == 200
    assert re.search(rf'<body [^>]*data-edge-url="{re.escape(edge)}"', page.text), page.text
    # the page's script may fetch the edge (CSP connect-src), and nothing else new
    assert page.headers["Content-Security-Policy"].endswith(f"; connect-src 'self' {edge}")


def test_a_preflight_from_the_site_is_allowed_and_one_from_elsewhere_is_not(runstack):
    config, _ = runstack
    origin = config.base_url
    ok = requests.options(_edge_url(config) + "/Poll/getUnreadCount", timeout=10,
                          headers={"Origin": origin, "Access-Control-Request-Method": "GET"})
    assert ok.status_code == 204
    assert _cors(ok, origin) == (origin, "true", "Origin")
    assert "Prefer" in ok.headers["Access-Control-Allow-Headers"]
    refused = requests.options(_edge_url(config) + "/Poll/getUnreadCount", timeout=10,
                               headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"})
    assert refused.status_code == 403 and "Access-Control-Allow-Origin" not in refused.headers


@pytest.fixture
def follower(runstack):
    """(config, the edge's poll URL, a writer's token, the browser session of a reader who
    follows the writer): both signed up as browsers do."""
    config, _ = runstack
    _, writer, writer_token = _browser(config, "w")
    reader, _, reader_token = _browser(config, "r")
    _follow(config, reader_token, writer)
    return config, _edge_url(config) + "/Poll/getUnreadCount", writer_token, reader


def test_the_edge_answers_with_the_page_cookie_then_a_miss_sends_the_page_to_the_site_once(follower):
    config, edge, writer_token, reader = follower
    origin = config.base_url
    _post(config, writer_token, "through the edge")

    hit = reader.get(edge, headers={"Origin": origin}, timeout=10)
    assert (hit.status_code, hit.headers.get("X-Cache")) == (200, "HIT"), hit.text
    assert hit.json() == {"count": 1}
    assert _cors(hit, origin) == (origin, "true", "Origin")
    assert "X-Cache" in hit.headers["Access-Control-Expose-Headers"]

    # the answer leaves the cache: the edge does not ask Django, it sends the page to the site
    _, uid, epoch, _, _ = reader.cookies["plurk_token"].split(".")
    cache = HashClient(config.memcached_specs, connect_timeout=1, timeout=1, default_noreply=False)
    try:
        assert cache.delete(f"p1:getUnreadCount:{uid}:{epoch}")
    finally:
        cache.close()
    miss = reader.get(edge, headers={"Origin": origin}, timeout=10)
    assert (miss.status_code, miss.headers.get("X-Cache")) == (409, "MISS"), miss.text
    assert miss.json()["retry"] == "site"
    assert _cors(miss, origin) == (origin, "true", "Origin")      # readable by the page

    site = reader.get(config.base_url + "/Poll/getUnreadCount", timeout=10)   # nginx -> fastpath -> Django
    assert (site.status_code, site.headers.get("X-Cache")) == (200, "MISS")
    again = reader.get(edge, headers={"Origin": origin}, timeout=10)
    assert (again.status_code, again.headers.get("X-Cache")) == (200, "HIT")
    assert again.content == site.content

    # no cookie: fastpath's own 401, as on the poll listener, readable by the page
    anonymous = requests.get(edge, headers={"Origin": origin}, timeout=10)
    assert anonymous.status_code == 401 and _cors(anonymous, origin) == (origin, "true", "Origin")


def test_a_long_poll_held_by_the_edge_wakes_on_a_post(follower):
    config, edge, writer_token, reader = follower
    origin = config.base_url
    first = reader.get(edge, headers={"Origin": origin}, timeout=10)
    assert (first.status_code, first.headers.get("X-Cache")) == (204, "HIT"), first.text
    etag = first.headers["ETag"]

    timer = threading.Timer(1.0, _post, (config, writer_token, "wake up"))
    timer.start()
    started = time.monotonic()
    try:
        held = reader.get(edge, headers={"Origin": origin, "Prefer": "wait=20", "If-None-Match": etag}, timeout=30)
    finally:
        timer.join()
    assert held.status_code == 200 and held.json() == {"count": 1}, held.text
    assert time.monotonic() - started < 10          # woken by the notice, not the end of the hold
    assert held.headers.get("Access-Control-Allow-Origin") == origin


def test_the_runner_refuses_an_edge_port_in_use_with_one_line(tmp_path):
    import socket

    from plurksite.services import ServiceError
    from plurksite.stack import Stack

    config = stack_config(tmp_path)
    with socket.socket() as holder:
        holder.bind(config.edge)
        holder.listen()
        with pytest.raises(ServiceError) as refused:
            Stack(config, nginx_workers=1).preflight()
    assert str(refused.value) == (f"PLURK_EDGE {format_hostport(*config.edge)} is already in use (another runstack?); "
                                  f"stop it or set PLURK_EDGE")
