"""Plurk users for locust: sign up or log in, follow a skewed social graph, keep a long-poll in
flight (or poll every couple of seconds), post and respond now and then, mark read what they have
seen.

    locust -f locustfiles/plurkers.py                     # web UI; host: PLURK_HTTP (127.0.0.1:8080)
    locust -f locustfiles/plurkers.py --headless -u 30 -r 10 -t 60s
    locust -f locustfiles/plurkers.py --host http://127.0.0.1:8080 --headless -u 300 -r 50 -t 60s
    .venv/bin/python bench/load.py [--processes 2] ...    # pre-made accounts, merged verdict

The default host is nginx's public address from ``PLURK_HTTP`` (read by plurksite/config.py, which
is Django-free); ``--host`` overrides it.  Users are FastHttpUser (geventhttpclient): several times
cheaper per request than HttpUser (requests), which matters when locust shares 2 cores with the
stack it measures.

Accounts.  Without ``$PLURK_LOAD_SETUP`` every user signs up (``/api/signup``, a password hashed
by Django: ~0.5 s of CPU each) and follows a few users signed up before it.  bench/load.py writes
that JSON file: ``celebrities`` (pre-made logged-in accounts, exactly one Celebrity user each),
``logins`` (accounts with a known password: the first ordinary users log in with ``/api/login``)
and ``users`` (pre-made logged-in accounts, with their bulk-made follows if any); an ordinary user
left without one signs up.  No two users get the same account, in one process or across
``--processes N`` / master-worker processes: every account is handed out once per test by a
counter in the process that runs the test (the only one, or the master, which the workers ask with
a custom message), never by an offset computed at import time (locust imports this file *before*
``--processes`` forks, so such an offset is the same in every worker).

Delivery, in locust itself: every first sight of a plurk by a follower is a ``delivery`` request
in locust's statistics (response time = from the plurk's ``created`` on the server to its first
sight, for plurks created after the follower started; same clock when locust runs on the stack's
machine; one seen before its ``created`` is a failed delivery request naming the clocks, never
0 ms).  When the test stops, each process that ran users prints one ``delivery (...)`` line:
plurks, deliveries checked, messages lost, latency from the plurk's ``created`` to first sight, poll hit ratio
(``X-Cache``), by the rule of plurksite/delivery.py applied to its own records; a loss sets
the process's exit code to 1, which in a single-process run is locust's exit status (failed
requests and exceptions in tasks already make it 1).  With several processes a worker judges only
what its own users posted and saw, and the master's status does not include it: the authority is
bench/load.py, which merges every process's records.

Records: every process that runs users writes what it posted, followed, polled and saw to
``$PLURK_LOAD_RECORDS/<pid>.json`` -- a consistent snapshot every few seconds while the test
runs, and again when it stops and when the process quits (in ``--processes`` mode the master may
SIGINT a worker that is slow to stop; the last snapshot is then at most a few seconds old, and a
snapshot never holds a poll without what that poll saw).

A poll answer that is not what the API promises (a 200 that is not JSON, a body without its
fields) is a request *failure*, never an exception that would leave the poll unrecorded.

Polling modes (``--poll-mode`` on locust's command line, or ``$PLURK_LOAD_POLL_MODE``):
  long (default)  each user keeps one getUnreadCount in flight with ``Prefer: wait=N`` and the
                  ETag of its last answer (If-None-Match), in a greenlet of its own, as the page
                  does: fastpath holds it until the count changes (then getMessages) or the wait
                  ends (304), and it is sent again at once when the answer carried
                  Preference-Applied; otherwise (Django answered: fastpath down, or a fastpath
                  that does not hold) after the poll wait, so it never spins.  Errors back off
                  with jitter.  Held polls are named ``/Poll/getUnreadCount (held)`` in locust's
                  statistics (their time is mostly waiting); the poll task weight then idles, so
                  users post and respond as often as in the short mode.
  short           every user's poll task asks getUnreadCount (and getMessages when the count
                  differs from what was shown) every couple of seconds: the comparison.
  stream          each user keeps one Server-Sent Events stream of both its resources open,
                  ``/Poll/getUnreadCount,getMessages`` as the timeline page does
                  (``Accept: text/event-stream``, ``Last-Event-ID`` of its last event), in a
                  greenlet of its own with a socket of its own (geventhttpclient would read the
                  body to its end): a ``getUnreadCount`` event is the count, a ``getMessages``
                  event the messages, read from the event itself (nothing is fetched; a plurk is
                  first seen when the event carrying it is read), a heartbeat comment is nothing,
                  the end of a stream (its --max-stream, Django's one-event-per-resource stream)
                  is followed by a new one after the stream's ``retry:`` (1 s), as a browser's.  The
                  stream goes to fastpath's edge when there is one (``$PLURK_LOAD_EDGE``
                  host:port, else the stack's PLURK_EDGE), else through nginx (the locust host);
                  ``$PLURK_LOAD_STREAM_VIA=nginx`` forces nginx.  On the edge a miss (``event:
                  miss``, or a 409 ``X-Cache: MISS``) is asked of the site once (a poll of each
                  resource through nginx: Django fills the cache), then the stream opens again.
                  Streams are named ``/Poll/getUnreadCount,getMessages (stream)`` (response time:
                  until the head) and, on the edge, ``/Poll/getUnreadCount,getMessages (edge
                  stream)``.  A user's poll counts as complete (the judge's "polls") from the
                  latest moment its last getMessages event is known to be as new as: the
                  stream's request (every event was read after it) or the newest item's
                  ``created`` (the event was read after that item was written), never the moment
                  the event is handled: an event read before a commit may still be on its way.
Delivery latency is measured the same way in all three, from the plurk's ``created`` to its first sight.
Both read as the page does: what was shown is marked read (one markRead) once it has been seen
``PLURK_LOAD_READ_AFTER_S``; in long mode a hold then ends when the read falls due.

Knobs (environment), for a polling-heavy run such as 10,000 users on 2 cores:
  PLURK_LOAD_POLL_WAIT    mean seconds between an ordinary user's actions (default 2, jitter
                          +-25%); Plurk's pollers asked every few to tens of seconds
  PLURK_LOAD_WRITE_WEIGHT task weight of posting and of responding against 30 for polling (default 1)
  PLURK_LOAD_CELEB_WAIT   mean seconds between a celebrity's actions (default 3)
  PLURK_LOAD_POLL_MODE    long (default), short or stream, as --poll-mode
  PLURK_LOAD_EDGE         host:port of fastpath's edge listener, for the stream mode
  PLURK_LOAD_STREAM_VIA   edge (default when an edge is known) or nginx
  PLURK_LOAD_LONGPOLL_WAIT  N of ``Prefer: wait=N`` (default 50, below fastpath's 55 s max wait)
  PLURK_LOAD_READ_AFTER_S   seconds what was shown stays unread before markRead (default 3, the
                          page's READ_AFTER_MS; 0: marked read at once after every answer)
"""
import datetime
import json
import logging
import math
import os
import random
import socket
import sys
import threading
import time
import urllib.parse
import uuid

import gevent
import gevent.event
from locust import between, events, task
from gevent import socket as gsocket
from locust.contrib.fasthttp import FastHttpUser
from locust.runners import MasterRunner, WorkerRunner

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
for _path in (_HERE, _ROOT):        # plurksite.delivery and plurksite.config (no Django)
    if _path not in sys.path:
        sys.path.append(_path)

from plurksite import delivery as _delivery  # noqa: E402
from plurksite.config import ConfigError  # noqa: E402
from plurksite.config import load as _load_config  # noqa: E402

try:
    _CONFIG = _load_config()
    DEFAULT_HOST = _CONFIG.base_url                 # PLURK_HTTP, parsed as every entry point does
except ConfigError as exc:
    sys.exit(f"error: {exc}")

RECORDS_DIR = os.environ.get("PLURK_LOAD_RECORDS")
RECORDS_EVERY_S = 5
# Knobs for a polling-heavy run (see the module docstring).
POLL_WAIT = float(os.environ.get("PLURK_LOAD_POLL_WAIT", "2"))
WRITE_WEIGHT = int(os.environ.get("PLURK_LOAD_WRITE_WEIGHT", "1"))
CELEB_WAIT = float(os.environ.get("PLURK_LOAD_CELEB_WAIT", "3"))
SETUP_FILE = os.environ.get("PLURK_LOAD_SETUP")
POLL_MODES = ("long", "short", "stream")
STREAM_VIA = os.environ.get("PLURK_LOAD_STREAM_VIA", "")
STREAM_RESOURCES = "getUnreadCount,getMessages"     # the timeline page's one stream
STREAM_QUIET_S = 25 + 15          # fastpath's heartbeat (25 s) + the margin nginx's read timeout has
LONGPOLL_WAIT = int(os.environ.get("PLURK_LOAD_LONGPOLL_WAIT", "50"))
LONGPOLL_QUICK_S = 1.0           # a held 304 sooner than this is not trusted: wait before the next
# What was shown is marked read once it has been on screen this long, as the page does (app.js's
# READ_AFTER_MS), in one markRead for everything shown meanwhile; 0: at once, after every answer.
READ_AFTER_S = float(os.environ.get("PLURK_LOAD_READ_AFTER_S", "3"))
MAX_BACKOFF_S = 30.0
PASSWORD = "load-pass-1"
CLAIM_TIMEOUT_S = 60

log = logging.getLogger(__name__)
_stats_log = logging.getLogger("locust.stats_logger")    # printed like locust's own summary

# The pre-made accounts (data only: which user runs which account is decided per test, see _take).
_celebrities = []                 # [{"username", "token"}]
_logins = []                      # [{"username", "password"}]: these users log in
_accounts = []                    # [{"username", "token", "follows"}]; else users sign up
if SETUP_FILE and os.path.exists(SETUP_FILE):
    with open(SETUP_FILE) as fh:
        _setup = json.load(fh)
    _celebrities = _setup.get("celebrities", [])
    _logins = _setup.get("logins", [])
    _accounts = _setup.get("users", [])

_lock = threading.Lock()
_runner = None                    # this process's locust runner (set on init, after any fork)
_claims = {}                      # kind -> next index to hand out (local runner, or the master)
_pending = {}                     # worker: ticket -> AsyncResult of a claim sent to the master
_known_users = []                 # usernames whose users run in this process (follow targets)


def _new_records():
    return {"pid": os.getpid(), "runner": None, "worker_index": None, "users": 0, "accounts": [],
            "logins": 0, "posts": [], "follows": [], "polls": {}, "seen": [],
            "cache": {"HIT": 0, "MISS": 0}, "truncated": 0, "behind": 0}


_records = _new_records()


# --- handing out accounts: each pre-made account to at most one user of the whole test ---------

def _next_index(kind, size):
    n = _claims.get(kind, 0)
    if n >= size:
        return None
    _claims[kind] = n + 1
    return n


def _take(kind, items):
    """Index of an account of ``kind`` (celebrity, login, account) no other user of this test has
    taken, in any process; None when they are all taken.  Workers ask the master."""
    if not items:
        return None
    if not isinstance(_runner, WorkerRunner):
        return _next_index(kind, len(items))
    ticket = uuid.uuid4().hex
    result = _pending[ticket] = gevent.event.AsyncResult()
    try:
        _runner.send_message("plurkers_claim", {"kind": kind, "size": len(items), "ticket": ticket})
        return result.get(timeout=CLAIM_TIMEOUT_S)
    except gevent.Timeout:
        # an Exception (gevent.Timeout is not one): locust counts it, and the run fails
        raise RuntimeError(f"the master did not hand out a {kind} account within {CLAIM_TIMEOUT_S} s") from None
    finally:
        _pending.pop(ticket, None)


def _on_claim(environment, msg, **kwargs):
    """Master: hand the next index of that kind to the worker that asked."""
    index = _next_index(msg.data["kind"], msg.data["size"])
    environment.runner.send_message("plurkers_claimed", {"ticket": msg.data["ticket"], "index": index},
                                    client_id=msg.node_id)


def _on_claimed(environment, msg, **kwargs):
    """Worker: the master's answer to one of this process's claims."""
    result = _pending.get(msg.data["ticket"])
    if result is not None:
        result.set(msg.data["index"])


# --- responses --------------------------------------------------------------------------------

def _body(resp, statuses, check):
    """Inside ``catch_response``: the JSON body when the status is one of ``statuses`` and
    ``check(body)`` finds nothing wrong; else the request is marked failed and None returned."""
    if resp.status_code not in statuses:
        error = getattr(resp, "error", None)
        resp.failure(f"status {resp.status_code}" + (f" ({error})" if error else ""))
        return None
    try:
        body = json.loads(resp.content)       # not FastResponse.text: no charset detection (UTF-8)
    except (TypeError, ValueError) as exc:
        resp.failure(f"status {resp.status_code} but not JSON ({exc}): {(resp.content or b'')[:40]!r}")
        return None
    problem = check(body) if isinstance(body, dict) else "not an object"
    if problem:
        resp.failure(f"status {resp.status_code}, unexpected body: {problem}")
        return None
    resp.success()
    return body


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _check_token(body):
    return None if isinstance(body.get("token"), str) else "no token"


def _check_id(body):
    return None if _is_int(body.get("id")) else "no id"


def _check_plurk(body):
    """A posted plurk: its id, and its ``created`` (the delivery latency is measured from it)."""
    return _check_id(body) or (None if _created(body) is not None else "no created")


def _check_any(body):
    return None


def _check_count(body):
    return None if _is_int(body.get("count")) else "no count"


def _check_items(body):
    items = body.get("items")
    if not isinstance(items, list):
        return "no items"
    for item in items:
        if not isinstance(item, dict) or not _is_int(item.get("id")) or not isinstance(item.get("kind"), str):
            return "an item without id or kind"
        if item["kind"] == "plurk" and not (isinstance(item.get("created"), str) and isinstance(item.get("author"), str)):
            return "a plurk without created or author"
    return None


def _check_messages(body):
    return _check_count(body) or _check_items(body)


def _check_timeline(body):
    items = body.get("items")
    if not isinstance(items, list) or not all(isinstance(i, dict) and _is_int(i.get("id")) for i in items):
        return "items without ids"
    return None


def _created(item):
    """The plurk's ``created`` (``2026-01-02T03:04:05.678Z``, UTC) as a Unix time, or None."""
    try:
        return datetime.datetime.strptime(item["created"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
    except (KeyError, TypeError, ValueError):
        return None


def _zipf_index(n, s=1.2):
    weights = [1 / (i + 1) ** s for i in range(n)]
    return random.choices(range(n), weights=weights)[0]



def _edge_address():
    """fastpath's edge listener for streams: $PLURK_LOAD_EDGE (host:port), else the stack's
    PLURK_EDGE when its configuration has one; None: no edge."""
    spec = os.environ.get("PLURK_LOAD_EDGE")
    if spec:
        host, _, port = spec.rpartition(":")
        return host.strip("[]"), int(port)
    edge = getattr(_CONFIG, "edge", None)
    return tuple(edge) if edge else None


SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)     # Linux; SCM_TIMESTAMPNS is the same


def _kernel_time(ancillary):
    """The receive time of SCM_TIMESTAMPNS ancillary data (a struct timespec), or None."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = int.from_bytes(data[:8], sys.byteorder), int.from_bytes(data[8:16], sys.byteorder)
            return sec + nsec / 1e9
    return None


class _EventReader:
    """The client side of one Server-Sent Events answer on a socket: the head, then the body's
    events (chunked, Content-Length or until the end), each a dict of its fields (``data`` lines
    joined with LF), comments skipped."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        # when the kernel received the bytes last read (SO_TIMESTAMPNS), against when this
        # greenlet got them: the delivery's split between the stack and locust's own scheduling
        self.arrived = None
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            self.stamped = True
        except OSError:
            self.stamped = False

    def _recv(self, timeout):
        self.sock.settimeout(timeout)
        if self.stamped:
            data, ancillary, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(16))
            self.arrived = _kernel_time(ancillary)
        else:
            data = self.sock.recv(65536)
        if not data:
            raise ValueError("connection closed")
        self.buf += data

    def head(self):
        while b"\r\n\r\n" not in self.buf:
            self._recv(STREAM_QUIET_S)
            if len(self.buf) > 65536:
                raise ValueError("head too long")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        fields = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            fields[k.strip().lower()] = v.strip()
        self.chunked = "chunked" in fields.get("transfer-encoding", "").lower()
        self.left = int(fields["content-length"]) if "content-length" in fields and not self.chunked else None
        return status, fields

    def _body(self, timeout):
        """Body bytes as they come; b"" at the body's end.  None when ``timeout()`` passes quietly
        (the caller may act and ask again)."""
        while True:
            if self.chunked:
                if b"\r\n" in self.buf:
                    size_line, rest = self.buf.split(b"\r\n", 1)
                    size = int(size_line.split(b";")[0], 16)
                    if len(rest) >= size + 2:
                        self.buf = rest[size + 2:]
                        return rest[:size]
            elif self.left is not None:
                if self.left == 0:
                    return b""
                if self.buf:
                    piece, self.buf = self.buf[:self.left], self.buf[self.left:]
                    self.left -= len(piece)
                    return piece
            elif self.buf:
                piece, self.buf = self.buf, b""
                return piece
            try:
                self._recv(timeout())
            except socket.timeout:
                return None
            except ValueError:
                if self.chunked or self.left:
                    raise
                return b""                     # the end of a body framed by the connection's end

    def events(self, timeout):
        """Each event as a dict; None each time ``timeout()`` passed with nothing."""
        text = b""
        while True:
            piece = self._body(timeout)
            if piece is None:
                yield None
                continue
            if piece == b"":
                return
            text += piece.replace(b"\r\n", b"\n")
            while b"\n\n" in text:
                block, text = text.split(b"\n\n", 1)
                event = {}
                for line in block.decode("utf-8").split("\n"):
                    if not line or line.startswith(":"):
                        continue
                    k, _, v = line.partition(":")
                    v = v[1:] if v.startswith(" ") else v
                    event[k] = event[k] + "\n" + v if k == "data" and k in event else v
                if event:
                    yield event


class _Plurker(FastHttpUser):
    abstract = True
    host = DEFAULT_HOST
    wait_time = between(POLL_WAIT * 0.75, POLL_WAIT * 1.25)   # "every couple of seconds", with jitter

    username = None
    token = None
    seen = None
    ready_at = None               # when this user had its account and follows: plurks created
                                  # after it are timed as deliveries
    network_timeout = LONGPOLL_WAIT + 30.0    # a held poll is answered within the wait
    # https: the site's certificate is checked (locust's default skips it), against the CAs of
    # SSL_CERT_FILE when set (the namespace cluster's own CA), else the system's
    insecure = False
    etag = None                   # long mode: the ETag of the last count answer handled
    count = 0
    known = 0                     # the count of the last getMessages answer (what was shown)
    shown_upto = 0                # the newest item shown with everything unread below it
    read_due = None               # time.monotonic() when what was shown is marked read
    _poller = None

    def _auth(self):
        return {"Authorization": f"Bearer {self.token}"}

    def _ran(self, login=False):
        """This user runs ``self.username`` (recorded: the judge checks no other process does)."""
        with _lock:
            _records["users"] += 1
            _records["accounts"].append(self.username)
            _records["logins"] += int(login)

    def _get_poll(self, resource, check):
        """One poll request: its JSON body, {} for 204, or None on failure (recorded by locust)."""
        path = f"/Poll/{resource}"
        with self.client.get(path, headers=self._auth(), name=path, catch_response=True) as resp:
            self._count_cache(resp)
            if resp.status_code == 204:
                resp.success()
                return {}
            return _body(resp, (200,), check)

    def poll(self):
        started = time.time()
        counted = self._get_poll("getUnreadCount", _check_count)
        if counted is None:
            return
        count = counted.get("count", 0)
        if count and count == self.known:       # what was shown is all there is (the page's rule)
            self._polled(started)
        else:
            self._read(started, count, (None, time.time()))
        self._mark_read_if_due()

    def _read(self, started, announced, at=(None, None)):
        """After a count answer of a poll begun at ``started``: fetch the messages when something
        is unread and show them (:meth:`_show`).  False when the messages are
        behind the count that announced them (two keys, written one after the other: the count
        can be read first); the poll is then not complete and the long-poll must ask again soon
        instead of holding on the count's ETag.  ``at``: (when the kernel received the count's
        answer, or None; when this greenlet handled it), recorded with each first sight."""
        body = self._get_poll("getMessages", _check_messages) if announced else {}
        if body is None:
            return False
        return self._show(started, body, at, announced)

    def _show(self, started, body, at, announced=None, seen_at=None):
        """One getMessages answer ({} for none), from a poll or a stream's event, complete as of
        ``started``: count deliveries, and set when what was shown falls due to be marked read
        (:meth:`_mark_read_if_due` sends it).  False when it is behind ``announced``, the count
        that announced it.  A first sight is ``seen_at`` (a stream's event: when it was read),
        else now (after the fetch)."""
        self.known = body.get("count", 0)
        if announced is not None and self.known < announced:
            with _lock:
                _records["behind"] += 1
            self.etag = None
            return False
        if not body:
            self._polled(started)
            return True
        now = time.time() if seen_at is None else seen_at
        items = body["items"]
        fresh = []
        with _lock:
            for item in items:
                if item["kind"] == "plurk" and item["id"] not in self.seen:
                    self.seen.add(item["id"])
                    _records["seen"].append([self.username, item["id"], now, *at])
                    fresh.append(item)
        self._polled(started)
        for item in fresh:
            self._delivered(item, now)
        if items and body["count"] == len(items):
            # everything unread was shown: it is marked read once it has been seen a moment
            newest = max(i["id"] for i in items)
            if newest > self.shown_upto:
                self.shown_upto = newest
                self.read_due = time.monotonic() + READ_AFTER_S
        elif items:
            with _lock:
                _records["truncated"] += 1
        return True

    def _mark_read_if_due(self):
        """Mark read what was shown, once it has been seen ``READ_AFTER_S`` (one request for all
        of it, as the page makes)."""
        if self.read_due is None or time.monotonic() < self.read_due:
            return
        self.read_due = None
        self.client.post("/api/markRead", json={"upto": self.shown_upto}, headers=self._auth(),
                         name="/api/markRead")
        # what is still unread is newer than anything shown: the next count fetches it
        self.known = 0
        # the count changed under the ETag we hold: a count back at the same number (a new plurk
        # after the read) would otherwise match it and be held as "nothing new"
        self.etag = None

    def _wait(self):
        """The hold to ask for: the whole wait, or until a read falls due (the page aborts its
        held poll then); at least 2 s, so that the hold is not taken for a quick 304."""
        if self.read_due is None:
            return LONGPOLL_WAIT
        return min(LONGPOLL_WAIT, max(2, math.ceil(self.read_due - time.monotonic())))

    # -- long-polling ----------------------------------------------------------------------------

    def _start_polling(self):
        """Long mode: this user's one long-poll in flight, in a greenlet of its own (stream mode:
        its one stream)."""
        mode = _poll_mode(self.environment)
        if mode in ("long", "stream") and self.token and self._poller is None:
            self._poller = gevent.spawn(self._long_poll_loop if mode == "long" else self._stream_loop)

    def on_stop(self):
        if self._poller is not None:
            self._poller.kill(block=False)
            self._poller = None

    def _long_poll(self):
        """One held getUnreadCount: (count, held, quick) or None on failure.  ``held``: fastpath
        applied the wait (Preference-Applied); ``quick``: an unchanged answer came back at once."""
        headers = self._auth()
        headers["Prefer"] = f"wait={self._wait()}"
        if self.etag:
            headers["If-None-Match"] = self.etag
        started = time.monotonic()
        name = "/Poll/getUnreadCount (held)"
        with self.client.get("/Poll/getUnreadCount", headers=headers, name=name, catch_response=True) as resp:
            self._count_cache(resp)
            status = resp.status_code
            if status == 304 and self.etag:
                resp.success()
                count = self.count
            elif status == 204:
                resp.success()
                count = 0
            else:
                body = _body(resp, (200,), _check_count)
                if body is None:
                    return None
                count = body["count"]
            header = resp.headers.get if resp.headers else (lambda _name: None)
            self.etag = header("ETag")
            held = header("Preference-Applied") is not None
        self.count = count
        return count, held, status == 304 and time.monotonic() - started < LONGPOLL_QUICK_S, status

    def _poll_loop(self, what, step):
        """Calls ``step`` (after any due mark-read) for ever: it returns the seconds to wait
        before the next call (0: at once), or None on a failure, after which the wait doubles, up
        to MAX_BACKOFF_S, until a call succeeds.  ``what`` names the step in the log."""
        backoff = POLL_WAIT
        while True:
            try:
                self._mark_read_if_due()
                pause = step()
            except Exception:             # a bug here must not stop this user's polling in silence
                log.exception("%s of %s", what, self.username)
                pause = None
            if pause is None:
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                gevent.sleep(random.uniform(0.5, 1.0) * backoff)
                continue
            backoff = POLL_WAIT
            gevent.sleep(pause)

    def _long_poll_loop(self):
        self._poll_loop("long-poll", self._long_poll_step)

    def _long_poll_step(self):
        """One long-poll, its answer handled: the seconds to wait before the next, or None."""
        started = time.time()
        answer = self._long_poll()
        if answer is None:
            return None
        count, held, quick, status = answer
        if status == 304 and count == self.known:
            self._polled(started)                 # unchanged since the last answer handled
        elif not self._read(started, count, (None, time.time())):
            held = False                          # messages behind the count: ask again soon
        if not held or quick:             # Django answered, or fastpath did not hold: poll wait
            return random.uniform(0.75, 1.25) * POLL_WAIT
        return 0

    # -- streams (Server-Sent Events) ----------------------------------------------------------------

    def _stream_target(self):
        """(host, port, name): the edge when there is one (and PLURK_LOAD_STREAM_VIA is not
        nginx), else the locust host (nginx)."""
        if STREAM_VIA != "nginx" and (edge := _edge_address()):
            return edge[0], edge[1], f"/Poll/{STREAM_RESOURCES} (edge stream)"
        url = urllib.parse.urlsplit(self.host)
        return url.hostname, url.port or 80, f"/Poll/{STREAM_RESOURCES} (stream)"

    def _site_poll(self):
        """A stream's miss: each resource it carries asked of the site once (through nginx, where
        Django fills the cache for a key that went), then the stream opens again."""
        started = time.time()
        counted = self._get_poll("getUnreadCount", _check_count)
        if counted is None:
            return
        body = self._get_poll("getMessages", _check_messages)
        if body is not None:
            self._show(started, body, (None, time.time()), counted.get("count", 0))
        self._mark_read_if_due()

    def _stream_loop(self):
        self._poll_loop("stream", self._stream)

    def _stream(self):
        """One stream, until it ends: the seconds to wait before the next one (Django's
        ``retry:`` as a browser obeys it, 1 s after fastpath's or Django's stream, which both open
        with ``retry: 1000``), or None on a failure (recorded by locust)."""
        host, port, name = self._stream_target()
        edge = name.endswith("(edge stream)")
        headers = f"Authorization: Bearer {self.token}\r\nAccept: text/event-stream\r\n"
        if self.etag:
            headers += f"Last-Event-ID: {self.etag}\r\n"
        started = time.perf_counter()
        asked = time.time()               # every event on this connection is at least this new
        meta = {"request_type": "GET", "name": name, "response_length": 0, "response": None, "context": {},
                "exception": None}
        try:
            sock = gsocket.create_connection((host, port), timeout=10)
        except OSError as exc:
            self.environment.events.request.fire(response_time=(time.perf_counter() - started) * 1000,
                                                 **dict(meta, exception=exc))
            return None
        try:
            sock.sendall(f"GET /Poll/{STREAM_RESOURCES} HTTP/1.1\r\nHost: {host}:{port}\r\n{headers}\r\n".encode())
            reader = _EventReader(sock)
            status, head = reader.head()
            meta["response_time"] = (time.perf_counter() - started) * 1000
            if head.get("x-cache") in ("HIT", "MISS"):
                with _lock:
                    _records["cache"][head["x-cache"]] += 1
            if status == 409 and edge and head.get("x-cache") == "MISS":
                self.environment.events.request.fire(**meta)      # the edge's miss: ask the site once
                self._site_poll()
                return 0
            if status != 200 or not head.get("content-type", "").startswith("text/event-stream"):
                meta["exception"] = RuntimeError(f"stream answered {status} {head.get('content-type')}")
                self.environment.events.request.fire(**meta)
                return None
            self.environment.events.request.fire(**meta)
            pause = 0
            for event in reader.events(self._stream_timeout):
                if event is None:
                    if self.read_due is None:               # quiet past the heartbeat: a dead stream
                        raise ValueError(f"no event nor heartbeat for {STREAM_QUIET_S} s")
                    self._mark_read_if_due()               # a read fell due while the stream was quiet
                    continue
                if "retry" in event:
                    pause = int(event["retry"]) / 1000
                if event.get("event") == "miss":           # a key is gone: ask the site once
                    self._site_poll()
                    return 0
                if "data" not in event:
                    continue
                self._stream_event(event, reader.arrived, asked)
                self._mark_read_if_due()
            return pause
        except (OSError, ValueError) as exc:
            self.environment.events.request.fire(response_time=(time.perf_counter() - started) * 1000,
                                                 **dict(meta, name=name + " broken", exception=exc))
            return None
        finally:
            sock.close()

    def _stream_timeout(self):
        """How long a quiet stream may stay so: until a read falls due, else the heartbeat's margin."""
        if self.read_due is None:
            return STREAM_QUIET_S
        return max(0.05, min(STREAM_QUIET_S, self.read_due - time.monotonic()))

    def _stream_event(self, event, arrived, asked):
        """One event of the stream: the count (the badge: nothing to do but keep it) or the
        messages, shown as they are (messages behind the count come as the next getMessages
        event: the stream sends every change of either key).  ``asked``: when the stream was
        asked for (the events are at least that new).  A body that is not what the API promises
        is a ValueError (the stream is recorded broken)."""
        data = event["data"]
        kind = event.get("event")
        self.etag = event.get("id") or self.etag
        check = {"getUnreadCount": _check_count, "getMessages": _check_messages}.get(kind)
        if check is None:
            return                        # an event this user does not read
        try:
            body = json.loads(data) if data else {}
        except ValueError as exc:
            raise ValueError(f"{kind} event not JSON ({exc}): {data[:40]!r}") from None
        problem = "not an object" if not isinstance(body, dict) else body and check(body)
        if problem:
            raise ValueError(f"{kind} event: {problem}")
        if kind == "getUnreadCount":
            self.count = body.get("count", 0)
        else:
            # as new as: the stream's request, and the newest item's write (after its created)
            created = [c for c in map(_created, body.get("items", [])) if c is not None]
            now = time.time()
            self._show(max([asked, *created]), body, (arrived, now), seen_at=now)

    def _delivered(self, item, now):
        """A custom locust request of type ``delivery``: a plurk of someone else, created after this
        user was ready, seen for the first time (response time: created -> now)."""
        created = _created(item)
        if created is None or item.get("author") == self.username or self.ready_at is None \
                or created < self.ready_at:
            return
        latency = now - created
        # seen before it was created: the clocks disagree -- a failure of the measure, not 0 ms
        problem = None if latency >= 0 else RuntimeError(
            f"seen {-latency * 1000:.0f} ms before its created: the clocks of locust and the server disagree")
        self.environment.events.request.fire(
            request_type="delivery", name="plurk first seen by a follower",
            response_time=max(latency, 0.0) * 1000, response_length=0, response=None,
            context={}, exception=problem)

    def _polled(self, started):
        with _lock:
            polls = _records["polls"]
            polls[self.username] = max(started, polls.get(self.username, 0))

    @staticmethod
    def _count_cache(resp):
        state = resp.headers.get("X-Cache") if resp.headers else None
        if state in ("HIT", "MISS"):
            with _lock:
                _records["cache"][state] += 1

    def post(self, text):
        started = time.time()
        with self.client.post("/api/plurks", json={"content": text}, headers=self._auth(),
                              name="/api/plurks", catch_response=True) as resp:
            body = _body(resp, (201,), _check_plurk)
        if body is not None:
            with _lock:
                _records["posts"].append([self.username, body["id"], started, time.time(), _created(body)])
        return body


class Plurker(_Plurker):
    """An ordinary user: polls a lot, posts and responds sometimes."""

    weight = 20

    def on_start(self):
        self.seen = set()
        index = _take("login", _logins)
        if index is not None:
            if not self._login(_logins[index]):
                return
        else:
            index = _take("account", _accounts)
            if index is not None:
                account = _accounts[index]
                self.username, self.token = account["username"], account["token"]
                self._ran()
                if account.get("follows"):            # graph made in bulk before the run
                    with _lock:
                        for name in account["follows"]:
                            _records["follows"].append([self.username, name, 0.0])
                        _known_users.append(self.username)
                    self.ready_at = time.time()
                    self._start_polling()
                    return
            elif not self._signup():
                return
        self._follow_some()
        self.ready_at = time.time()
        self._start_polling()

    def _login(self, account):
        """Log in with a password (``/api/login``): a user coming back, not a fresh sign-up."""
        return self._authenticate("/api/login", account["username"], account["password"], 200, login=True)

    def _signup(self):
        return self._authenticate("/api/signup", f"u{uuid.uuid4().hex[:12]}", PASSWORD, 201)

    def _authenticate(self, path, username, password, status, login=False):
        self.username = username
        with self.client.post(path, json={"username": username, "password": password},
                              name=path, catch_response=True) as resp:
            body = _body(resp, (status,), _check_token)
        if body is None:
            self.stop()
            return False
        self.token = body["token"]
        self._ran(login=login)
        return True

    def _follow_some(self):
        targets = set()
        if _celebrities:
            for _ in range(random.randint(1, 3)):
                targets.add(_celebrities[_zipf_index(len(_celebrities))]["username"])
        with _lock:
            others = random.sample(_known_users, min(len(_known_users), random.randint(0, 3)))
            _known_users.append(self.username)
        targets.update(others)
        for name in targets:
            with self.client.post("/api/follow", json={"username": name}, headers=self._auth(),
                                  name="/api/follow", catch_response=True) as resp:
                followed = _body(resp, (200, 201), _check_any) is not None
            if followed:
                with _lock:
                    _records["follows"].append([self.username, name, time.time()])

    @task(30)
    def poll_task(self):
        if _poll_mode(self.environment) == "short":
            self.poll()

    @task(WRITE_WEIGHT)
    def post_task(self):
        self.post(f"hello from {self.username} at {time.time():.3f}")

    @task(WRITE_WEIGHT)
    def respond_task(self):
        with self.client.get("/api/timeline?limit=5", headers=self._auth(), name="/api/timeline",
                             catch_response=True) as resp:
            body = _body(resp, (200,), _check_timeline)
        if body and body["items"]:
            plurk = random.choice(body["items"])
            self.client.post(f"/api/plurks/{plurk['id']}/responses", json={"content": "nice"},
                             headers=self._auth(), name="/api/plurks/[id]/responses")


class Celebrity(_Plurker):
    """One of the few accounts that many follow: posts more often, polls too.  Only with
    pre-made celebrity accounts ($PLURK_LOAD_SETUP); without them the class is not run."""

    abstract = not _celebrities
    weight = 1
    fixed_count = len(_celebrities)          # exactly one locust user per celebrity account
    wait_time = between(CELEB_WAIT * 0.7, CELEB_WAIT * 1.3)

    def on_start(self):
        self.seen = set()
        index = _take("celebrity", _celebrities)
        if index is None:
            log.error("more Celebrity users than celebrity accounts: this one stops")
            self.stop()
            return
        celeb = _celebrities[index]
        self.username, self.token = celeb["username"], celeb["token"]
        self._ran()
        self.ready_at = time.time()
        self._start_polling()
        # first post only once every user runs (a user spawned later could not see it before it
        # starts, which would measure the ramp-up, not delivery), then at a random moment of the
        # first wait, not all celebrities at once
        _all_spawned.wait(timeout=SPAWN_WAIT_MAX_S)
        gevent.sleep(random.uniform(0, CELEB_WAIT))

    @task(3)
    def post_task(self):
        self.post(f"{self.username} says {random.randint(0, 10**6)}")

    @task(5)
    def poll_task(self):
        if _poll_mode(self.environment) == "short":
            self.poll()


# --- records, events and the in-locust delivery summary -----------------------------------------

def _snapshot():
    """One consistent copy of this process's records, as JSON text (taken under the lock)."""
    with _lock:
        return json.dumps(_records)


def _write_records():
    """Replace ``$PLURK_LOAD_RECORDS/<pid>.json`` atomically with a consistent snapshot."""
    os.makedirs(RECORDS_DIR, exist_ok=True)
    data = _snapshot()
    path = os.path.join(RECORDS_DIR, f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as fh:
        fh.write(data)
    os.replace(path + ".tmp", path)


def _runs_users(environment):
    return not isinstance(getattr(environment, "runner", None), MasterRunner)


_snapshots = None
_all_spawned = gevent.event.Event()
SPAWN_WAIT_MAX_S = 600


def _poll_mode(environment):
    options = getattr(environment, "parsed_options", None)
    return getattr(options, "poll_mode", None) or _default_poll_mode()


def _default_poll_mode():
    mode = os.environ.get("PLURK_LOAD_POLL_MODE", "long")
    return mode if mode in POLL_MODES else "long"


@events.init_command_line_parser.add_listener
def _options(parser, **kwargs):
    parser.add_argument("--poll-mode", choices=POLL_MODES, default=_default_poll_mode(),
                        help="long: one held poll in flight per user (default); short: poll every "
                             "couple of seconds; stream: one Server-Sent Events stream per user, on the "
                             "edge when there is one ($PLURK_LOAD_POLL_MODE)")


@events.init.add_listener
def _init(environment=None, runner=None, **kwargs):
    """Runs in every process after locust's fork: this process's runner and its messages."""
    global _runner
    _runner = runner if runner is not None else environment.runner
    if isinstance(_runner, MasterRunner):
        _runner.register_message("plurkers_claim", _on_claim)
    elif isinstance(_runner, WorkerRunner):
        _runner.register_message("plurkers_claimed", _on_claimed)


@events.spawning_complete.add_listener
def _spawned(**kwargs):
    _all_spawned.set()


@events.test_start.add_listener
def _test_start(environment=None, **kwargs):
    """A new test: every account can be handed out again (on the master or the only process);
    each process that runs users starts fresh records and, with $PLURK_LOAD_RECORDS, snapshots them."""
    global _records, _snapshots
    _claims.clear()
    _all_spawned.clear()
    if not _runs_users(environment):
        return
    with _lock:
        _records = _new_records()
        _records["runner"] = "worker" if isinstance(environment.runner, WorkerRunner) else "local"
        _records["worker_index"] = getattr(environment.runner, "worker_index", None)
        _records["poll_mode"] = _poll_mode(environment)
        del _known_users[:]
    if RECORDS_DIR is None or _snapshots is not None:
        return

    def loop():
        while True:
            gevent.sleep(RECORDS_EVERY_S)
            _write_records()
    _snapshots = gevent.spawn(loop)


@events.test_stopping.add_listener
@events.quitting.add_listener
def _records_now(environment=None, **kwargs):
    """Also written when the test stops and when the process quits."""
    if RECORDS_DIR and _runs_users(environment):
        _write_records()


@events.test_stop.add_listener
def _test_stop(environment=None, **kwargs):
    """The final records, and the delivery verdict of this process's own users."""
    if not _runs_users(environment):
        _stats_log.info("delivery: each worker prints the figures of its own users; the verdict over "
                        "every process (deliveries between processes too) is bench/load.py's")
        return
    if RECORDS_DIR:
        _write_records()
    records = json.loads(_snapshot())
    if not records["users"]:
        return
    verdict = _delivery.judge([records])
    if isinstance(environment.runner, WorkerRunner):
        who = f"worker {environment.runner.worker_index}, its own {records['users']} users only"
    else:
        who = f"{records['users']} users, {records['logins']} logged in with a password"
    _stats_log.info(f"delivery ({who}): {_delivery.summary(verdict)}")
    if verdict["lost"]:
        # failed requests and exceptions set locust's exit code already; a loss must too
        environment.process_exit_code = 1
