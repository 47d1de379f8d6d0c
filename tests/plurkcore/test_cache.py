"""cache.py against real memcached: raw bytes with flags 0, pipelined batches, no ejection."""
import time

import pytest

from plurkcore.cache import AnswerCache, BytesSerde, CacheUnavailable, parse_server

from .helpers import server_client


def test_parse_server():
    assert parse_server("127.0.0.1:11211") == ("127.0.0.1", 11211)
    assert parse_server("[::1]:11211") == ("::1", 11211)
    for bad in ("nohost", "h:0", "h:70000", ":1", "h:x", 5):
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
    uniques = cache.cas_uniques(node, keys + ["p1:getUnreadCount:0:0"])
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
    """A socket that replies ``data`` a few bytes per recv (replies split anywhere, even
    between CR and LF), then reports the connection closed."""

    def __init__(self, data, step):
        self.data, self.step, self.sent = data, step, b""

    def sendall(self, data):
        self.sent += data

    def recv(self, size):
        out, self.data = self.data[:min(size, self.step)], self.data[min(size, self.step):]
        return out


class _FakeClient:
    def __init__(self, sock):
        self.sock = sock


@pytest.mark.parametrize("step", [1, 2, 3, 7, 4096])
def test_pipeline_reads_replies_split_anywhere(step):
    from plurkcore.cache import _pipeline

    replies = b"HD c12\r\nEN\r\nSTORED\r\nEXISTS\r\n"
    sock = _TrickleSocket(replies, step)
    got = _pipeline(_FakeClient(sock), [b"a\r\n", b"b\r\n", b"c\r\n", b"d\r\n"])
    assert got == [b"HD c12", b"EN", b"STORED", b"EXISTS"] and sock.sent == b"a\r\nb\r\nc\r\nd\r\n"


@pytest.mark.parametrize("replies", [b"STORED\r\n", b"STORED\r\nSTO", b"STORED\r\nSERVER_ERROR out of memory\r\n",
                                     b"STORED\r\nSTORED\r\nSTORED\r\n"])
def test_pipeline_refuses_short_extra_and_error_replies(replies):
    from pymemcache.exceptions import MemcacheError

    from plurkcore.cache import _pipeline

    with pytest.raises(MemcacheError):
        _pipeline(_FakeClient(_TrickleSocket(replies, 5)), [b"a\r\n", b"b\r\n"])


def test_a_dead_server_is_skipped_for_the_retry_interval_but_never_ejected(memcached3):
    cache = AnswerCache([m.spec for m in memcached3], 0.05, 0.3)
    dead = memcached3[0]
    keys = [f"p1:getMessages:{i}:0" for i in range(200)]
    before = {k: cache.node_for(k) for k in keys}
    dead.kill()
    with pytest.raises(CacheUnavailable) as failed:
        cache.cas_uniques(dead.spec, ["p1:a:1:0"])
    assert failed.value.attempted
    with pytest.raises(CacheUnavailable) as skipped:
        cache.cas_uniques(dead.spec, ["p1:a:1:0"])
    assert not skipped.value.attempted
    assert {k: cache.node_for(k) for k in keys} == before          # placement never changes
    dead.start()
    time.sleep(0.35)
    assert cache.cas_uniques(dead.spec, ["p1:a:1:0"]) == {}
