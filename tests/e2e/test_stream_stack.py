"""Streams through the whole stack (issue 31 item 2; docs/contract.md section 9): a GET with
``Accept: text/event-stream`` goes through nginx's unbuffered stream location to fastpath, whose
events reach the client within a second of a commit; a first stream that misses, and every
stream while fastpath is down, is Django's one event and ``retry:``, after which the client
(as EventSource does) comes back with Last-Event-ID and finds fastpath."""
import time

import pytest
import requests

from tests.fastpath.test_stream import Stream

pytestmark = pytest.mark.slow

MAX_WAIT_S = 30


@pytest.fixture(scope="module")
def lp_stack(tmp_path_factory):
    from tests.support.stack import longpoll_stack

    with longpoll_stack(tmp_path_factory, "stream", MAX_WAIT_S, supervise=False) as running:
        yield running


class _Nginx:
    def __init__(self, stack):
        self.port = stack.config.http[1]


def _stream(stack, token, **kwargs):
    return Stream(_Nginx(stack), auth=f"Bearer {token}", resource="getUnreadCount", host="127.0.0.1", **kwargs)


def _django_stream(stack, token, last_event_id=None):
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    return requests.get(stack.url("/Poll/getUnreadCount"), headers=headers, timeout=10)


def _eventsource(stack, token, last_event_id=None, within=10):
    """What a browser's EventSource does: open the stream; Django's one-event answer (a miss)
    ends, and it comes back after retry: with the last id, until fastpath holds the stream.
    (the open stream, the id of the last event seen)."""
    deadline = time.monotonic() + within
    while True:
        s = _stream(stack, token, last_event_id=last_event_id)
        status, headers = s.head()
        assert status == 200 and headers["content-type"].startswith("text/event-stream"), (status, headers)
        if headers["x-cache"] == "HIT":
            return s, last_event_id
        body = s.raw
        while len(body) < int(headers["content-length"]):
            body += s.sock.recv(65536)
        s.close()
        text = body.decode()
        assert text.startswith("retry: 1000\n\n")
        if "id: " in text:
            last_event_id = text.split("id: ", 1)[1].split("\n", 1)[0]
        assert time.monotonic() < deadline, "fastpath never held the stream"
        time.sleep(1.0)


def test_events_arrive_within_a_second_of_a_commit(lp_stack):
    (_, writer), (_, reader) = lp_stack.follower_pair()
    s, last_id = _eventsource(lp_stack, reader)
    try:
        if last_id is None:              # fastpath had the answer: it is the first event
            first = s.event()
            assert first["data"] == "" and first["event"] == "getUnreadCount"
            last_id = first["id"]
        for n in (1, 2, 3):
            resp = lp_stack.api("POST", "/api/plurks", writer, json={"content": f"plurk {n}"})
            assert resp.status_code == 201, resp.text
            posted = time.monotonic()
            event = s.event(timeout=10)
            arrived = time.monotonic() - posted
            assert event["event"] == "getUnreadCount" and event["data"] == '{"count":%d}' % n, event
            assert arrived < 1.0, f"event {n} took {arrived:.2f} s through nginx"
            assert event["id"] != last_id
            last_id = event["id"]
    finally:
        s.close()


def test_a_stream_that_misses_is_djangos_then_fastpaths(lp_stack):
    from pymemcache.client.base import Client

    (_, writer), (_, reader) = lp_stack.follower_pair()
    lp_stack.api("POST", "/api/plurks", writer, json={"content": "x"})
    host, port = lp_stack.config.memcached[0]
    Client((host, port)).flush_all()
    resp = _django_stream(lp_stack, reader)         # nothing cached: fastpath's 404, Django's turn
    assert resp.status_code == 200 and resp.headers["X-Cache"] == "MISS"
    assert resp.text.endswith('event: getUnreadCount\ndata: {"count":1}\n\n')
    last_id = resp.text.split("id: ", 1)[1].split("\n", 1)[0]
    s, _ = _eventsource(lp_stack, reader, last_event_id=last_id)   # Django filled the cache
    assert s.quiet(0.5)
    s.close()


def test_fastpath_killed_gives_djangos_one_event_stream_with_retry(lp_stack):
    (_, writer), (_, reader) = lp_stack.follower_pair()
    lp_stack.api("POST", "/api/plurks", writer, json={"content": "x"})
    fastpath = lp_stack.service("fastpath")
    fastpath.kill()
    try:
        resp = _django_stream(lp_stack, reader)
        assert resp.status_code == 200 and resp.headers["X-Cache"] == "MISS"
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.text.startswith("retry: 1000\n\n")
        assert resp.text.endswith('event: getUnreadCount\ndata: {"count":1}\n\n')
        # a 401 stays a JSON 401
        bad = _django_stream(lp_stack, "nope")
        assert bad.status_code == 401 and bad.headers["Content-Type"] == "application/json"
    finally:
        fastpath.start()
        fastpath.wait_ready()
    # back: the next stream is fastpath's
    deadline = time.monotonic() + 10
    while True:
        s = _stream(lp_stack, reader)
        status, headers = s.head()
        if headers.get("x-cache") == "HIT" or time.monotonic() > deadline:
            break
        s.close()
        time.sleep(0.2)
    assert status == 200 and headers["x-cache"] == "HIT"
    assert s.event()["data"] == '{"count":1}'
    s.close()
