"""Notices to fastpath: "these keys changed", sent after the writer's stores succeed.

A notice is a hint that wakes held long-polls sooner; memcached stays the truth, so a notice is
sent once, never retried, and a failure is counted and logged, never raised (docs/consistency.md,
"Notices to fastpath"; the wire format is docs/contract.md, section 7).

The backend is any object with ``send(keys)``, chosen by dotted path in
``PLURKCORE["NOTIFY_BACKEND"]``; :func:`get_backend` builds it once per configuration.
:func:`keys_stored` is the receiver of :data:`plurkcore.signals.answers_stored` (connected in
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

logger = logging.getLogger("plurkcore.notify")

MAGIC = b"PN1"
MAX_DATAGRAM = 4096
#: "PN1 " + 16 hex + " " + at most 20 digits + "\n" is 42 bytes; the rest is for keys.
HEADER_ROOM = 64
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
_FAILURES = {errno.ENOENT: "missing", errno.ECONNREFUSED: "refused", errno.EAGAIN: "full"}


class Notifier:
    """The backend interface: ``send(keys)`` with an iterable of key strings; never raises."""

    def send(self, keys):
        raise NotImplementedError


class NullNotifier(Notifier):
    def send(self, keys):
        pass


def batches(keys, limit=MAX_DATAGRAM - HEADER_ROOM):
    """Split ``keys`` into bodies of ``key\\n`` lines of at most ``limit`` bytes each."""
    body, out = [], []
    size = 0
    for key in keys:
        line = key.encode("ascii") + b"\n"
        if body and size + len(line) > limit:
            out.append(b"".join(body))
            body, size = [], 0
        body.append(line)
        size += len(line)
    if body:
        out.append(b"".join(body))
    return out


class _Sender:
    """This process's identity on the wire: a random sender id and a seq per destination path.
    Rebuilt in a forked child (two processes must never share a sender id)."""

    def __init__(self):
        self.pid = os.getpid()
        self.id = os.urandom(8).hex().encode()
        self.seqs = {}
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)

    def next_seq(self, path):
        seq = self.seqs.get(path, 0) + 1
        self.seqs[path] = seq
        return seq

    def close(self):
        self.sock.close()


_sender = None
_lock = threading.Lock()
_last_log = {}


def _current_sender():
    """The sender of this process (call with ``_lock`` held)."""
    global _sender
    if _sender is None or _sender.pid != os.getpid():
        # in a forked child the parent's socket is shared: leave it to the parent, open our own
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


def _log_failure(kind, path, exc):
    """At most one line per kind of failure every LOG_INTERVAL seconds."""
    now = time.monotonic()
    if now - _last_log.get(kind, -LOG_INTERVAL) < LOG_INTERVAL:
        return
    _last_log[kind] = now
    logger.warning("notice to %s not sent (%s): %s; %d such failures so far", path, kind, exc, stats[kind])


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


class UnixDatagramNotifier(Notifier):
    """Sends each batch of keys to every fastpath worker socket in ``dirs`` (default
    ``PLURKCORE["NOTIFY_DIRS"]``).  The directories are listed on every send: a worker that
    starts or restarts (re-binding its path) is reached by the next notice."""

    def __init__(self, dirs=None):
        self.dirs = list(conf.get_config()["NOTIFY_DIRS"] if dirs is None else dirs)

    def send(self, keys):
        if not self.dirs:
            return
        bodies = batches(sorted(keys))
        if not bodies:
            return
        paths = socket_paths(self.dirs)
        if not paths:
            return
        stats["notices"] += 1
        with _lock:
            sender = _current_sender()
            for path in paths:
                _send_path(sender, path, bodies)


def _send_path(sender, path, bodies):
    """Send every body to ``path``, in order.  The first failure gives the path up for this
    notice; its seqs are still spent, so the receiver sees the gap at the next datagram."""
    waiting = None                 # a connected socket once the queue was found full
    failed = None
    try:
        for body in bodies:
            datagram = b"%s %s %d\n%s" % (MAGIC, sender.id, sender.next_seq(path), body)
            if failed is not None:
                stats[failed] += 1
                continue
            try:
                if waiting is None:
                    try:
                        sender.sock.sendto(datagram, path)
                    except BlockingIOError:
                        waiting = _connected(path, time.monotonic() + FULL_WAIT)
                        waiting.send(datagram)
                else:
                    waiting.send(datagram)
            except OSError as exc:
                failed = "full" if isinstance(exc, (TimeoutError, BlockingIOError)) else \
                    _FAILURES.get(exc.errno, "errors")
                stats[failed] += 1
                _log_failure(failed, path, exc)
            else:
                stats["datagrams"] += 1
    finally:
        if waiting is not None:
            waiting.close()


class _Deadline(socket.socket):
    """A connected datagram socket whose sends wait for room until a deadline (a connected
    unix datagram socket polls writable when the peer's queue has room)."""

    def send(self, data):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the receiver's queue stayed full")
        self.settimeout(left)
        return super().send(data)


def _connected(path, deadline):
    sock = _Deadline(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.deadline = deadline
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


_backend = None


def get_backend():
    """The configured backend (PLURKCORE["NOTIFY_BACKEND"]), built once per configuration."""
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
