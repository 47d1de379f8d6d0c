"""A plurk's thread, Plurk's per-object resource, through the whole stack: nginx -> fastpath,
which serves one cached answer per plurk to every reader holding a capability, holds a
long-poll on it, and hands a miss, a foreign capability or a revoked token to Django."""
import threading
import time

import requests


def _thread(stack):
    (writer, wtoken), (_, rtoken) = stack.follower_pair()
    plurk = stack.api("POST", "/api/plurks", wtoken, json={"content": "a thread"}).json()
    url = stack.api("GET", f"/api/plurks/{plurk['id']}", rtoken).json()["poll"]
    return plurk, wtoken, rtoken, url


def _get(stack, url, token, **headers):
    return requests.get(stack.url(url), headers={"Authorization": f"Bearer {token}", **headers}, timeout=70)


def test_a_thread_is_served_by_fastpath_and_follows_its_responses(stack):
    plurk, wtoken, rtoken, url = _thread(stack)
    first = _get(stack, url, rtoken)
    assert first.status_code == 204
    deadline = time.monotonic() + 10
    while _get(stack, url, rtoken).headers.get("X-Cache") != "HIT":      # the marker may come with the miss
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert stack.api("POST", f"/api/plurks/{plurk['id']}/responses", wtoken, json={"content": "hi"}).status_code == 201
    resp = _get(stack, url, rtoken)
    assert resp.status_code == 200 and resp.headers["X-Cache"] == "HIT", resp.headers
    assert resp.json()["responses"][0]["content"] == "hi"


def test_a_held_thread_poll_wakes_on_a_response(stack):
    plurk, wtoken, rtoken, url = _thread(stack)
    etag = None
    deadline = time.monotonic() + 10
    while True:
        resp = _get(stack, url, rtoken)
        if resp.headers.get("X-Cache") == "HIT":
            etag = resp.headers["ETag"]
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    got = {}

    def hold():
        got["resp"] = _get(stack, url, rtoken, **{"If-None-Match": etag, "Prefer": "wait=30"})
        got["at"] = time.monotonic()

    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(0.5)
    posted = time.monotonic()
    assert stack.api("POST", f"/api/plurks/{plurk['id']}/responses", wtoken, json={"content": "wake"}).status_code == 201
    holder.join(40)
    assert got["resp"].status_code == 200 and got["resp"].json()["responses"][-1]["content"] == "wake"
    assert got["at"] - posted < 5


def test_another_readers_capability_and_a_revoked_token_reach_django(stack):
    plurk, wtoken, rtoken, url = _thread(stack)
    _get(stack, url, rtoken)
    own = stack.api("GET", f"/api/plurks/{plurk['id']}", wtoken).json()["poll"]
    foreign = _get(stack, own, rtoken)          # the writer's capability with the reader's token
    assert foreign.status_code == 403 and foreign.headers.get("X-Cache") != "HIT"
    assert stack.api("POST", "/api/logout", rtoken).status_code == 204
    revoked = _get(stack, url, rtoken)
    assert revoked.status_code == 401
