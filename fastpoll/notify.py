"""Notices to fastpath: "these keys changed", sent after the writer's stores succeed.

A notice is a hint that wakes held long-polls sooner; memcached stays the truth, so a notice is
sent once, never retried, and a failure is counted and logged, never raised (docs/consistency.md,
"Notices to fastpath"; the wire format is docs/contract.md, section 7).

The backend is any object with ``send(keys)``, chosen by dotted path in
``FASTPOLL["NOTIFY_BACKEND"]``; :func:`get_backend` builds it once per configuration.  Two are
here: :class:`UnixDatagramNotifier` (the fastpath workers of this host, ``NOTIFY_DIRS``) and
:class:`UdpNotifier` (every worker of every web host, ``NOTIFY_UDP``); the same datagrams.
:func:`keys_stored` is the receiver of :data:`fastpoll.signals.answers_stored` (connected in
``PlurkCoreConfig.ready()``).
"""
import errno
import logging
import os
import socket
import threading
import time

from django.utils.module_loading import import_string

from . import conf
from .cache import parse_server

logger = logging.getLogger("fastpoll.notify")

MAGIC = b"PN1"
#: A datagram's largest size, as fastpath reads it, and what a unix notice is cut to: a fan-out's
#: chunk of 2,000 keys is one datagram per worker, well within the 10 a socket queues
#: (net.unix.max_dgram_qlen).  At 4096 bytes it was 11, and a 10,000-key notice 62 per worker:
#: behind a worker busy answering for longer than FULL_WAIT, the tail was dropped and its polls
#: waited for fastpath's re-read (3.9 s in one bench round of five).
MAX_DATAGRAM = 65536
#: What a UDP notice is cut to: a datagram that crosses a network as a few IP fragments, not 45
#: (losing any one fragment loses the datagram).
MAX_UDP_DATAGRAM = 4096
#: "PN1 " + 16 hex + " " + at most 20 digits + "\n" is 42 bytes; the rest is for keys.
HEADER_ROOM = 64
#: The sending socket's buffer: a unix datagram counts against it until the worker reads it, so
#: the default (208 KiB) would hold a 10,000-key notice to one worker and no more.
SEND_BUFFER = 4 << 20
SOCKET_SUFFIX = ".sock"
#: seconds between two log lines about the same kind of failure.
LOG_INTERVAL = 10.0
#: seconds one notice may wait, per destination, for room in a full socket queue.  A unix
#: datagram socket queues only net.unix.max_dgram_qlen (often 10) datagrams: a fan-out of
#: thousands of keys outruns even a busy reader, and a lost tail datagram is only noticed at the
#: next notice or re-read.  Bounded, so a stopped fastpath worker costs a write this much at most.
FULL_WAIT = 0.05

#: Counters since process start: datagrams sent, and failed sends by cause.
stats = {"notices": 0, "datagrams": 0, "missing": 0, "refused": 0, "full": 0, "errors": 0}

#: errno of a failed sendto -> its counter in ``stats``
_FAILURES = {errno.ENOENT: "missing", errno.ECONNREFUSED: "refused", errno.EAGAIN: "full",
             errno.ENOBUFS: "full"}


class Notifier:
    """The backend interface: ``send(keys)`` with an iterable of key strings; never raises."""

    def send(self, keys):
        raise NotImplementedError


class NullNotifier(Notifier):
    def send(self, keys):
        pass


def batches(keys, limit=MAX_DATAGRAM - HEADER_ROOM):
    """Split ``keys`` into bodies of ``key\\n`` lines of at most ``limit`` bytes each (a line
    longer than ``limit`` is a body of its own)."""
    data = "".join([key + "\n" for key in keys]).encode("ascii")
    out = []
    start, end = 0, len(data)
    while end - start > limit:
        cut = data.rfind(b"\n", start, start + limit)
        if cut < 0:
            cut = data.find(b"\n", start)
        out.append(data[start:cut + 1])
        start = cut + 1
    if start < end:
        out.append(data[start:])
    return out


class _Sender:
    """This process's identity on the wire: a random sender id and a seq per destination (a
    socket path, or a (host, port) pair), one unix datagram socket and one connected UDP socket
    per UDP destination.  Rebuilt in a forked child (two processes must never share a sender
    id)."""

    def __init__(self):
        self.pid = os.getpid()
        self.id = os.urandom(8).hex().encode()
        self.seqs = {}
        self.sock = _unix_datagram_socket()
        self.sock.setblocking(False)
        self.udp = {}

    def next_seq(self, dest):
        seq = self.seqs.get(dest, 0) + 1
        self.seqs[dest] = seq
        return seq

    def udp_socket(self, dest):
        """The non-blocking UDP socket connected to ``dest``: connected so that an ICMP "port
        unreachable" comes back as ECONNREFUSED on a later send (an unconnected socket never
        reports it), and the route is looked up once."""
        sock = self.udp.get(dest)
        if sock is None:
            host, port = dest
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
            try:
                sock.setblocking(False)
                sock.connect((host, port))
            except OSError:
                sock.close()
                raise
            self.udp[dest] = sock
        return sock

    def forget_udp(self, dest):
        sock = self.udp.pop(dest, None)
        if sock is not None:
            sock.close()

    def close(self):
        self.sock.close()
        for dest in list(self.udp):
            self.forget_udp(dest)


_sender = None
_lock = threading.Lock()
_last_log = {}


def _current_sender():
    """The sender of this process (call with ``_lock`` held)."""
    global _sender
    if _sender is None or _sender.pid != os.getpid():
        # in a forked child the parent's sockets are shared: leave them to the parent, open ours
        _sender = _Sender()
    return _sender


def _after_fork_in_child():
    # another thread of the parent may have held the lock at the fork: it never unlocks here
    global _lock, _sender
    _lock, _sender = threading.Lock(), None


os.register_at_fork(after_in_child=_after_fork_in_child)


def sender_id():
    with _lock:
        return _current_sender().id.decode()


def _log_failure(kind, name, exc):
    """At most one line per kind of failure every LOG_INTERVAL seconds."""
    now = time.monotonic()
    if now - _last_log.get(kind, -LOG_INTERVAL) < LOG_INTERVAL:
        return
    _last_log[kind] = now
    logger.warning("notice to %s not sent (%s): %s; %d such failures so far", name, kind, exc, stats[kind])


def _failure_kind(exc):
    if isinstance(exc, (TimeoutError, BlockingIOError)):
        return "full"
    return _FAILURES.get(exc.errno, "errors")


def socket_paths(dirs):
    """Every ``*.sock`` in ``dirs``, sorted; a missing or unreadable directory has none."""
    paths = []
    for directory in dirs:
        try:
            with os.scandir(directory) as entries:
                paths.extend(entry.path for entry in entries if entry.name.endswith(SOCKET_SUFFIX))
        except OSError:
            continue
    return sorted(paths)


class _DatagramNotifier(Notifier):
    """What every datagram transport shares: batching, this process's sender id and a seq per
    destination, one failure giving a destination up for the rest of the notice (its seqs
    still spent, so the receiver sees the gap at the next datagram), counting and rate-limited
    logging.  A transport says where (``destinations()``) and how (``_channel(sender, dest)``:
    an object with ``name``, ``send(datagram)`` raising OSError, and ``close()``)."""

    #: the largest datagram this transport sends
    max_datagram = MAX_DATAGRAM

    def destinations(self):
        raise NotImplementedError

    def _channel(self, sender, dest):
        raise NotImplementedError

    def send(self, keys):
        bodies = batches(sorted(keys), self.max_datagram - HEADER_ROOM)
        if not bodies:
            return
        dests = self.destinations()
        if not dests:
            return
        stats["notices"] += 1
        with _lock:
            sender = _current_sender()
            for dest in dests:
                channel = self._channel(sender, dest)
                try:
                    _send_bodies(sender, dest, bodies, channel)
                finally:
                    channel.close()


def _send_bodies(sender, dest, bodies, channel):
    """Send every body to ``dest`` through ``channel``, in order, until the first failure."""
    failed = None
    for body in bodies:
        datagram = b"%s %s %d\n%s" % (MAGIC, sender.id, sender.next_seq(dest), body)
        if failed is not None:
            stats[failed] += 1
            continue
        try:
            channel.send(datagram)
        except OSError as exc:
            failed = _failure_kind(exc)
            stats[failed] += 1
            _log_failure(failed, channel.name, exc)
        else:
            stats["datagrams"] += 1


class UnixDatagramNotifier(_DatagramNotifier):
    """Sends each batch of keys to every fastpath worker socket in ``dirs`` (default
    ``FASTPOLL["NOTIFY_DIRS"]``).  The directories are listed on every send: a worker that
    starts or restarts (re-binding its path) is reached by the next notice."""

    def __init__(self, dirs=None):
        self.dirs = list(conf.get_config()["NOTIFY_DIRS"] if dirs is None else dirs)

    def destinations(self):
        return socket_paths(self.dirs) if self.dirs else []

    def _channel(self, sender, dest):
        return _UnixChannel(sender.sock, dest)


class _UnixChannel:
    """sendto on the shared socket; once the receiver's queue is full, a connected socket that
    waits for room until FULL_WAIT from then."""

    def __init__(self, sock, path):
        self.sock, self.name = sock, path
        self.waiting = None

    def send(self, datagram):
        if self.waiting is None:
            try:
                self.sock.sendto(datagram, self.name)
                return
            except BlockingIOError:
                self.waiting = _connected(self.name, time.monotonic() + FULL_WAIT)
        self.waiting.send(datagram)

    def close(self):
        if self.waiting is not None:
            self.waiting.close()


class _Deadline(socket.socket):
    """A connected datagram socket whose sends wait for room until a deadline (a connected
    unix datagram socket polls writable when the peer's queue has room)."""

    def send(self, data):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the receiver's queue stayed full")
        self.settimeout(left)
        return super().send(data)


def _unix_datagram_socket(cls=socket.socket):
    """A unix datagram socket with its send buffer raised to SEND_BUFFER (best effort: the
    kernel caps it at net.core.wmem_max).  A datagram counts against the buffer until the worker
    reads it, and a connected socket polls writable only while a quarter of it is in flight."""
    sock = cls(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    return sock


def _connected(path, deadline):
    sock = _unix_datagram_socket(_Deadline)
    sock.deadline = deadline
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def parse_udp_destination(text):
    """``"host:port"`` / ``"[v6]:port"`` -> (host, port); ValueError if it is not one (the grammar
    of a memcached server spec)."""
    return parse_server(text)


class UdpNotifier(_DatagramNotifier):
    """Sends each batch of keys to every ``"host:port"`` of ``destinations`` (default
    ``FASTPOLL["NOTIFY_UDP"]``), each one fastpath worker's port (--notify-udp), on whatever
    host it is.  Never waits: a send the kernel cannot take at once (EAGAIN, ENOBUFS) counts as
    "full"; a port where nothing listens is found by the ICMP error of an earlier send and
    counts as "refused"."""

    max_datagram = MAX_UDP_DATAGRAM

    def __init__(self, destinations=None):
        entries = conf.get_config()["NOTIFY_UDP"] if destinations is None else destinations
        self.dests = [parse_udp_destination(entry) for entry in entries]

    def destinations(self):
        return self.dests

    def _channel(self, sender, dest):
        return _UdpChannel(sender, dest)


class _UdpChannel:
    def __init__(self, sender, dest):
        self.sender, self.dest = sender, dest
        host, port = dest
        self.name = f"udp:[{host}]:{port}" if ":" in host else f"udp:{host}:{port}"

    def send(self, datagram):
        try:
            try:
                self.sender.udp_socket(self.dest).send(datagram)
            except ConnectionRefusedError as exc:
                # the error of an earlier datagram (nobody listened then): counted once, and
                # this one is tried again, so a worker that came back since loses nothing
                stats["refused"] += 1
                _log_failure("refused", self.name, exc)
                self.sender.udp_socket(self.dest).send(datagram)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.ENOBUFS, errno.ECONNREFUSED):
                self.sender.forget_udp(self.dest)       # connect again next time
            raise

    def close(self):
        pass


_backend = None


def get_backend():
    """The configured backend (FASTPOLL["NOTIFY_BACKEND"]), built once per configuration."""
    global _backend
    if _backend is None:
        _backend = import_string(conf.get_config()["NOTIFY_BACKEND"])()
    return _backend


@conf.on_reset
def _reset():
    global _backend
    _backend = None


def keys_stored(sender, keys=(), deleted=(), **kwargs):
    """Receiver of ``signals.answers_stored``: notify the stored and deleted keys."""
    changed = set(keys) | set(deleted)
    if not changed:
        return
    try:
        get_backend().send(changed)
    except Exception:
        # a broken backend must not fail the writer; the answer reaches clients by re-reads
        stats["errors"] += 1
        logger.exception("notifying %d key(s) failed", len(changed))
