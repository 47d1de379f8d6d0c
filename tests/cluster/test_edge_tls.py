"""The edge over TLS (issue 32 item 2), for real: the namespace cluster with one web host, whose
fastpath runs the edge on its own address, and the balancer terminating TLS for it on :8443
(nginx/balancer-edge.conf.template) with the certificate `make cluster` makes.  The page points
its script there (data-edge-url), and through https with the cluster's CA trusted: a long-poll
woken by a plurk, a stream's event, and a miss answered 409 retry:site.  The rendering and the TLS
settings one by one: tests/plurksite/test_balancer_edge.py."""
import http.client
import json
import threading
import time

import pytest
import requests
from pymemcache.client.hash import HashClient

from plurksite.cluster import topology
from plurksite.cluster.harness import Cluster
from plurksite.config import StackConfig

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
    got = {}
    for name in ("alice", "bob"):
        resp = requests.post(f"{SITE}/api/login", json={"username": name, "password": "plurkdemo1"},
                             verify=cluster.ca_file, timeout=30)
        assert resp.status_code == 200, resp.text
        got[name] = resp.json()["token"]
    return got


def _edge(cluster, token, path="/Poll/getUnreadCount", **kwargs):
    headers = {"Origin": SITE, **kwargs.pop("headers", {})}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return requests.get(EDGE + path, headers=headers, verify=cluster.ca_file, timeout=kwargs.pop("timeout", 30),
                        **kwargs)


def _plurk(cluster, token, text):
    resp = requests.post(f"{SITE}/api/plurks", json={"content": text}, headers={"Authorization": f"Bearer {token}"},
                         verify=cluster.ca_file, timeout=30)
    assert resp.status_code == 201, resp.text


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
    answer = {}

    def hold():
        answer["resp"] = _edge(cluster, tokens["alice"], timeout=60,
                               headers={"Prefer": "wait=30", "If-None-Match": first.headers["ETag"]})
        answer["at"] = time.monotonic()

    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(1.5)
    assert holder.is_alive(), f"answered at once: {answer}"
    _plurk(cluster, tokens["bob"], "to the edge over TLS")
    posted = time.monotonic()
    holder.join(30)
    assert answer["resp"].status_code == 200, answer["resp"].text
    assert answer["resp"].json()["count"] == first.json()["count"] + 1
    assert answer["at"] - posted < 5


def test_a_stream_on_the_edge_over_tls_delivers_an_event(cluster, tokens):
    _edge_answer(cluster, tokens["alice"])
    conn = http.client.HTTPSConnection(LB, topology.EDGE_TLS_PORT, timeout=30, context=cluster.ssl_context())
    try:
        conn.request("GET", "/Poll/getUnreadCount", headers={
            "Authorization": f"Bearer {tokens['alice']}", "Accept": "text/event-stream", "Origin": SITE})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")

        def event():
            fields = {}
            while True:
                line = resp.readline().decode()
                assert line, f"the stream ended: {fields}"
                if line == "\n" and fields:
                    return fields
                if ":" in line and not line.startswith(":"):
                    key, _, value = line.rstrip("\n").partition(": ")
                    fields[key] = value

        assert event()["event"] == "getUnreadCount"         # the answer it starts with
        _plurk(cluster, tokens["bob"], "streamed to the edge over TLS")
        posted = time.monotonic()
        got = event()
        assert got["event"] == "getUnreadCount" and "count" in json.loads(got["data"]), got
        assert time.monotonic() - posted < 5
    finally:
        conn.close()
