"""The memcached client (fastpath/src/fp_mc.c) on its own and inside a running fastpath:
cancellation, one bad entry failing only its own key, replies split anywhere, and a read buffer
that shrinks back after a large value.

In-process tests drive one fp_mc_pool_t through ``_testhelper_mc_client``: the test plays
memcached on a socketpair.  The others run a real fastpath against a fake memcached (replies a
real one would not give) or a real memcached started with ``-I 4m``."""
import http.client
import re
import time

import pytest
import requests
from fastpath._server import _testhelper_mc_client
from tests.fastpath.conftest import token


def value(key, data, flags=b"0"):
    return b"VALUE %s %s %d\r\n%s\r\n" % (key, flags, len(data), data)


@pytest.fixture
def client():
    c = _testhelper_mc_client()
    yield c
    c.close()


# -- cancellation --------------------------------------------------------------------------------

def test_get_cancelled_before_it_is_written_is_never_sent_nor_answered(client):
    a, b = client.get(b"k:a"), client.get(b"k:b")
    client.cancel(a)
    assert client.written() == b"get k:b\r\n"
    client.reply(value(b"k:b", b"B") + b"END\r\n")
    assert client.answers == [(b, "hit", b"B")]


def test_get_cancelled_after_it_is_written_keeps_the_replies_in_step(client):
    a, b = client.get(b"k:a"), client.get(b"k:b")
    assert client.written() == b"get k:a k:b\r\n"
    client.cancel(a)
    client.reply(value(b"k:a", b"A") + value(b"k:b", b"B") + b"END\r\n")
    assert client.answers == [(b, "hit", b"B")]
    c = client.get(b"k:a")                       # the same connection, still in step
    assert client.written() == b"get k:a\r\n"
    client.reply(value(b"k:a", b"A2") + b"END\r\n")
    assert client.answers[-1] == (c, "hit", b"A2")


def test_callback_may_cancel_another_get_and_ask_again(client):
    gets = [client.get(k) for k in (b"k:a", b"k:b", b"k:c")]
    again = []

    def on_answer(index):
        if index == gets[0]:
            client.cancel(gets[1])               # written: muted, its reply is skipped
            again.append(client.get(b"k:a"))     # queued behind, written after this pass
    client.on_answer = on_answer
    assert client.written() == b"get k:a k:b k:c\r\n"
    client.reply(value(b"k:a", b"A") + value(b"k:b", b"B") + value(b"k:c", b"C") + b"END\r\n")
    assert client.written() == b"get k:a\r\n"
    client.reply(value(b"k:a", b"A2") + b"END\r\n")
    assert client.answers == [(gets[0], "hit", b"A"), (gets[2], "hit", b"C"), (again[0], "hit", b"A2")]


def test_closing_the_pool_answers_waiting_gets_unavailable_once(client):
    a, b = client.get(b"k:a"), client.get(b"k:b")
    client.cancel(b)
    client.close()
    assert client.answers == [(a, "unavailable", b"")]


def test_client_leaving_while_its_get_waits_drops_the_answer(fake_memcached, fastpath_factory):
    """Clients close while memcached has not answered their gets yet; the late replies are then
    dropped (under `make test-asan`, without touching freed memory), the others get their own,
    and nothing stays in flight."""
    fake = fake_memcached
    for uid in range(1, 8):
        fake.set(b"p1:getMessages:%d:0" % uid, b'{"u":%d}' % uid)
    fp = fastpath_factory([fake], extra=("--timeout-ms", "10000"))
    fake.answering.clear()
    leaving = []
    for uid in range(1, 6):
        conn = http.client.HTTPConnection("127.0.0.1", fp.port, timeout=10)
        conn.request("GET", "/Poll/getMessages", headers={"Authorization": f"Bearer {token(uid)}"})
        leaving.append(conn)
    staying = http.client.HTTPConnection("127.0.0.1", fp.port, timeout=10)
    staying.request("GET", "/Poll/getMessages", headers={"Authorization": f"Bearer {token(6)}"})
    _wait(lambda: len(fake.asked) >= 6, "the gets to reach memcached")
    for conn in leaving:
        conn.close()
    _wait(lambda: _metric(fp, "fastpath_connections") <= 2, "fastpath to close the clients that left")
    fake.answering.set()
    response = staying.getresponse()
    assert (response.status, response.read()) == (200, b'{"u":6}')
    for uid in (1, 7):
        r = requests.get(f"{fp.url}/Poll/getMessages", timeout=10,
                         headers={"Authorization": f"Bearer {token(uid)}"})
        assert (r.status_code, r.content) == (200, b'{"u":%d}' % uid)
    assert _metric(fp, "fastpath_inflight_requests") == 0
    assert _metric(fp, "fastpath_memcached_errors_total") == 0


# -- replies split anywhere -------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [1, 2, 7])
def test_replies_split_anywhere_give_the_same_answers(client, chunk):
    gets = [client.get(k) for k in (b"k:a", b"k:b", b"k:c", b"k:a")]
    client.written()
    client.reply(value(b"k:a", b"A") + value(b"k:c", b"") + value(b"k:a", b"A again") + b"END\r\n",
                 chunk=chunk)
    assert client.answers == [(gets[0], "hit", b"A"), (gets[1], "miss", b""),
                              (gets[2], "empty", b""), (gets[3], "hit", b"A again")]


# -- helpers -------------------------------------------------------------------------------------

def _metric(fp, name):
    text = requests.get(f"http://127.0.0.1:{fp.admin_port}/metrics", timeout=10).text
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))


def _wait(condition, what, timeout=10):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
