"""cache.py against real memcached: raw bytes with flags 0, pipelined batches, no ejection."""
import select
import socket
import time

import pytest

from fastpoll.cache import AnswerCache, BytesSerde, CacheUnavailable, parse_server

from tests.plurkcore.helpers import server_client


def test_parse_server():
    assert parse_server("127.0.0.1:11211") == ("127.0.0.1", 11211)
    assert parse_server("[::1]:11211") == ("::1", 11211)
    for bad in ("nohost", "h:0", "h:70000", ":1", "h:x", 5,
                "h:\u0661\u0661\u0662\u0661\u0661"):     # Arabic-Indic 11211: fastpath refuses it too
        with pytest.raises(ValueError):
            parse_server(bad)


def test_serde_stores_bytes_verbatim_with_flags_0():
    assert BytesSerde().serialize("k", b"\x00\xff") == (b"\x00\xff", 0)
    with pytest.raises(TypeError):
        BytesSerde().serialize("k", "text")


def test_pipelined_batches_larger_than_a_chunk(memcached):
    cache = AnswerCache([memcached.spec], 0.5, 1.0)
    node = memcached.spec
    keys = [f"p1:getUnreadCount:{i}:0" for i in range(1, 1201)]
    replies = cache.store_many(node, [(b"add", k, b"v%d" % i, None) for i, k in enumerate(keys)], 60)
    assert set(replies.values()) == {b"STORED"}
    uniques = cache.request_uniques(node, keys + ["p1:getUnreadCount:0:0"]).result()
    assert len(uniques) == 1200
    again = cache.store_many(node, [(b"add", keys[0], b"x", None), (b"cas", keys[1], b"new", uniques[keys[1]]),
                                    (b"cas", keys[2], b"new", uniques[keys[2]] + 1000)], 60)
    assert again == {keys[0]: b"NOT_STORED", keys[1]: b"STORED", keys[2]: b"EXISTS"}
    raw = server_client(node)
    assert raw.get(keys[1]) == b"new" and raw.get(keys[3]) == b"v3"
    assert raw.gets(keys[1]) is not None
    cache.delete_many(node, keys)
    assert cache.get_many(node, keys) == {}
    # the value really is stored with flags 0 (what fastpath expects)
    cache.add("p1:x:1:0", b"{}", 60)
    import socket
    with socket.create_connection(parse_server(node)) as sock:
        sock.sendall(b"get p1:x:1:0\r\n")
        assert sock.recv(100).startswith(b"VALUE p1:x:1:0 0 2\r\n{}\r\n")


class _TrickleSocket:
    """A socket that takes every command and replies ``data`` a few bytes per recv (replies
    split anywhere, even between CR and LF), then reports the connection closed."""

    def __init__(self, data, step):
        self.data, self.step, self.sent = data, step, b""
        self.replying = False                    # no reply before the test's commands are out

    def gettimeout(self):
        return 1.0

    def send(self, data):
        self.sent += bytes(data)
        return len(data)

    def recv(self, size):
        out, self.data = self.data[:min(size, self.step)], self.data[min(size, self.step):]
        return out


def _trickle_wire(data, step):
    from fastpoll.cache import _Wire

    class Wire(_Wire):
        def _ready(self, timeout):               # always writable; readable while data is left
            return select.POLLOUT | (select.POLLIN if self.sock.replying and self.sock.data else 0)

    return Wire(_TrickleSocket(data, step))


@pytest.mark.parametrize("step", [1, 2, 3, 7, 4096])
def test_wire_hands_replies_split_anywhere_to_the_batches_in_order(step):
    wire = _trickle_wire(b"HD c12\r\nEN\r\nSTORED\r\nEXISTS\r\nDELETED\r\n", step)
    sock = wire.sock
    first = wire.send([b"a\r\n", b"b\r\n"])
    second = wire.send([b"c\r\n", b"d\r\n"])
    third = wire.send([b"e\r\n"])
    sock.replying = True
    assert wire.receive(second) == [b"STORED", b"EXISTS"]        # the first one's lines read on the way
    assert wire.receive(first) == [b"HD c12", b"EN"]
    assert wire.receive(third) == [b"DELETED"] and not wire.batches
    assert sock.sent == b"a\r\nb\r\nc\r\nd\r\ne\r\n"


def test_an_empty_batch_is_complete_and_never_waited_for():
    wire = _trickle_wire(b"", 3)                   # a recv would read the end of the connection
    empty = wire.send([])
    wire.sock.replying = True
    wire.drain()                                   # nothing in flight: no recv
    assert wire.receive(empty) == [] and wire.sock.sent == b""


@pytest.mark.parametrize("replies", [b"STORED\r\n", b"STORED\r\nSTO", b"STORED\r\nSERVER_ERROR out of memory\r\n",
                                     b"STORED\r\nSTORED\r\nSTORED\r\n", b"CLIENT_ERROR bad data chunk\r\n"])
def test_wire_refuses_short_extra_and_error_replies(replies):
    from pymemcache.exceptions import MemcacheError

    wire = _trickle_wire(replies, 5)
    batch = wire.send([b"a\r\n", b"b\r\n"])
    wire.sock.replying = True
    with pytest.raises(MemcacheError):
        wire.receive(batch)


def test_a_batch_larger_than_both_socket_buffers_never_deadlocks(memcached):
    """memcached stops reading commands while it cannot write replies: a writer that only sent
    until it had sent everything would wait forever (here, until the timeout: socket.timeout)."""
    cache = AnswerCache([memcached.spec], 2.0, 1.0)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)     # before connect: the window too
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock.connect(parse_server(memcached.spec))
    sock.settimeout(2.0)
    cache.client.clients[memcached.spec].sock = sock
    # 6.4 MB of replies: more than memcached's send buffer grows to (4 MB, tcp_wmem) and ours
    count = 400_000
    replies = cache._send(memcached.spec, [b"version\r\n"] * count, None).result()
    assert len(replies) == count and replies[0].startswith(b"VERSION ") and len(set(replies)) == 1


def test_a_failed_server_never_gets_the_commands_left_queued_when_it_failed():
    """A server that stops reading (a partition) makes the send time out; the connection is
    then reset, not closed gracefully, so the kernel drops what it still queued instead of
    delivering it later (after a repair pass flushed the server)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    node = "127.0.0.1:%d" % listener.getsockname()[1]
    cache = AnswerCache([node], 0.3, 1.0)
    client = cache.client.clients[node]
    client._connect()
    server, _ = listener.accept()
    with pytest.raises(CacheUnavailable):
        cache._send(node, [b"mn\r\n"] * 2_000_000, None)      # 8 MB: more than the buffers hold
    with pytest.raises(ConnectionResetError):                  # a graceful close ends in EOF
        while server.recv(65536):
            pass
    server.close()
    listener.close()


def test_batches_in_flight_are_read_in_any_order_and_survive_a_plain_command(memcached):
    cache = AnswerCache([memcached.spec], 1.0, 1.0)
    node = memcached.spec
    keys = [f"p1:getUnreadCount:{i}:0" for i in range(1, 4)]
    adds = cache.request_stores(node, [(b"add", k, b"v", None) for k in keys], 60)
    uniques = cache.request_uniques(node, keys)
    assert cache.get_many(node, keys[:1]) == {keys[0]: b"v"}     # pymemcache's own get, after both
    assert len(uniques.result()) == 3
    assert adds.result() == {k: b"STORED" for k in keys}


def test_a_dead_server_is_skipped_for_the_retry_interval_but_never_ejected(memcached3):
    cache = AnswerCache([m.spec for m in memcached3], 0.05, 0.3)
    dead = memcached3[0]
    keys = [f"p1:getMessages:{i}:0" for i in range(200)]
    before = {k: cache.node_for(k) for k in keys}
    dead.kill()
    with pytest.raises(CacheUnavailable) as failed:
        cache.request_uniques(dead.spec, ["p1:a:1:0"]).result()
    assert failed.value.attempted
    with pytest.raises(CacheUnavailable) as skipped:
        cache.request_uniques(dead.spec, ["p1:a:1:0"]).result()
    assert not skipped.value.attempted
    assert {k: cache.node_for(k) for k in keys} == before          # placement never changes
    dead.start()
    time.sleep(0.35)
    assert cache.request_uniques(dead.spec, ["p1:a:1:0"]).result() == {}


def test_cas_or_add_in_one_batch_answers_in_the_order_of_the_keys(memcached):
    cache = AnswerCache([memcached.spec], 1.0, 1.0)
    node = memcached.spec
    keys = [f"p1:getMessages:{i}:0" for i in range(1, 6)]
    cache.store_many(node, [(b"add", k, b"old", None) for k in keys[:3]], 60)
    uniques = cache.request_uniques(node, keys).result()
    assert sorted(uniques) == keys[:3]
    uniques[keys[1]] += 1000                                      # someone stored meanwhile
    values = [b"a\r\nb", b"", b"\x00" * 70000, b"x", b"y"]        # line breaks, empty, larger than a recv
    sent = dict(uniques)
    replies = cache.request_cas_or_add(node, keys + [keys[3]], values + [b"z"], sent, 60).result()
    assert replies == [b"STORED", b"EXISTS", b"STORED", b"STORED", b"STORED", b"NOT_STORED"]
    raw = server_client(node)
    assert [raw.get(k) for k in keys] == [b"a\r\nb", b"old", b"\x00" * 70000, b"x", b"y"]


def test_uniques_read_unusual_meta_replies_and_refuse_unknown_ones():
    from pymemcache.exceptions import MemcacheError

    from fastpoll.cache import _uniques
    keys = ["k1", "k2", "k3"]
    assert _uniques(keys, [b"HD c5", b"EN", b"HD c70"]) == {"k1": 5, "k3": 70}
    assert _uniques(keys, [b"HD t-1 c5", b"EN", b"HD c7 t3"]) == {"k1": 5, "k3": 7}
    assert _uniques([], []) == {}
    for bad in ([b"HD c5", b"XX c5", b"EN"], [b"HD c", b"EN", b"EN"], [b"HD t1", b"EN", b"EN"]):
        with pytest.raises((MemcacheError, ValueError)):
            _uniques(keys, bad)
