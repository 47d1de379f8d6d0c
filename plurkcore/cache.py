"""The memcached side: pymemcache's HashClient over the *static* server list.

- Keys are the str keys of :func:`plurkcore.keys.answer_key`; values are raw bytes stored with flags
  0 (:class:`BytesSerde`), exactly what fastpath serves.
- Placement is pymemcache's rendezvous hash over every configured server, always: unlike a stock
  HashClient this one never ejects a failed server (fastpath does not either, docs/contract.md
  section 4), so a key is never written where fastpath would not look.  A failure raises
  :class:`CacheUnavailable` naming the server; the caller records it (repair.mark_suspect).
- Batches are per server and pipelined: one round trip per ``CHUNK`` keys.
- A server that failed is skipped by this process for ``MEMCACHED_RETRY_INTERVAL`` seconds, so a
  dead server costs one timeout per interval, not one per request.
"""
import logging
import socket
import threading
import time

from pymemcache.client.hash import HashClient
from pymemcache.client.rendezvous import RendezvousHash
from pymemcache.exceptions import MemcacheError

from . import conf

logger = logging.getLogger("plurkcore.cache")

CHUNK = 500          # commands per pipelined round trip (keeps replies well inside socket buffers)
RECV_SIZE = 65536

#: Failures per server since start (exported for monitoring and tests).
stats = {"failures": 0, "skipped": 0}


class CacheUnavailable(Exception):
    """``node`` failed (``attempted``) or was skipped because it failed moments ago."""

    def __init__(self, node, reason, attempted=True):
        super().__init__(f"memcached {node}: {reason}")
        self.node = node
        self.attempted = attempted


class BytesSerde:
    """Store bytes verbatim with flags 0; refuse anything else."""

    def serialize(self, key, value):
        if not isinstance(value, bytes):
            raise TypeError(f"cache values are bytes, got {type(value).__name__}")
        return value, 0

    def deserialize(self, key, value, flags):
        return value


def parse_server(spec):
    """``host:port`` or ``[v6]:port`` -> (host, port); raises ValueError."""
    if not isinstance(spec, str):
        raise ValueError(f"not a server spec: {spec!r}")
    spec = spec.strip()
    if spec.startswith("["):
        host, sep, port = spec[1:].partition("]:")
    else:
        host, sep, port = spec.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port, got {spec!r}")
    return host, int(port)


try:
    import mmh3
except ImportError:                      # pragma: no cover - the pure-Python hash is ~50x slower
    mmh3 = None


def murmur3_32(text, seed=0):
    """pymemcache's default node hash (MurmurHash3 x86_32, unsigned), in C; the same values
    (tests/vectors/contract.json pins them)."""
    return mmh3.hash(text, seed, signed=False)


class FastRendezvousHash(RendezvousHash):
    def __init__(self, nodes=None, seed=0, hash_function=None):
        if hash_function is None and mmh3 is not None:
            hash_function = murmur3_32
        if hash_function is None:
            super().__init__(nodes, seed)
        else:
            super().__init__(nodes, seed, hash_function)


class StaticHashClient(HashClient):
    """A HashClient whose node set never changes: failures are the caller's business."""

    def _mark_failed_server(self, server):
        pass


class AnswerCache:
    def __init__(self, servers, timeout, retry_interval):
        self.timeout = timeout
        self.retry_interval = retry_interval
        self.client = StaticHashClient(
            [parse_server(s) for s in servers], hasher=FastRendezvousHash, serde=BytesSerde(), connect_timeout=timeout,
            timeout=timeout, no_delay=True, retry_attempts=0, default_noreply=False,
            allow_unicode_keys=False)
        self._down_until = {}

    @property
    def nodes(self):
        return sorted(self.client.clients)

    def node_for(self, key):
        nodes = self.client.hasher.nodes
        if len(nodes) == 1:
            return nodes[0]
        return self.client.hasher.get_node(key)

    def group(self, keys, node_of=None):
        """{node: [key, ...]}; ``node_of`` is an optional precomputed {key: node}."""
        groups = {}
        for key in keys:
            node = node_of[key] if node_of is not None else self.node_for(key)
            groups.setdefault(node, []).append(key)
        return groups

    # -- failure bookkeeping ---------------------------------------------------------------
    def is_down(self, node):
        until = self._down_until.get(node)
        return until is not None and time.monotonic() < until

    def _run(self, node, func, force=False):
        if not force and self.is_down(node):
            stats["skipped"] += 1
            raise CacheUnavailable(node, "skipped (failed recently)", attempted=False)
        client = self.client.clients[node]
        try:
            result = func(client)
        except (OSError, socket.timeout, MemcacheError, ValueError) as exc:
            client.close()
            stats["failures"] += 1
            self._down_until[node] = time.monotonic() + self.retry_interval
            logger.warning("memcached %s failed: %s", node, exc or type(exc).__name__)
            raise CacheUnavailable(node, exc or type(exc).__name__) from exc
        self._down_until.pop(node, None)
        return result

    # -- operations on one server ----------------------------------------------------------
    def cas_uniques(self, node, keys):
        """{key: cas unique} for the keys present on ``node`` (meta get ``mg <key> c``: the
        unique without the value, which the writer does not need)."""
        def run(client):
            found = {}
            for start in range(0, len(keys), CHUNK):
                chunk = keys[start:start + CHUNK]
                replies = _pipeline(client, [b"mg %s c\r\n" % k.encode("ascii") for k in chunk])
                for key, reply in zip(chunk, replies):
                    if reply[:4] == b"HD c" and reply[4:].isdigit():      # the usual "HD c<unique>"
                        found[key] = int(reply[4:])
                    elif reply.startswith(b"HD "):
                        flag = next((f for f in reply.split()[1:] if f.startswith(b"c")), None)
                        if flag is None:
                            raise MemcacheError(f"unexpected meta reply {reply!r}")
                        found[key] = int(flag[1:])
                    elif reply != b"EN":
                        raise MemcacheError(f"unexpected meta reply {reply!r}")
            return found

        return self._run(node, run)

    def get_many(self, node, keys):
        found = {}

        def run(client):
            for start in range(0, len(keys), CHUNK):
                found.update(client.get_many(keys[start:start + CHUNK]))
            return found

        return self._run(node, run)

    def store_many(self, node, ops, expire):
        """Pipeline ``ops`` = [(command, key, value, cas)] with command b"cas" or b"add";
        returns {key: reply} (b"STORED", b"EXISTS", b"NOT_FOUND" or b"NOT_STORED")."""
        expire_b = str(int(expire)).encode()

        def run(client):
            replies = {}
            for start in range(0, len(ops), CHUNK):
                chunk = ops[start:start + CHUNK]
                parts = [_store_command(command, key, value, cas, expire_b) for command, key, value, cas in chunk]
                replies.update(zip((key for _, key, _, _ in chunk), _pipeline(client, parts)))
            return replies

        return self._run(node, run)

    def delete_many(self, node, keys):
        def run(client):
            for start in range(0, len(keys), CHUNK):
                _pipeline(client, [b"delete %s\r\n" % k.encode("ascii") for k in keys[start:start + CHUNK]])

        return self._run(node, run)

    def flush(self, node):
        """``flush_all`` on ``node``, tried even if it failed recently."""
        return self._run(node, lambda client: client.flush_all(noreply=False), force=True)

    def add(self, key, value, expire):
        """One ``add``; True if stored, False if the key existed."""
        node = self.node_for(key)
        return self.store_many(node, [(b"add", key, value, None)], expire)[key] == b"STORED"

    def close(self):
        for client in self.client.clients.values():
            client.close()


def _store_command(command, key, value, cas, expire_b):
    """One storage command with its data block: ``add``, or ``cas`` with its unique."""
    unique = b" %d" % int(cas) if command == b"cas" else b""
    return b"%s %s 0 %s %d%s\r\n%s\r\n" % (command, key.encode("ascii"), expire_b, len(value), unique, value)


def _pipeline(client, commands):
    """Send ``commands`` (bytes, each ending in CRLF, each answered by one line) at once and
    read one reply line for each.  The replies are read whole and split once: a line at a time
    cost ~3 us per reply in Python, most of a fan-out's memcached time."""
    if client.sock is None:
        client._connect()
    sock = client.sock
    sock.sendall(b"".join(commands))
    want = len(commands)
    chunks = []
    lines = 0
    while lines < want:
        data = sock.recv(RECV_SIZE)
        if not data:
            raise MemcacheError("connection closed by the server")
        chunks.append(data)
        lines += data.count(b"\n")      # replies are CRLF-terminated lines with no bare LF
    replies = b"".join(chunks).split(b"\r\n")
    if lines != want or replies.pop() != b"" or len(replies) != want:
        raise MemcacheError(f"expected {want} reply lines, got {lines}")
    for line in replies:
        if line.startswith((b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR")):
            raise MemcacheError(line.decode("ascii", "replace"))
    return replies


_local = threading.local()
_generation = [0]


def get_cache():
    """This thread's :class:`AnswerCache` for the current configuration."""
    cache = getattr(_local, "cache", None)
    if cache is None or _local.generation != _generation[0]:
        if cache is not None:
            cache.close()
        config = conf.get_config()
        cache = AnswerCache(config["MEMCACHED_SERVERS"], config["MEMCACHED_TIMEOUT"],
                            config["MEMCACHED_RETRY_INTERVAL"])
        _local.cache, _local.generation = cache, _generation[0]
    return cache


def close():
    """Close this thread's connections (they reopen on next use)."""
    cache = getattr(_local, "cache", None)
    if cache is not None:
        cache.close()


@conf.on_reset
def _reset():
    _generation[0] += 1
