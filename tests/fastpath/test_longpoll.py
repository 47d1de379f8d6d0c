"""Long-polling in fastpath (issue 14, docs/contract.md section 7): a poll that sends
``Prefer: wait=N`` and the ETag it has is held until its answer changes, and ended by the
notices plurkcore sends (unix or UDP datagrams), by the periodic re-read, by a miss, or by its
timeout.
Real memcached, real fastpath, real sockets; notices are sent from here in the fixed format."""
import contextlib
import hashlib
import os
import socket
import stat
import time
import urllib.request

import pytest
from pymemcache.client.base import Client

import fastpath._server  # noqa: F401  (a build that does not import fails here, never skips)
from tests.fastpath.conftest import token

SLACK = 10          # seconds: "within N seconds" bounds are generous on a shared machine


def etag(body):
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def metric(fp, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{fp.admin_port}/metrics", timeout=5).read().decode()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def wait_metric(fp, name, value, timeout=SLACK):
    deadline = time.monotonic() + timeout
    while metric(fp, name) != value:
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} is {metric(fp, name)}, not {value}")
        time.sleep(0.02)


def held(fp, n, timeout=SLACK):
    """n polls held and their first reads done (a store after this is a change they hold over)."""
    wait_metric(fp, "fastpath_held_polls", n, timeout)
    wait_metric(fp, "fastpath_inflight_requests", 0, timeout)


def key(uid, resource="getMessages"):
    return f"p1:{resource}:{uid}:0"


def held_poll(fp, cache, uid, body):
    """Store body as uid's answer, then one poll that holds over it (Prefer: wait=50) is held."""
    cache.set(key(uid), body)
    poll = Poll(fp, uid, etag(body), wait=50)
    held(fp, 1)
    return poll


class Poll:
    """One raw HTTP/1.1 poll on its own connection: send now, read the answer later."""

    def __init__(self, fp, uid, tag=None, wait=None, resource="getMessages", extra="", epoch=0, sock=None):
        """``resource``: the path after /Poll/ (a query too); ``epoch``: the token's; ``sock``: a
        connection of the caller's to use instead of one to ``fp``'s poll port."""
        self.sock = sock or socket.create_connection(("127.0.0.1", fp.port), timeout=SLACK + 60)
        head = f"GET /Poll/{resource} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token(uid, epoch)}\r\n"
        if tag is not None:
            head += f"If-None-Match: {tag}\r\n"
        if wait is not None:
            head += f"Prefer: wait={wait}\r\n"
        self.sock.sendall((head + extra + "\r\n").encode())

    def ready(self, timeout=0.0):
        import select
        return bool(select.select([self.sock], [], [], timeout)[0])

    def answer(self, timeout=SLACK):
        self.sock.settimeout(timeout)
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError(f"closed after {raw!r}")
            raw += chunk
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        length = int(headers.get("content-length", 0))
        while len(body) < length:
            body += self.sock.recv(65536)
        return int(lines[0].split()[1]), headers, body

    def close(self):
        self.sock.close()


@pytest.fixture
def cache(memcached):
    client = Client(memcached.spec, default_noreply=False)
    yield client
    client.close()


def start(fastpath_factory, memcached, *extra, notify=None):
    args = ["--reread-interval", "60", "--timeout-ms", "2000", *extra]
    if notify is not None:
        args += ["--notify-dir", str(notify)]
    return fastpath_factory([memcached], extra=tuple(args))


# ---- without notices ----------------------------------------------------------------------

def test_matching_tag_without_wait_is_304_at_once(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(1), b'{"count":1}')
    status, headers, body = Poll(fp, 1, etag(b'{"count":1}')).answer()
    assert status == 304 and headers["etag"] == etag(b'{"count":1}') and body == b""
    assert "preference-applied" not in headers
    assert metric(fp, "fastpath_holds_total") == 0


def test_differing_tag_with_wait_is_answered_at_once(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(2), b'{"count":2}')
    status, headers, body = Poll(fp, 2, etag(b"old"), wait=30).answer(timeout=SLACK)
    assert (status, body) == (200, b'{"count":2}')
    assert headers["etag"] == etag(body) and headers["preference-applied"] == "wait=30"


def test_hold_times_out_with_304_and_the_same_etag(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-wait", "2")
    cache.set(key(3), b"")
    started = time.monotonic()
    poll = Poll(fp, 3, "W/" + etag(b""), wait=40)
    held(fp, 1)
    status, headers, body = poll.answer(timeout=SLACK)
    took = time.monotonic() - started
    assert status == 304 and headers["etag"] == etag(b"") and body == b""
    assert headers["preference-applied"] == "wait=2" and headers["x-cache"] == "HIT"
    assert 1.5 <= took < 2 + SLACK            # jittered down by at most 10%
    assert metric(fp, "fastpath_hold_timeouts_total") == 1
    assert metric(fp, "fastpath_held_polls") == 0


def test_change_is_found_by_the_periodic_reread_when_notices_are_off(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--reread-interval", "1")
    poll = held_poll(fp, cache, 4, b'{"count":1}')
    time.sleep(0.3)
    assert not poll.ready()
    cache.set(key(4), b'{"count":2}')
    status, headers, body = poll.answer(timeout=1 + SLACK)
    assert (status, body, headers["etag"]) == (200, b'{"count":2}', etag(b'{"count":2}'))
    assert metric(fp, "fastpath_holds_woken_total") == 1
    assert metric(fp, "fastpath_wait_rereads_total") >= 1
    assert metric(fp, "fastpath_held_polls") == 0


def test_same_bytes_stored_again_do_not_wake(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--reread-interval", "1", "--max-wait", "4")
    poll = held_poll(fp, cache, 5, b'{"count":5}')
    cache.set(key(5), b'{"count":5}')
    before = metric(fp, "fastpath_wait_rereads_total")
    deadline = time.monotonic() + SLACK
    while metric(fp, "fastpath_wait_rereads_total") < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(fp, "fastpath_wait_rereads_total") >= before + 2    # read again, unchanged
    status, headers, _ = poll.answer()
    assert status == 304 and metric(fp, "fastpath_holds_woken_total") == 0


@pytest.mark.parametrize("how", ["delete", "flush"])
def test_key_deleted_or_flushed_while_held_is_404(fastpath_factory, memcached, cache, how):
    fp = start(fastpath_factory, memcached, "--reread-interval", "1")
    poll = held_poll(fp, cache, 6, b'{"count":6}')
    if how == "delete":
        cache.delete(key(6))
    else:
        cache.flush_all()
    status, headers, body = poll.answer(timeout=1 + SLACK)
    assert status == 404 and headers["x-cache"] == "MISS" and headers["preference-applied"] == "wait=50"
    assert metric(fp, "fastpath_held_polls") == 0


def test_memcached_restarted_while_held_ends_the_hold(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--reread-interval", "1")
    poll = held_poll(fp, cache, 7, b'{"count":7}')
    memcached.stop()
    memcached.start()
    status, headers, _ = poll.answer(timeout=1 + SLACK)
    assert status in (404, 503) and headers["x-cache"] == "MISS"     # empty after restart, or down
    assert metric(fp, "fastpath_held_polls") == 0


def test_client_that_leaves_while_held_is_freed(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached)
    cache.set(key(8), b"")
    polls = [Poll(fp, 8, etag(b""), wait=50) for _ in range(3)]
    held(fp, 3)
    for p in polls:
        p.close()
    held(fp, 0, timeout=5)
    wait_metric(fp, "fastpath_connections", 1, timeout=5)     # the /metrics request itself


def test_keep_alive_after_a_held_poll(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-wait", "1")
    cache.set(key(9), b"x")
    poll = Poll(fp, 9, etag(b"x"), wait=5)
    assert poll.answer()[0] == 304
    poll.sock.sendall(f"GET /Poll/getMessages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token(9)}\r\n\r\n".encode())
    status, headers, body = poll.answer()
    assert (status, body) == (200, b"x") and "preference-applied" not in headers


def test_max_wait_zero_never_holds(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-wait", "0")
    cache.set(key(10), b"x")
    status, headers, _ = Poll(fp, 10, etag(b"x"), wait=30).answer(timeout=SLACK)
    assert status == 304 and "preference-applied" not in headers


# ---- notices ---------------------------------------------------------------------------------

class Notifier:
    """plurkcore's side of the notice format: one sender, its sequence per destination (a
    socket path of ``directory``, or with ``udp`` a list of (host, port) that each is one
    worker's port)."""

    def __init__(self, directory=None, udp=None, limit=4096):
        self.directory, self.udp, self.limit = directory, udp, limit
        self.sender = os.urandom(8).hex()
        self.seq = {}
        self.sock = socket.socket(socket.AF_INET if udp else socket.AF_UNIX, socket.SOCK_DGRAM)

    def paths(self):
        if self.udp:
            return list(self.udp)
        return sorted(str(p) for p in self.directory.glob("*.sock"))

    def send(self, keys, skip=0):
        for path in self.paths():
            keys = list(keys)
            while True:
                seq = self.seq.get(path, 0) + 1 + skip
                skip = 0
                self.seq[path] = seq
                data, n = f"PN1 {self.sender} {seq}\n".encode(), 0
                while n < len(keys) and len(data) + len(keys[n]) + 1 <= self.limit:
                    data += keys[n].encode() + b"\n"
                    n += 1
                self.sock.sendto(data, path)
                keys = keys[n:]
                if not keys:
                    break

    def raw(self, data):
        for path in self.paths():
            self.sock.sendto(data, path)


@pytest.fixture
def notify_dir(tmp_path):
    return tmp_path / "notify"


def test_each_worker_binds_its_socket(fastpath_factory, memcached, notify_dir):
    """Each socket is 0666 whatever the umask (Django may run as another user and send needs
    write permission); the directory's 0755 is what limits who reaches them."""
    umask = os.umask(0o022)
    try:
        fastpath_factory([memcached], workers=2, extra=("--notify-dir", str(notify_dir)))
    finally:
        os.umask(umask)
    deadline = time.monotonic() + SLACK
    while True:
        modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in notify_dir.glob("*.sock")}
        if modes == {"0.sock": "0o666", "1.sock": "0o666"}:
            break
        assert time.monotonic() < deadline, modes
        time.sleep(0.05)
    assert oct(notify_dir.stat().st_mode & 0o777) == "0o755"


def test_notice_wakes_a_held_poll_at_once(fastpath_factory, memcached, cache, notify_dir):
    fp = start(fastpath_factory, memcached, notify=notify_dir)     # re-reads every 60 s only
    notifier = Notifier(notify_dir)
    poll = held_poll(fp, cache, 20, b'{"count":1}')
    cache.set(key(20), b'{"count":2}')
    notifier.send([key(20), key(999)])          # a key nobody waits on is ignored
    status, headers, body = poll.answer(timeout=SLACK)
    assert (status, body) == (200, b'{"count":2}') and headers["preference-applied"] == "wait=50"
    assert metric(fp, "fastpath_notices_total") == 1 and metric(fp, "fastpath_notice_keys_total") == 2
    assert metric(fp, "fastpath_notice_gaps_total") == 0


def test_a_notice_of_64_kib_wakes_the_poll_its_last_key_names(fastpath_factory, memcached, cache, notify_dir):
    """plurkcore cuts a unix notice at 65,536 bytes (a fan-out chunk's 2,000 keys in one
    datagram instead of 11 a socket's queue of 10 could not hold)."""
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    poll = held_poll(fp, cache, 23, b'{"count":1}')
    cache.set(key(23), b'{"count":2}')
    others = [key(uid) for uid in range(100000, 102600)]
    filler = len(f"PN1 {'0' * 16} 1\n") + sum(len(k) + 1 for k in others)
    assert 60000 < filler + len(key(23)) + 1 <= 65536
    Notifier(notify_dir, limit=65536).send(others + [key(23)])
    status, _, body = poll.answer(timeout=SLACK)
    assert (status, body) == (200, b'{"count":2}')
    assert metric(fp, "fastpath_notices_total") == 1 and metric(fp, "fastpath_notice_keys_total") == 2601
    assert metric(fp, "fastpath_notices_malformed_total") == 0


def test_store_just_before_registration_is_answered_at_once(fastpath_factory, memcached, cache, notify_dir):
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    cache.set(key(21), b'{"count":1}')
    cache.set(key(21), b'{"count":2}')          # the client still has count 1's tag
    status, _, body = Poll(fp, 21, etag(b'{"count":1}'), wait=50).answer(timeout=SLACK)
    assert (status, body) == (200, b'{"count":2}')
    assert metric(fp, "fastpath_holds_woken_total") == 1


def test_store_just_after_registration_is_not_lost(fastpath_factory, holding_proxy, cache, notify_dir):
    """Forced order: the waiter's first get has read the old value, and while that answer is
    still on its way the store completes and its notice arrives.  The old answer matches the
    waiter's tag, so only the read the notice asked for (after the one in flight) can end it."""
    fp = fastpath_factory([holding_proxy], extra=("--reread-interval", "60", "--timeout-ms", "5000",
                                                  "--notify-dir", str(notify_dir)))
    notifier = Notifier(notify_dir)
    cache.set(key(22), b'{"count":1}')
    holding_proxy.answering.clear()
    before = holding_proxy.held_bytes
    poll = Poll(fp, 22, etag(b'{"count":1}'), wait=50)
    wait_metric(fp, "fastpath_held_polls", 1)
    deadline = time.monotonic() + SLACK
    while holding_proxy.held_bytes == before:       # memcached has answered the get: old value
        assert time.monotonic() < deadline, "memcached never answered the held poll's get"
        time.sleep(0.01)
    cache.set(key(22), b'{"count":2}')              # the store completes, then its notice
    notifier.send([key(22)])
    wait_metric(fp, "fastpath_wait_rereads_total", 1)
    holding_proxy.answering.set()
    status, _, body = poll.answer(timeout=SLACK)
    assert (status, body) == (200, b'{"count":2}')


def test_notice_gap_rereads_every_held_key(fastpath_factory, memcached, cache, notify_dir):
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    notifier = Notifier(notify_dir)
    for uid in (30, 31, 32):
        cache.set(key(uid), b"a")
    polls = {uid: Poll(fp, uid, etag(b"a"), wait=50) for uid in (30, 31, 32)}
    held(fp, 3)
    notifier.send([])                           # seq 1: a new sender is not a gap
    cache.set(key(31), b"b")                    # stored, and its notice lost:
    notifier.send([], skip=1)                   # seq 3
    assert polls[31].answer(timeout=SLACK)[2] == b"b"
    wait_metric(fp, "fastpath_notice_gaps_total", 1)
    assert metric(fp, "fastpath_wait_rereads_total") >= 3
    assert not polls[30].ready() and not polls[32].ready()
    assert metric(fp, "fastpath_held_polls") == 2


@pytest.mark.parametrize("options, first_uid, most_ticks", [
    # ticks of a fiftieth of --reread-interval (100 ms at 5 s), each one batch of gets for every
    # key due, up to 640: at 10 ms and 64 a tick, 200 keys took four wakes and four batches
    pytest.param(("--reread-interval", "5"), 1000, 1, id="in-one-tick"),
    # a gap is a known loss: its re-reads go at 8x --reread-rate.  At 50 a second (5 a 100 ms
    # tick) 200 keys would take 40 ticks; at 8x they take 5
    pytest.param(("--reread-interval", "60", "--reread-rate", "50"), 3000, 6, id="faster-than-the-sweep"),
])
def test_a_gap_rereads_hundreds_of_held_keys_at_once(fastpath_factory, memcached, cache, notify_dir, options,
                                                     first_uid, most_ticks):
    """A gap in a sender's notices reads every held key again: 200 in at most ``most_ticks``."""
    fp = fastpath_factory([memcached], extra=(*options, "--timeout-ms", "2000", "--notify-dir", str(notify_dir)))
    notifier = Notifier(notify_dir)
    uids = range(first_uid, first_uid + 200)
    _set_many(memcached, [(key(uid), b"a") for uid in uids])
    polls = [Poll(fp, uid, etag(b"a"), wait=50) for uid in uids]
    try:
        held(fp, 200)
        notifier.send([key(1)])                    # known sender: seq 1
        wait_metric(fp, "fastpath_notices_total", 1)
        rereads, ticks = metric(fp, "fastpath_wait_rereads_total"), metric(fp, "fastpath_wait_reread_ticks_total")
        notifier.send([key(1)], skip=1)            # seq 3: a gap, every held key read again
        wait_metric(fp, "fastpath_wait_rereads_total", rereads + 200)
        assert metric(fp, "fastpath_wait_reread_ticks_total") - ticks <= most_ticks
        assert not any(poll.ready() for poll in polls)
    finally:
        for poll in polls:
            poll.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_reread_rate_caps_the_sweep_and_never_the_notices(fastpath_factory, memcached, cache, notify_dir, workers):
    """--reread-rate 50 (all workers together) with 200 held keys due every second: at most ~50
    reads a second instead of 200 (the sweep stretches to ~4 s), yet a notice still wakes at once."""
    fp = fastpath_factory([memcached], extra=("--reread-interval", "1", "--reread-rate", "50", "--workers",
                                              str(workers), "--timeout-ms", "2000", "--notify-dir", str(notify_dir)))
    _set_many(memcached, [(key(uid), b"a") for uid in range(2000, 2200)])
    polls = {uid: Poll(fp, uid, etag(b"a"), wait=50) for uid in range(2000, 2200)}
    try:
        held(fp, 200)
        before, started = metric(fp, "fastpath_wait_rereads_total"), time.monotonic()
        time.sleep(3)
        rate = (metric(fp, "fastpath_wait_rereads_total") - before) / (time.monotonic() - started)
        assert 10 <= rate <= 80, rate            # uncapped: ~200 a second; 0: no sweep at all
        cache.set(key(2100), b"b")
        Notifier(notify_dir).send([key(2100)])   # to every worker's socket
        assert polls[2100].answer(timeout=SLACK)[2] == b"b"
        assert not any(p.ready() for uid, p in polls.items() if uid != 2100)
    finally:
        for poll in polls.values():
            poll.close()


@pytest.mark.parametrize("data", [   # a key is at most 136 bytes (FP_KEY_CAP)
    b"", b"PN1", b"PN2 0123456789abcdef 1\nk\n", b"PN1 0123456789ABCDEF 1\nk\n",
    b"PN1 0123456789abcdef 0\nk\n", b"PN1 0123456789abcdef 01\nk\n", b"PN1 0123456789abcdef 1\nk",
    b"PN1 0123456789abcdef 1\n\n", b"PN1 0123456789abcdef 1\nk y\n", b"PN1 0123456789abcde 1\nk\n",
    b"PN1 0123456789abcdef 1\n" + b"k" * 137 + b"\n", b"PN1 0123456789abcdef 1\n" + b"k\n" * 32760,
    b"PN1 0123456789abcdef 99999999999999999999999\nk\n",
])
def test_malformed_notices_are_counted_and_dropped(fastpath_factory, memcached, cache, notify_dir, data):
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    poll = held_poll(fp, cache, 40, b"a")
    Notifier(notify_dir).raw(data)
    wait_metric(fp, "fastpath_notices_malformed_total", 1)
    assert metric(fp, "fastpath_notices_total") == 0 and not poll.ready()


def _raise_nofile(n):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= n


def _set_many(memcached, items):
    with socket.create_connection((memcached.host, memcached.port)) as s:
        s.sendall(b"".join(b"set %s 0 0 %d noreply\r\n%s\r\n" % (k.encode(), len(v), v) for k, v in items))
        s.sendall(b"version\r\n")           # answered after every set before it
        got = b""
        while not got.endswith(b"\r\n"):
            got += s.recv(4096)


def test_a_thousand_held_polls_woken_by_one_notice_each(fastpath_factory, memcached, notify_dir):
    assert _raise_nofile(1200 + 100)
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    uids = range(1000, 2000)
    _set_many(memcached, [(key(u), b"old") for u in uids])
    polls = [Poll(fp, u, etag(b"old"), wait=50) for u in uids]
    held(fp, 1000, timeout=3 * SLACK)
    _set_many(memcached, [(key(u), b"new %d" % u) for u in uids])
    Notifier(notify_dir).send([key(u) for u in uids])
    for u, poll in zip(uids, polls):
        status, _, body = poll.answer(timeout=SLACK)
        assert (status, body) == (200, b"new %d" % u)
        poll.close()
    assert metric(fp, "fastpath_holds_woken_total") == 1000
    assert metric(fp, "fastpath_notice_keys_total") == 1000
    assert metric(fp, "fastpath_held_polls") == 0


def _worker_rss(fp):
    with open(f"/proc/{fp.proc.pid}/task/{fp.proc.pid}/children") as fh:
        worker = int(fh.read().split()[0])
    with open(f"/proc/{worker}/status") as fh:
        return int(next(line.split()[1] for line in fh if line.startswith("VmRSS:"))) * 1024


def test_memory_per_held_poll(fastpath_factory, memcached, notify_dir, capsys):
    n = 5000
    assert _raise_nofile(n + 200)
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    _set_many(memcached, [(key(u), b"x") for u in range(1, n + 101)])
    warm = [Poll(fp, u, etag(b"x"), wait=50) for u in range(n + 1, n + 101)]    # pools, tables warm
    held(fp, 100, timeout=3 * SLACK)
    before = _worker_rss(fp)
    polls = [Poll(fp, u, etag(b"x"), wait=50) for u in range(1, n + 1)]
    held(fp, n + 100, timeout=6 * SLACK)
    per_poll = (_worker_rss(fp) - before) / n
    with capsys.disabled():
        print(f"\nfastpath: {per_poll:.0f} bytes of worker RSS per held poll ({n} held)")
    for p in polls + warm:
        p.close()
    assert per_poll < 2048          # goal 1 KB (reported); a leak per poll would be far above


def _gets(cache):
    return int(cache.stats()[b"cmd_get"])


def test_one_get_per_key_however_many_wait(fastpath_factory, memcached, cache, notify_dir):
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    cache.set(key(50), b"same")
    polls = [Poll(fp, 50, etag(b"same"), wait=50) for _ in range(50)]
    held(fp, 50)
    time.sleep(0.2)                             # any dirty re-read of the joins is done
    gets = _gets(cache)
    rereads = metric(fp, "fastpath_wait_rereads_total")
    Notifier(notify_dir).send([key(50)])
    wait_metric(fp, "fastpath_wait_rereads_total", rereads + 1)
    time.sleep(0.2)
    assert _gets(cache) == gets + 1             # one read for the 50 waiters
    assert not any(p.ready() for p in polls)    # same bytes: nobody woken


def test_a_restarted_worker_binds_its_socket_again(fastpath_factory, memcached, cache, notify_dir):
    import signal
    fp = start(fastpath_factory, memcached, notify=notify_dir)
    sock = notify_dir / "0.sock"
    wait_metric(fp, "fastpath_workers", 1)
    children = f"/proc/{fp.proc.pid}/task/{fp.proc.pid}/children"
    with open(children) as fh:
        worker = int(fh.read().split()[0])
    os.kill(worker, signal.SIGKILL)             # no clean exit: its socket file stays behind
    deadline = time.monotonic() + SLACK
    while True:
        with open(children) as fh:
            pids = fh.read().split()
        if pids and int(pids[0]) != worker and sock.exists():
            break
        assert time.monotonic() < deadline, "no new worker"
        time.sleep(0.05)
    from plurksite.services import wait_for_port
    wait_for_port("127.0.0.1", fp.port, process=fp.proc, name="fastpath")
    poll = held_poll(fp, cache, 51, b"a")
    cache.set(key(51), b"b")
    Notifier(notify_dir).send([key(51)])
    assert poll.answer(timeout=SLACK)[2] == b"b"


def test_draining_answers_held_polls_at_once(fastpath_factory, memcached, cache):
    import signal
    fp = start(fastpath_factory, memcached, "--drain-timeout", "30")
    poll = held_poll(fp, cache, 60, b"a")
    started = time.monotonic()
    fp.proc.send_signal(signal.SIGTERM)
    status, headers, _ = poll.answer(timeout=SLACK)
    assert status == 304 and headers["etag"] == etag(b"a") and headers["connection"] == "close"
    assert time.monotonic() - started < SLACK      # not the 30 s drain timeout
    fp.proc.wait(SLACK)


def test_bytes_sent_while_held_do_not_extend_the_hold(fastpath_factory, memcached, cache):
    fp = start(fastpath_factory, memcached, "--max-wait", "2")
    cache.set(key(61), b"a")
    started = time.monotonic()
    poll = Poll(fp, 61, etag(b"a"), wait=50)
    held(fp, 1)
    pipelined = f"GET /Poll/getMessages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token(61)}\r\n\r\n"
    sent = 0
    while sent < len(pipelined) and not poll.ready():   # one byte every 0.1 s: 8 s in all
        poll.sock.sendall(pipelined[sent].encode())
        sent += 1
        time.sleep(0.1)
    status, _, _ = poll.answer(timeout=SLACK)
    assert status == 304 and time.monotonic() - started < 2 + 4
    poll.sock.sendall(pipelined[sent:].encode())
    status, _, body = poll.answer(timeout=SLACK)   # the pipelined request, answered after it
    assert (status, body) == (200, b"a")


def test_notify_dir_is_made_with_its_parents(fastpath_factory, memcached, tmp_path):
    """--notify-dir under directories that do not exist yet (a fresh var dir): fastpath makes
    them before the workers start, instead of each worker failing and being restarted."""
    notify_dir = tmp_path / "fresh-var" / "run" / "notify"
    fastpath_factory([memcached], extra=("--notify-dir", str(notify_dir)))
    deadline = time.monotonic() + 5
    while not (notify_dir / "0.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (notify_dir / "0.sock").is_socket()


# ---- notices over UDP (--notify-udp HOST:PORT: worker i reads PORT+i; issue 16) ---------------

def udp_ports(n):
    """n consecutive free UDP ports on 127.0.0.1 (free now: bound and released)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + n - 1 > 65535:
            continue
        try:
            socks = []
            for i in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind(("127.0.0.1", first + i))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no run of free UDP ports")


def _socket_inodes(table, local_port, remote_port=None):
    """Inodes of the /proc/net/<table> sockets on 127.0.0.1:local_port (and remote_port)."""
    with open(f"/proc/net/{table}") as fh:
        rows = [line.split() for line in fh.readlines()[1:]]
    return {row[9] for row in rows if int(row[1].split(":")[1], 16) == local_port and
            (remote_port is None or int(row[2].split(":")[1], 16) == remote_port)}


def _holder(pids, inodes):
    """The pid among ``pids`` that holds one of the sockets ``inodes``."""
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return pid
    return None


def _accepted_by(pids, port, poll):
    """The worker that accepted poll's connection.  Until a worker accepts it, the connection
    waits in the listen queue in no process's fd table: ask again until one holds it."""
    deadline = time.monotonic() + SLACK
    while (pid := _holder(pids, _socket_inodes("tcp", port, poll.sock.getsockname()[1]))) is None:
        assert time.monotonic() < deadline, "no worker accepted the poll"
        time.sleep(0.01)
    return pid


def _workers(fp, n):
    deadline = time.monotonic() + SLACK
    while True:
        with open(f"/proc/{fp.proc.pid}/task/{fp.proc.pid}/children") as fh:
            pids = [int(p) for p in fh.read().split()]
        if len(pids) == n:
            return pids
        assert time.monotonic() < deadline, pids
        time.sleep(0.05)


def start_udp(fastpath_factory, memcached, port, workers=1):
    return fastpath_factory([memcached], workers=workers,
                            extra=("--reread-interval", "60", "--timeout-ms", "2000",
                                   "--notify-udp", f"127.0.0.1:{port}"))


def test_udp_notice_to_each_workers_port_wakes_the_polls_that_worker_holds(fastpath_factory, memcached, cache):
    port = udp_ports(2)
    fp = start_udp(fastpath_factory, memcached, port, workers=2)
    pids = _workers(fp, 2)
    # which worker bound which port, and which worker holds which poll (the kernel spreads
    # connections over the SO_REUSEPORT group: poll until each worker holds some)
    deadline = time.monotonic() + SLACK
    while None in (owner := {p: _holder(pids, _socket_inodes("udp", p)) for p in (port, port + 1)}).values():
        assert time.monotonic() < deadline, owner
        time.sleep(0.05)
    assert set(owner.values()) == set(pids)
    polls = {}
    uid = 100
    while len(polls) < 8 or len(set(polls.values())) < 2:
        assert uid < 200, "every poll went to one worker"
        cache.set(key(uid), b"old")
        poll = Poll(fp, uid, etag(b"old"), wait=50)
        polls[poll] = _accepted_by(pids, fp.port, poll)
        poll.uid, poll.answered = uid, False
        uid += 1
    held(fp, len(polls))
    for poll in polls:
        cache.set(key(poll.uid), b"new")
    notifier = Notifier(udp=[("127.0.0.1", port), ("127.0.0.1", port + 1)])
    for dest in notifier.paths():                    # one worker's port, then the other's
        notifier.udp = [dest]
        mine = [p for p, pid in polls.items() if pid == owner[dest[1]]]
        notifier.send([key(p.uid) for p in polls])
        for poll in mine:
            assert poll.answer(timeout=SLACK)[:3:2] == (200, b"new")
        others = [p for p in polls if p not in mine and not p.answered]
        time.sleep(0.3)
        assert not any(p.ready() for p in others)    # the other worker got nothing
        for poll in mine:
            poll.answered = True
    assert metric(fp, "fastpath_notice_udp_datagrams_total") == 2
    assert metric(fp, "fastpath_notices_total") == 2 and metric(fp, "fastpath_held_polls") == 0


def test_udp_notice_gap_rereads_every_held_key(fastpath_factory, memcached, cache):
    port = udp_ports(1)
    fp = start_udp(fastpath_factory, memcached, port)
    notifier = Notifier(udp=[("127.0.0.1", port)])
    for uid in (130, 131, 132):
        cache.set(key(uid), b"a")
    polls = {uid: Poll(fp, uid, etag(b"a"), wait=50) for uid in (130, 131, 132)}
    held(fp, 3)
    notifier.send([])                           # seq 1: a new sender is not a gap
    wait_metric(fp, "fastpath_notices_total", 1)
    cache.set(key(131), b"b")                   # stored, and its notice lost:
    notifier.send([], skip=1)                   # seq 3
    assert polls[131].answer(timeout=SLACK)[2] == b"b"
    wait_metric(fp, "fastpath_notice_gaps_total", 1)
    assert metric(fp, "fastpath_notice_udp_datagrams_total") == 2
    assert not polls[130].ready() and not polls[132].ready()


def test_udp_and_unix_notices_together(fastpath_factory, memcached, cache, notify_dir):
    port = udp_ports(1)
    fp = fastpath_factory([memcached], extra=("--reread-interval", "60", "--notify-dir", str(notify_dir),
                                              "--notify-udp", f"127.0.0.1:{port}"))
    for uid, notifier in ((140, Notifier(notify_dir)), (141, Notifier(udp=[("127.0.0.1", port)]))):
        poll = held_poll(fp, cache, uid, b"a")
        cache.set(key(uid), b"b")
        notifier.send([key(uid)])
        assert poll.answer(timeout=SLACK)[2] == b"b"
    assert metric(fp, "fastpath_notice_udp_datagrams_total") == 1
    assert metric(fp, "fastpath_notices_total") == 2


def _start_error(tmp_path, memcached, *args):
    """``python -m fastpath`` that must refuse to start: (exit status, its last stderr line)."""
    import subprocess
    import sys
    from tests.fastpath.conftest import RESOURCES, SECRET, fastpath_env
    from plurksite.services import free_port

    secret = tmp_path / "secret.key"
    secret.write_bytes(SECRET + b"\n")
    env, cwd = fastpath_env(tmp_path)
    done = subprocess.run([sys.executable, "-m", "fastpath", "--listen", f"127.0.0.1:{free_port()}",
                           "--memcached", memcached.spec, "--secret-file", str(secret), "--resources", RESOURCES,
                           *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=30)
    return done.returncode, done.stderr.splitlines()[-1] if done.stderr else ""


def test_bad_notify_udp_is_a_one_line_error(tmp_path, memcached):
    port = udp_ports(2)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", port + 1))
        cases = [
            (["--workers", "2", "--notify-udp", f"127.0.0.1:{port}"],
             f"--notify-udp 127.0.0.1:{port}: worker 1 cannot bind UDP port {port + 1} (Address already in use)"),
            (["--notify-udp", "192.0.2.1:9100"],       # TEST-NET-1: not an address of this host
             "--notify-udp 192.0.2.1:9100: worker 0 cannot bind UDP port 9100 (Cannot assign requested address)"),
            (["--workers", "2", "--notify-udp", "127.0.0.1:65535"],
             "--notify-udp 127.0.0.1:65535: 2 workers need ports 65535..65536, beyond 65535"),
            (["--notify-udp", "localhost:9100"], "--notify-udp localhost:9100: give a numeric address"),
            (["--notify-udp", "127.0.0.1"], "bad --notify-udp '127.0.0.1': expected host:port"),
        ]
        for args, complaint in cases:
            code, line = _start_error(tmp_path, memcached, *args)
            assert code == 2 and line.startswith("python -m fastpath: error: ") and complaint in line, (args, line)
