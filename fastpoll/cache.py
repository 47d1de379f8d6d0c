"""The memcached side: pymemcache's HashClient over the *static* server list.

- Keys are the str keys of :func:`fastpoll.keys.answer_key`; values are raw bytes stored with flags
  0 (:class:`BytesSerde`), exactly what fastpath serves.
- Placement is pymemcache's rendezvous hash over every configured server, always: unlike a stock
  HashClient this one never ejects a failed server (fastpath does not either, docs/contract.md
  section 4), so a key is never written where fastpath would not look.  A failure raises
  :class:`CacheUnavailable` naming the server; the caller records it (repair.mark_suspect).
- Batches are per server and pipelined (:class:`_Wire`): a batch goes out whole and its replies
  are read when the caller asks (:meth:`AnswerCache.request_uniques` and
  :meth:`~AnswerCache.request_stores` return a :class:`Pending`), so the writer computes one batch
  while memcached answers the next.
- A server that failed is skipped by this process for ``MEMCACHED_RETRY_INTERVAL`` seconds, so a
  dead server costs one timeout per interval, not one per request.
"""
import collections
import logging
import re
import select
import socket
import struct
import threading
import time
import urllib.parse

from pymemcache.client.hash import HashClient
from pymemcache.client.rendezvous import RendezvousHash
from pymemcache.exceptions import MemcacheError

from fastpoll import conf

logger = logging.getLogger("fastpoll.cache")

RECV_SIZE = 65536
GET_CHUNK = 500      # keys per ``get`` line of get_many (pymemcache's own command)
DUMP_TRIES = 25      # ``lru_crawler metadump`` answered BUSY: tries, 0.2 s apart
_DUMP_REFUSALS = (b"BUSY", b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR")

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
    # ASCII digits, as fastpath reads the same spec: int() also takes other scripts' digits
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
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
        self._wires = {}             # node -> _Wire of its current connection

    @property
    def nodes(self):
        return sorted(self.client.clients)

    def node_for(self, key):
        nodes = self.client.hasher.nodes
        if len(nodes) == 1:
            return nodes[0]
        return self.client.hasher.get_node(key)

    def nodes_for(self, keys):
        """{key: node} of ``keys``."""
        nodes = self.client.hasher.nodes
        if len(nodes) == 1:
            return dict.fromkeys(keys, nodes[0])
        get_node = self.client.hasher.get_node
        return {key: get_node(key) for key in keys}

    def group(self, keys, node_of=None):
        """{node: [key, ...]}; ``node_of`` is an optional precomputed {key: node}."""
        nodes = self.client.hasher.nodes
        if len(nodes) == 1:
            return {nodes[0]: list(keys)} if keys else {}
        groups = {}
        for key in keys:
            node = node_of[key] if node_of is not None else self.node_for(key)
            groups.setdefault(node, []).append(key)
        return groups

    # -- failure bookkeeping ---------------------------------------------------------------
    def is_down(self, node):
        until = self._down_until.get(node)
        return until is not None and time.monotonic() < until

    def _skip_if_down(self, node, force=False):
        if not force and self.is_down(node):
            stats["skipped"] += 1
            raise CacheUnavailable(node, "skipped (failed recently)", attempted=False)

    def _fail(self, node, exc):
        """``node`` failed with ``exc``: close its connection (every batch in flight on it is
        lost), skip it for the retry interval, raise :class:`CacheUnavailable`.

        The close is abortive (RST): commands the kernel still queues must never reach the
        server.  A graceful close leaves them to TCP's retransmissions, which after a partition
        arrive seconds after the link is back, after the repair pass flushed the server: an
        ``add`` computed before the partition then lands in the emptied server and stays."""
        client = self.client.clients[node]
        if client.sock is not None:
            try:
                client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT)
            except OSError:
                pass
        client.close()
        wire = self._wires.pop(node, None)
        if wire is not None:
            wire.failed = exc
        stats["failures"] += 1
        self._down_until[node] = time.monotonic() + self.retry_interval
        logger.warning("memcached %s failed: %s", node, exc or type(exc).__name__)
        raise CacheUnavailable(node, exc or type(exc).__name__) from exc

    def _run(self, node, func, force=False):
        """``func(client)`` with pymemcache's own commands, which read their replies at once."""
        self._skip_if_down(node, force)
        client = self.client.clients[node]
        try:
            wire = self._wires.get(node)
            if wire is not None and wire.sock is client.sock:
                wire.drain()         # batches in flight come first on the connection
            result = func(client)
        except _IO_ERRORS as exc:
            self._fail(node, exc)
        self._down_until.pop(node, None)
        return result

    # -- pipelined batches -----------------------------------------------------------------
    def _send(self, node, commands, parse):
        """Send ``commands`` (a list of commands, or (bytes, how many commands they are)), each
        answered by one line; returns their :class:`Pending`."""
        self._skip_if_down(node)
        client = self.client.clients[node]
        try:
            if client.sock is None:
                client._connect()
            wire = self._wires.get(node)
            if wire is None or wire.sock is not client.sock:
                wire = self._wires[node] = _Wire(client.sock)
            batch = wire.send(commands)
        except _IO_ERRORS as exc:
            self._fail(node, exc)
        return Pending(self, node, wire, batch, parse)

    def _receive(self, pending):
        wire = pending.wire
        if wire.failed is not None:
            raise CacheUnavailable(pending.node, f"connection lost: {wire.failed}")
        try:
            lines = wire.receive(pending.batch)
        except _IO_ERRORS as exc:
            self._fail(pending.node, exc)
        self._down_until.pop(pending.node, None)
        return lines

    # -- operations on one server ----------------------------------------------------------
    def request_uniques(self, node, keys):
        """Send ``mg <key> c`` for ``keys`` (the cas unique without the value, which the writer
        does not need); the :class:`Pending`'s result is {key: cas unique} of those present."""
        keys = list(keys)
        data = ("mg " + " c\r\nmg ".join(keys) + " c\r\n").encode("ascii") if keys else b""
        return self._send(node, (data, len(keys)), lambda replies: _uniques(keys, replies))

    def request_cas_or_add(self, node, keys, values, uniques, expire):
        """Send, for each of ``keys`` with its value in ``values``, ``cas`` with its unique in
        ``uniques`` {key: cas unique}, or ``add`` where it has none (the writer's step 3); the
        :class:`Pending`'s result is the list of replies, in the order of ``keys``."""
        expire = int(expire)
        # each command's line formatted as text and encoded at once (a fan-out sends 20,000),
        # then joined with its value: line, value, line, value, ... each followed by \r\n
        lines = "\n".join([f"cas {key} 0 {expire} {len(value)} {uniques[key]}" if key in uniques
                           else f"add {key} 0 {expire} {len(value)}"
                           for key, value in zip(keys, values)]).encode("ascii").split(b"\n")
        if len(lines) != len(keys):
            raise ValueError(f"a key holds a line break: {[k for k in keys if chr(10) in k][:1]}")
        parts = [b""] * (2 * len(lines))
        parts[0::2] = lines
        parts[1::2] = values
        parts.append(b"")
        return self._send(node, (b"\r\n".join(parts), len(lines)), None)

    def request_stores(self, node, ops, expire):
        """Send ``ops`` = [(command, key, value, cas)] with command b"cas" or b"add"; the
        :class:`Pending`'s result is {key: reply} (b"STORED", b"EXISTS", b"NOT_FOUND" or
        b"NOT_STORED")."""
        expire_b = str(int(expire)).encode()
        # formatted inline, no call per command: a fan-out builds 20,000 of them
        commands = [_CAS % (key.encode("ascii"), expire_b, len(value), cas, value) if command == b"cas"
                    else _STORE % (command, key.encode("ascii"), expire_b, len(value), value)
                    for command, key, value, cas in ops]
        return self._send(node, commands, lambda replies: dict(zip([op[1] for op in ops], replies)))

    def store_many(self, node, ops, expire):
        return self.request_stores(node, ops, expire).result() if ops else {}

    def delete_many(self, node, keys):
        if keys:
            self._send(node, [b"delete %s\r\n" % k.encode("ascii") for k in keys], None).result()

    def get_many(self, node, keys):
        def run(client):
            found = {}
            for start in range(0, len(keys), GET_CHUNK):
                found.update(client.get_many(keys[start:start + GET_CHUNK]))
            return found

        return self._run(node, run)

    def flush(self, node):
        """``flush_all`` on ``node``, tried even if it failed recently."""
        return self._run(node, lambda client: client.flush_all(noreply=False), force=True)

    def add(self, key, value, expire):
        """One ``add``; True if stored, False if the key existed."""
        node = self.node_for(key)
        return self.store_many(node, [(b"add", key, value, None)], expire)[key] == b"STORED"

    def keys_on(self, node):
        """Every key ``node`` holds (``lru_crawler metadump all``), for the checker, which must
        find per-object answers without knowing their objects.  On a connection of its own, so
        that the dump (one line per key) never sits between a batch and its replies.  Raises
        :class:`CacheUnavailable` when the server cannot be reached or refuses to list."""
        server = self.client.clients[node].server
        try:
            family = socket.AF_UNIX if isinstance(server, str) else socket.AF_INET6 if ":" in server[0] else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(max(self.timeout, 5.0))
                sock.connect(server)
                for _ in range(DUMP_TRIES):
                    sock.sendall(b"lru_crawler metadump all\r\n")
                    data = _read_dump(sock)
                    if not data.startswith(b"BUSY"):
                        break
                    time.sleep(0.2)          # another dump is running: memcached runs one at a time
        except (OSError, ValueError) as exc:
            raise CacheUnavailable(node, f"cannot list its keys: {exc}") from exc
        if not data.endswith(b"END\r\n"):
            reason = data.split(b"\r\n", 1)[0].decode("ascii", "replace")[:200]
            raise CacheUnavailable(node, f"cannot list its keys: {reason} (memcached >= 1.5 lists them)")
        return [urllib.parse.unquote(line[4:].split(" ", 1)[0])
                for line in data[:-5].decode("ascii", "replace").splitlines() if line.startswith("key=")]

    def close(self):
        for client in self.client.clients.values():
            client.close()
        self._wires.clear()


_IO_ERRORS = (OSError, socket.timeout, MemcacheError, ValueError)
_ABORT = struct.pack("ii", 1, 0)         # SO_LINGER on, 0 s: close() discards and sends RST


class Pending:
    """A batch sent to one server whose replies are still to be read: :meth:`result` reads them
    (after the replies of the batches sent before it on that connection) and returns them parsed.
    Raises :class:`CacheUnavailable` if the server failed meanwhile."""

    __slots__ = ("cache", "node", "wire", "batch", "parse")

    def __init__(self, cache, node, wire, batch, parse):
        self.cache, self.node, self.wire, self.batch, self.parse = cache, node, wire, batch, parse

    def result(self):
        replies = self.cache._receive(self)
        return replies if self.parse is None else self.parse(replies)


#: replies to ``mg <key> c`` as memcached gives them: ``HD c<unique>`` or ``EN`` (a miss)
_PLAIN_UNIQUES = re.compile(rb"(?:(?:HD c[0-9]+|EN)\r\n)*\Z")


def _uniques(keys, replies):
    if _PLAIN_UNIQUES.match(b"\r\n".join(replies) + b"\r\n" if replies else b""):
        # the usual replies, checked in C at once: no check per line
        return {key: int(reply[4:]) for key, reply in zip(keys, replies) if reply != b"EN"}
    found = {}
    for key, reply in zip(keys, replies):
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


#: storage commands with their data blocks (flags 0): ``cas`` with its unique, ``add`` without
_CAS = b"cas %s 0 %s %d %d\r\n%s\r\n"
_STORE = b"%s %s 0 %s %d\r\n%s\r\n"


class _Batch:
    """The reply lines of one batch of commands, each answered by one line."""

    __slots__ = ("want", "lines")

    def __init__(self, want):
        self.want = want
        self.lines = []


class _Wire:
    """Batches in flight on one connection, answered in the order they were sent.

    :meth:`send` writes a batch whole and returns at once; :meth:`receive` reads until that
    batch's replies are in, handing the lines before them to the batches sent earlier.  While a
    batch goes out, what memcached has answered so far is read: it never stalls on replies
    nobody reads while we stall on commands it does not read (two full socket buffers), however
    large the batches.  The socket keeps pymemcache's timeout: each wait is bounded by it."""

    def __init__(self, sock):
        self.sock = sock
        self.batches = collections.deque()       # sent, replies not all read yet
        self.partial = b""                       # bytes after the last complete line
        self.failed = None                       # the error that lost the connection
        self._poll = None

    def send(self, commands):
        """Write ``commands`` (a list of commands, or (bytes, how many commands they are)) whole;
        returns their :class:`_Batch`."""
        if type(commands) is tuple:
            data, count = commands
        else:
            data, count = b"".join(commands), len(commands)
        batch = _Batch(count)
        if not count:
            return batch             # complete as it is: nothing to wait for
        self.batches.append(batch)
        data = memoryview(data)
        while data:
            sent = self.sock.send(data) if self._writable() else 0
            data = data[sent:]
        return batch

    def receive(self, batch):
        while len(batch.lines) < batch.want:
            self._read()
        if not self.batches and self._ready(0) & select.POLLIN:
            self._read()             # nothing may follow the last reply (raises if a line does)
        return batch.lines

    def drain(self):
        while self.batches:
            self._read()

    def _ready(self, timeout):
        """poll(2) events of the socket (within ``timeout`` seconds, None: forever); 0 if none."""
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.sock.fileno(), select.POLLIN | select.POLLOUT)
        events = self._poll.poll(None if timeout is None else timeout * 1000)
        return events[0][1] if events else 0

    def _writable(self):
        """Wait until the socket takes bytes, reading replies that arrive meanwhile."""
        ready = self._ready(self.sock.gettimeout())
        if not ready:
            raise socket.timeout("memcached took no commands within the timeout")
        if ready & (select.POLLIN | select.POLLHUP):
            self._read()             # replies, or the end of the connection (raises)
        elif ready & select.POLLERR:
            raise MemcacheError("connection failed")
        return ready & select.POLLOUT

    def _read(self):
        """One recv (waiting up to the timeout); complete lines go to the batches in order."""
        data = self.sock.recv(RECV_SIZE)
        if not data:
            raise MemcacheError("connection closed by the server")
        if self.partial:
            data = self.partial + data
        if b"ERROR" in data:
            _refuse_errors(data)
        lines = data.split(b"\r\n")
        self.partial = lines.pop()
        at = 0
        while at < len(lines):
            if not self.batches:
                raise MemcacheError(f"{len(lines) - at} reply line(s) no command asked for")
            batch = self.batches[0]
            take = batch.want - len(batch.lines)
            batch.lines += lines[at:at + take]
            at += take
            if len(batch.lines) == batch.want:
                self.batches.popleft()


def _read_dump(sock):
    """One reply to ``lru_crawler metadump``: its lines up to ``END``, or a one-line refusal."""
    chunks, tail = [], b""
    while True:
        chunk = sock.recv(RECV_SIZE)
        if not chunk:
            raise ValueError("connection closed during the dump")
        chunks.append(chunk)
        tail = (tail + chunk)[-64:]
        if tail.endswith(b"END\r\n") or (len(chunks) == 1 and chunk.startswith(_DUMP_REFUSALS) and chunk.endswith(b"\r\n")):
            return b"".join(chunks)


def _refuse_errors(data):
    """A reply line ``ERROR``, ``CLIENT_ERROR ...`` or ``SERVER_ERROR ...`` fails the connection
    (no other reply of ours contains the word)."""
    for line in data.split(b"\r\n"):
        if line.startswith((b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR")):
            raise MemcacheError(line.decode("ascii", "replace"))


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
