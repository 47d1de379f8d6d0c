"""The site and the edge over TLS at the balancer (issue 32 items 1 and 2), for real, on one
namespace cluster with one web host (PostgreSQL, 3 memcached hosts, the balancer; no client host:
this machine reaches every host through the bridge) and the certificate `make cluster` makes,
started once for the module (cluster tests run one cluster at a time: the namespaces and
addresses are fixed).

The site, through https with the cluster's CA: the page, the API, a poll, a long-poll woken by a
plurk, a stream's event; plain HTTP redirects; TLS 1.1 is refused.  The edge: the web host's
fastpath runs it on its own address and the balancer terminates TLS for it on :8443
(nginx/balancer-edge.conf.template); the page points its script there (data-edge-url), and
through https: a long-poll woken by a plurk, a stream's event, and a miss answered 409
retry:site.  The rendering and the TLS settings one by one: tests/plurksite/test_balancer_tls.py
and tests/plurksite/test_balancer_edge.py."""
import http.client
import json
import subprocess
import threading
import time

import pytest
import requests
from pymemcache.client.hash import HashClient

from plurksite.cluster import topology
from plurksite.cluster.harness import Cluster
from plurksite.config import StackConfig
from tests.support.sse import open_held_stream, read_event

pytestmark = pytest.mark.slow

SITE = topology.site_url()
EDGE = topology.edge_url()
LB = topology.balancer_address()


@pytest.fixture(scope="module")
def cluster():
    hosts = [h for h in topology.hosts(web_hosts=1) if "client" not in h.roles]
    with Cluster(hosts=hosts, seed_demo=True, ready_timeout=180) as running:
        yield running


@pytest.fixture(scope="module")
def tokens(cluster):
    """alice's and bob's tokens (seeddemo: they follow each other)."""
    got = {}
    for name in ("alice", "bob"):
        resp = requests.post(f"{SITE}/api/login", json={"username": name, "password": "plurkdemo1"},
                             verify=cluster.ca_file, timeout=30)
        assert resp.status_code == 200, resp.text
        got[name] = resp.json()["token"]
    return got


def _api(cluster, token, method, path, **kwargs):
    return requests.request(method, SITE + path, headers={"Authorization": f"Bearer {token}", **kwargs.pop("headers", {})},
                            verify=cluster.ca_file, timeout=kwargs.pop("timeout", 30), **kwargs)


def _plurk(cluster, token, text):
    resp = _api(cluster, token, "POST", "/api/plurks", json={"content": text})
    assert resp.status_code == 201, resp.text


def _fastpath_answer(cluster, token):
    """alice's count answer once fastpath has it (a miss is Django's, which fills the cache)."""
    deadline = time.monotonic() + 20
    while True:
        resp = _api(cluster, token, "GET", "/Poll/getUnreadCount")
        assert resp.status_code == 200, resp.text
        if resp.headers.get("X-Cache") == "HIT" or time.monotonic() > deadline:
            return resp
        time.sleep(0.2)


def test_the_page_over_https_by_address_and_by_name_and_http_redirects(cluster):
    page = requests.get(f"{SITE}/login", verify=cluster.ca_file, timeout=30)
    assert page.status_code == 200 and "text/html" in page.headers["Content-Type"]
    by_name = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{ssl_verify_result}",
                              "--cacert", cluster.ca_file, "--resolve", f"{topology.SITE_NAME}:443:{LB}",
                              f"https://{topology.SITE_NAME}/login"], capture_output=True, text=True, timeout=60)
    assert by_name.stdout == "200 0", by_name.stdout + by_name.stderr
    untrusted = subprocess.run(["curl", "-sS", "-o", "/dev/null", f"{SITE}/login"], capture_output=True, text=True,
                               timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert untrusted.returncode == 60, untrusted.stderr          # no CA: the certificate is refused
    plain = requests.get(f"http://{LB}/api/timeline?limit=5", allow_redirects=False, timeout=30)
    assert plain.status_code == 301 and plain.headers["Location"] == f"{SITE}/api/timeline?limit=5"


def _held_until_a_plurk(cluster, tokens, first, words, ask):
    """alice's long-poll (``ask(headers)``, holding ``first``'s ETag) is still held after 1.5 s,
    and bob's plurk wakes it within 5 s with her count one higher."""
    answer = {}

    def hold():
        answer["resp"] = ask({"Prefer": "wait=30", "If-None-Match": first.headers["ETag"]})
        answer["at"] = time.monotonic()

    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(1.5)
    assert holder.is_alive(), f"answered at once: {answer}"
    _plurk(cluster, tokens["bob"], words)
    posted = time.monotonic()
    holder.join(30)
    assert answer["resp"].status_code == 200, answer["resp"].text
    assert answer["resp"].json()["count"] == first.json()["count"] + 1
    assert answer["at"] - posted < 5


def test_the_api_a_poll_and_a_long_poll_woken_by_a_plurk(cluster, tokens):
    assert _api(cluster, tokens["alice"], "GET", "/api/me").json()["username"] == "alice"
    first = _fastpath_answer(cluster, tokens["alice"])
    assert first.headers.get("X-Cache") == "HIT", dict(first.headers)
    _held_until_a_plurk(cluster, tokens, first, "over TLS", lambda headers: _api(
        cluster, tokens["alice"], "GET", "/Poll/getUnreadCount", timeout=60, headers=headers))


def _streamed_plurk(cluster, tokens, resp, content):
    """bob plurks ``content``: alice's stream ``resp`` carries her new count within 5 s."""
    _plurk(cluster, tokens["bob"], content)
    posted = time.monotonic()
    got = read_event(resp.readline)
    assert got["event"] == "getUnreadCount" and "count" in json.loads(got["data"]), got
    assert time.monotonic() - posted < 5


def test_a_stream_delivers_an_event_through_https(cluster, tokens):
    conn, resp, last_id = open_held_stream(
        lambda: http.client.HTTPSConnection(LB, 443, timeout=30, context=cluster.ssl_context()),
        tokens["alice"], within=20)
    try:
        if last_id is None:
            read_event(resp.readline)                # fastpath's answer is the first event
        _streamed_plurk(cluster, tokens, resp, "streamed over TLS")
    finally:
        conn.close()


def test_a_browser_logs_in_and_posts_over_https_with_secure_cookies(cluster):
    """PLURK_HTTPS=1 on the web host (topology.shared_env): the CSRF cookie is Secure (the poll
    token's too, from the balancer's X-Forwarded-Proto), and a browser's login and cookie-authenticated post (Origin, the CSRF token) pass the
    CSRF check behind the https balancer (the web host trusts its X-Forwarded-Proto)."""
    browser = requests.Session()            # verify= on each request: REQUESTS_CA_BUNDLE would win
    page = browser.get(f"{SITE}/login", verify=cluster.ca_file, timeout=30)
    assert page.status_code == 200
    set_cookie = page.headers["Set-Cookie"]
    assert set_cookie.startswith("csrftoken=") and "; secure" in set_cookie.lower(), set_cookie
    csrf = {"Origin": SITE, "X-CSRFToken": browser.cookies["csrftoken"]}
    login = browser.post(f"{SITE}/api/login", json={"username": "alice", "password": "plurkdemo1"},
                         headers=csrf, verify=cluster.ca_file, timeout=30)
    assert login.status_code == 200, login.text
    cookies = {c.name: c for c in browser.cookies}
    assert {"plurk_token", "csrftoken"} <= set(cookies), cookies
    assert all(cookies[name].secure for name in ("plurk_token", "csrftoken")), cookies
    csrf["X-CSRFToken"] = browser.cookies["csrftoken"]
    posted = browser.post(f"{SITE}/api/plurks", json={"content": "from a browser over https"}, headers=csrf,
                          verify=cluster.ca_file, timeout=30)
    assert posted.status_code == 201, posted.text


def test_tls_1_1_is_refused_and_1_3_answers(cluster):
    def offer(*flags):
        return subprocess.run(["openssl", "s_client", "-connect", f"{LB}:443", "-CAfile", cluster.ca_file, *flags],
                              input="", capture_output=True, text=True, timeout=30)
    old = offer("-tls1_1", "-cipher", "DEFAULT:@SECLEVEL=0")
    assert old.returncode != 0 and "Cipher is (NONE)" in old.stdout, old.stdout + old.stderr
    new = offer("-tls1_3")
    assert new.returncode == 0 and "TLSv1.3" in new.stdout.split("Verify return code")[0] and "Verify return code: 0 (ok)" in new.stdout


def test_plain_http_to_443_is_a_json_400_and_browsers_get_http2(cluster, tokens):
    plain = requests.get(f"http://{LB}:443/api/me", timeout=30)
    assert plain.status_code == 400 and plain.json() == {"error": "plain HTTP sent to the HTTPS port: use https://"}
    h2 = subprocess.run(["curl", "-sS", "--http2", "--cacert", cluster.ca_file, "-H",
                         f"Authorization: Bearer {tokens['alice']}", "-o", "/dev/null", "-w",
                         "%{http_version} %{http_code}", f"{SITE}/Poll/getUnreadCount"],
                        capture_output=True, text=True, timeout=60)
    assert h2.stdout == "2 200", h2.stdout + h2.stderr


# ---- the edge over TLS (the balancer's :8443 before the web host's fastpath edge) ----

def _edge(cluster, token, path="/Poll/getUnreadCount", **kwargs):
    headers = {"Origin": SITE, **kwargs.pop("headers", {})}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return requests.get(EDGE + path, headers=headers, verify=cluster.ca_file, timeout=kwargs.pop("timeout", 30),
                        **kwargs)


def _edge_answer(cluster, token):
    """alice's count from the edge, once the cache has it (a miss: ask the site, come back)."""
    deadline = time.monotonic() + 20
    while True:
        resp = _edge(cluster, token)
        if resp.status_code in (200, 204):
            return resp
        assert resp.status_code == 409 and resp.json()["retry"] == "site", resp.text
        assert time.monotonic() < deadline, "the edge never had alice's count"
        requests.get(f"{SITE}/Poll/getUnreadCount", headers={"Authorization": f"Bearer {token}"},
                     verify=cluster.ca_file, timeout=30)
        time.sleep(0.3)


def test_the_page_polls_the_edge_over_tls_and_a_miss_is_409_retry_site(cluster):
    page = requests.get(f"{SITE}/login", verify=cluster.ca_file, timeout=30)
    assert f'data-edge-url="{EDGE}"' in page.text
    assert EDGE in page.headers["Content-Security-Policy"]
    preflight = requests.options(EDGE + "/Poll/getUnreadCount", verify=cluster.ca_file, timeout=30,
                                 headers={"Origin": SITE, "Access-Control-Request-Method": "GET"})
    assert preflight.status_code == 204 and preflight.headers["Access-Control-Allow-Origin"] == SITE
    carol = requests.post(f"{SITE}/api/signup", json={"username": f"carol{int(time.time())}",
                                                      "password": "secret-pass-1"}, verify=cluster.ca_file, timeout=30)
    assert carol.status_code == 201, carol.text
    token = carol.json()["token"]
    assert _edge_answer(cluster, token).status_code in (200, 204)
    _, uid, epoch, _, _ = token.split(".")               # her count leaves the cache
    web = StackConfig.from_env(cluster.host("plk-web1").env)
    cache = HashClient(web.memcached_specs, connect_timeout=1, timeout=1, default_noreply=False)
    try:
        assert cache.delete(f"p1:getUnreadCount:{uid}:{epoch}")
    finally:
        cache.close()
    miss = _edge(cluster, token)
    assert miss.status_code == 409 and miss.headers["X-Cache"] == "MISS", miss.text
    assert miss.json()["retry"] == "site" and miss.headers["Access-Control-Allow-Origin"] == SITE


def test_a_long_poll_on_the_edge_over_tls_is_woken_by_a_plurk(cluster, tokens):
    first = _edge_answer(cluster, tokens["alice"])
    _held_until_a_plurk(cluster, tokens, first, "to the edge over TLS",
                        lambda headers: _edge(cluster, tokens["alice"], timeout=60, headers=headers))


def test_a_stream_on_the_edge_over_tls_delivers_an_event(cluster, tokens):
    _edge_answer(cluster, tokens["alice"])
    conn = http.client.HTTPSConnection(LB, topology.EDGE_TLS_PORT, timeout=30, context=cluster.ssl_context())
    try:
        conn.request("GET", "/Poll/getUnreadCount", headers={
            "Authorization": f"Bearer {tokens['alice']}", "Accept": "text/event-stream", "Origin": SITE})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
        assert read_event(resp.readline)["event"] == "getUnreadCount"         # the answer it starts with
        _streamed_plurk(cluster, tokens, resp, "streamed to the edge over TLS")
    finally:
        conn.close()
