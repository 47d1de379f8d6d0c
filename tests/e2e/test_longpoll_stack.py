"""Long-polling through the whole stack (issue 14; docs/contract.md section 7, docs/web.md): a poll
with `Prefer: wait=N` and the current ETag is held by fastpath behind nginx, woken within a
second by a plurk (Django's notice), answered 304 when the wait ends, and while hundreds are
held no gunicorn worker is busy with them (Django never holds).

Skipped until fastpath has --max-wait (lp-fastpath); it then needs the runner to pass
--max-wait/--notify-dir (plurksite/services.py) and Django's notices (fastpoll/notify.py).
"""
import os
import re
import select
import socket
import threading
import time

import pytest
import requests

from fastpath.options import OPTIONS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not any(opt.flag == "--max-wait" for opt in OPTIONS),
                       reason="fastpath does not hold polls yet: fastpath.options has no --max-wait "
                              "(lp-fastpath, issue 14)"),
]

MAX_WAIT_S = 4


@pytest.fixture(scope="module")
def lp_stack(tmp_path_factory):
    from tests.support.stack import longpoll_stack

    with longpoll_stack(tmp_path_factory, "longpoll", MAX_WAIT_S) as running:
        yield running


@pytest.fixture
def pair(lp_stack):
    return lp_stack.follower_pair()


def _current_etag(stack, token):
    """The ETag of the reader's count answer once fastpath has it (a miss is filled by Django)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        resp = stack.poll("getUnreadCount", token)
        if resp.headers.get("X-Cache") == "HIT" and resp.headers.get("ETag"):
            return resp.headers["ETag"]
        time.sleep(0.1)
    raise AssertionError(f"no fastpath answer with an ETag: {resp.status_code} {dict(resp.headers)}")


def _held(stack, token, etag, wait):
    return requests.get(stack.url("/Poll/getUnreadCount"), timeout=wait + 30,
                        headers={"Authorization": f"Bearer {token}", "Prefer": f"wait={wait}",
                                 "If-None-Match": etag})


def test_a_held_poll_is_woken_by_a_plurk_within_a_second(lp_stack, pair):
    (_, writer_token), (_, reader_token) = pair
    etag = _current_etag(lp_stack, reader_token)
    answer = {}

    def hold():
        answer["resp"] = _held(lp_stack, reader_token, etag, 60)
        answer["at"] = time.monotonic()

    thread = threading.Thread(target=hold)
    thread.start()
    time.sleep(1.0)
    assert thread.is_alive(), "the poll was answered at once instead of held"
    resp = lp_stack.api("POST", "/api/plurks", writer_token, json={"content": "wake up"})
    assert resp.status_code == 201, resp.text
    posted = time.monotonic()
    thread.join(timeout=MAX_WAIT_S + 20)
    resp = answer["resp"]
    assert resp.status_code == 200 and resp.json() == {"count": 1}, resp.text
    assert answer["at"] - posted < 1.0, "woken by the plurk's notice, not by the end of the wait"
    assert resp.headers["X-Cache"] == "HIT"
    assert resp.headers["Preference-Applied"].startswith("wait=")
    assert resp.headers["ETag"] != etag


def test_a_held_poll_ends_in_a_304_with_the_same_etag(lp_stack, pair):
    _, (_, reader_token) = pair
    etag = _current_etag(lp_stack, reader_token)
    began = time.monotonic()
    resp = _held(lp_stack, reader_token, etag, 60)       # held for --max-wait, not 60 s
    elapsed = time.monotonic() - began
    assert resp.status_code == 304 and resp.content == b""
    assert resp.headers["ETag"] == etag and resp.headers["X-Cache"] == "HIT"
    assert resp.headers["Preference-Applied"] == f"wait={MAX_WAIT_S}"
    assert MAX_WAIT_S * 0.85 <= elapsed < MAX_WAIT_S + 10


def _gunicorn_polls(stack):
    with open(os.path.join(stack.config.log_dir(), "gunicorn.log"), errors="replace") as fh:
        return len(re.findall(r'"(?:GET|POST) /Poll/', fh.read()))


def test_two_hundred_held_polls_keep_no_gunicorn_worker_busy(lp_stack, pair):
    (_, writer_token), (_, reader_token) = pair
    etag = _current_etag(lp_stack, reader_token)
    host, port = lp_stack.config.http
    request = (f"GET /Poll/getUnreadCount HTTP/1.1\r\nHost: {host}:{port}\r\n"
               f"Authorization: Bearer {reader_token}\r\nPrefer: wait=60\r\nIf-None-Match: {etag}\r\n"
               f"Connection: close\r\n\r\n").encode()
    before = _gunicorn_polls(lp_stack)
    clients = []
    try:
        for _ in range(200):
            sock = socket.create_connection((host, port), timeout=10)
            sock.sendall(request)
            clients.append(sock)
        time.sleep(1.0)
        readable, _, _ = select.select(clients, [], [], 0)
        assert readable == [], f"{len(readable)} of 200 were answered instead of held"
        # Django is idle: the API answers at once and no poll reached it
        began = time.monotonic()
        assert requests.get(lp_stack.url("/api/me"), headers={"Authorization": f"Bearer {reader_token}"},
                            timeout=10).status_code == 200
        assert time.monotonic() - began < 2.0
        assert _gunicorn_polls(lp_stack) == before
        # one plurk wakes all 200
        assert lp_stack.api("POST", "/api/plurks", writer_token, json={"content": "to all"}).status_code == 201
        for sock in clients:
            sock.settimeout(MAX_WAIT_S + 20)
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
            assert data.startswith(b"HTTP/1.1 200 "), data[:200]
            assert b'{"count":1}' in data
    finally:
        for sock in clients:
            sock.close()
    assert _gunicorn_polls(lp_stack) == before


def _fastpath_metric(stack, name):
    from plurksite.config import format_hostport

    text = requests.get(f"http://{format_hostport(*stack.config.fastpath_admin)}/metrics", timeout=5).text
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def test_notices_over_udp_wake_a_held_poll(tmp_path_factory):
    """PLURK_FASTPATH_NOTIFY=udp:127.0.0.1:P-(P+1) on one host, 2 fastpath workers: Django sends
    each notice to both ports, fastpath worker i reads P+i (issue 16)."""
    from tests.fastpath.test_longpoll import udp_ports
    from tests.support.stack import TestStack, stack_config

    port = udp_ports(2)
    config = stack_config(tmp_path_factory.mktemp("udp-notify"), PLURK_LONGPOLL_MAX_WAIT_S="30",
                          PLURK_FASTPATH_WORKERS="2", PLURK_FASTPATH_NOTIFY=f"udp:127.0.0.1:{port}-{port + 1}")
    with TestStack(config, nginx_workers=1) as stack:
        (_, writer_token), (_, reader_token) = stack.follower_pair()
        etag = _current_etag(stack, reader_token)
        answer = {}
        thread = threading.Thread(target=lambda: answer.update(resp=_held(stack, reader_token, etag, 30)))
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive(), "the poll was answered at once instead of held"
        before = _fastpath_metric(stack, "fastpath_notice_udp_datagrams_total")
        resp = stack.api("POST", "/api/plurks", writer_token, json={"content": "over udp"})
        assert resp.status_code == 201, resp.text
        thread.join(timeout=30 + 20)
        resp = answer["resp"]
        assert resp.status_code == 200 and resp.json() == {"count": 1}, resp.text
        assert _fastpath_metric(stack, "fastpath_notice_udp_datagrams_total") >= before + 2   # both workers
        assert _fastpath_metric(stack, "fastpath_holds_woken_total") >= 1
