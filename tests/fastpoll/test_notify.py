"""Notices to fastpath (fastpoll/notify.py): the wire format of docs/contract.md section 7 on real
unix datagram sockets, sent after the writer's stores, never failing the commit."""
import os
import select
import socket
import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from fastpoll import notify
from plurkcore.models import Plurk

from tests.plurkcore.helpers import key_of

RESOURCES = ("getUnreadCount", "getMessages")


class Worker:
    """A stand-in for one fastpath worker's notice socket."""

    limit = notify.MAX_DATAGRAM           # what the notifier of this transport may send

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)

    def datagrams(self):
        """[(sender, seq, [keys])] of everything queued, checking the framing."""
        out = []
        while True:
            try:
                data = self.sock.recv(notify.MAX_DATAGRAM + 1)
            except BlockingIOError:
                return out
            assert len(data) <= self.limit and data.isascii() and data.endswith(b"\n")
            head, *keys = data.decode().split("\n")[:-1]
            magic, sender, seq = head.split(" ")
            assert magic == "PN1" and len(sender) == 16 and int(sender, 16) >= 0 and seq == str(int(seq))
            out.append((sender, int(seq), keys))

    def close(self):
        self.sock.close()


@pytest.fixture
def workers(tmp_path, settings):
    """make(n, dirs=1) -> n Worker sockets spread over ``dirs`` notify directories, configured."""
    made = []

    def make(n, dirs=1):
        paths = [tmp_path / f"n{d}" for d in range(dirs)]
        for path in paths:
            path.mkdir(exist_ok=True)
        settings.FASTPOLL = dict(settings.FASTPOLL, NOTIFY_DIRS=[str(p) for p in paths])
        made.extend(Worker(paths[i % dirs] / f"{i}.sock") for i in range(n))
        return made[-n:]

    yield make
    for worker in made:
        worker.close()


def keys_of(datagrams, threads=False):
    """The keys the datagrams name (without the plurks' thread keys unless ``threads``)."""
    return [key for _, _, keys in datagrams for key in keys if threads or ":getThread:" not in key]


def test_batches_fit_a_datagram_and_seqs_are_consecutive_per_destination(workers):
    """Far more datagrams than a socket queues (net.unix.max_dgram_qlen): the sender waits for
    room while the reader drains, so nothing is lost."""
    a, b = workers(2, dirs=2)
    many = [f"p1:getMessages:{uid}:{uid % 7}" for uid in range(1, 50001)]
    received = {a: [], b: []}
    done = threading.Event()

    def drain(worker):
        while not done.is_set():
            select.select([worker.sock], [], [], 0.01)
            received[worker].extend(worker.datagrams())

    threads = [threading.Thread(target=drain, args=(w,)) for w in (a, b)]
    for thread in threads:
        thread.start()
    try:
        notifier = notify.UnixDatagramNotifier()
        notifier.send(many)
        notifier.send(["p1:getUnreadCount:1:0"])
    finally:
        done.set()
        for thread in threads:
            thread.join()
    for worker in (a, b):
        got = received[worker] + worker.datagrams()
        assert len(got) > 12 and {sender for sender, _, _ in got} == {notify.sender_id()}
        assert [seq for _, seq, _ in got] == list(range(1, len(got) + 1))
        assert keys_of(got) == sorted(many) + ["p1:getUnreadCount:1:0"]


def test_a_large_notice_waits_for_no_worker(workers, monkeypatch):
    """5,000 keys (a fan-out's notice to 2,500 followers) to four workers that have not read yet:
    a few datagrams each, within what a socket queues, so none is waited on and none is dropped.
    Cut at 4096 bytes they were 27 each: the sender waited FULL_WAIT for each worker in turn and
    dropped the rest, and their polls waited for fastpath's re-read."""
    four = workers(4)
    many = [f"p1:getMessages:{uid}:0" for uid in range(1, 5001)]
    waits = []
    connected = notify._connected
    monkeypatch.setattr(notify, "_connected", lambda *args: waits.append(args) or connected(*args))
    before = dict(notify.stats)
    notify.UnixDatagramNotifier().send(many)
    assert notify.stats["full"] == before["full"] and waits == []
    for worker in four:
        got = worker.datagrams()
        assert keys_of(got) == sorted(many) and 1 < len(got) <= 3


def test_udp_notices_stay_small(udp_workers):
    """UDP crosses networks: a notice is cut to MAX_UDP_DATAGRAM, a few IP fragments at most."""
    [worker] = udp_workers(1)
    many = [f"p1:getMessages:{uid}:0" for uid in range(1, 1001)]
    notify.get_backend().send(many)
    got = worker.datagrams(expect=len(notify.batches(many, notify.MAX_UDP_DATAGRAM - notify.HEADER_ROOM)))
    assert keys_of(got) == sorted(many) and len(got) > 4


def test_keys_that_fit_make_one_datagram(workers):
    [worker] = workers(1)
    keys = [f"p1:getMessages:{9223372036854775807 - i}:9223372036854775807" for i in range(73)]
    assert len("".join(k + "\n" for k in keys)) > 4000
    notify.UnixDatagramNotifier().send(keys)
    [(_, seq, got)] = worker.datagrams()
    assert (seq, got) == (1, sorted(keys))


def test_batches_split_at_line_ends_within_the_limit():
    keys = [f"p1:getMessages:{uid}:0" for uid in range(1, 400)] + ["p1:" + "x" * 80 + ":1:0", "p1:a:1:0"]
    for limit in (30, 64, 100, 4032):
        bodies = notify.batches(keys, limit)
        assert b"".join(bodies) == "".join(k + "\n" for k in keys).encode()
        for body in bodies:
            assert body.endswith(b"\n")
            # over the limit only as a single line that is longer than the limit by itself
            assert len(body) <= limit or body.count(b"\n") == 1
        # greedy: no body could have taken the next body's first line
        for body, following in zip(bodies, bodies[1:]):
            assert len(body) + len(following.split(b"\n", 1)[0]) + 1 > limit
    assert notify.batches([]) == []


def test_no_directories_no_notices(workers, settings):
    [worker] = workers(1)
    settings.FASTPOLL = dict(settings.FASTPOLL, NOTIFY_DIRS=[])
    before = dict(notify.stats)
    notify.get_backend().send(["p1:x:1:0"])
    assert worker.datagrams() == [] and notify.stats == before


@pytest.mark.django_db(transaction=True)
def test_a_committed_plurk_notifies_exactly_the_followers_keys(signup, cache1, workers):
    a, b, c, d = (signup(n) for n in "abcd")
    b.call("POST", "/api/follow", {"username": "a"})
    c.call("POST", "/api/follow", {"username": "a"})
    d.call("POST", "/api/follow", {"username": "b"})
    first, second = workers(2)
    assert a.call("POST", "/api/plurks", {"content": "hello"}).status_code == 201
    plurk = Plurk.objects.get(content="hello")
    expected = sorted(key_of(r, u.user["id"]) for r in RESOURCES for u in (b, c))
    for worker in (first, second):
        # the followers' keys, then the plurk's thread (written after the users' keys)
        assert worker.datagrams() == [(notify.sender_id(), 1, expected),
                                      (notify.sender_id(), 2, [f"p1:getThread:{plurk.pk}:o"])]


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transaction_notifies_nothing(signup, cache1, workers):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    [worker] = workers(1)
    author = get_user_model().objects.get(pk=a.user["id"])
    with pytest.raises(ZeroDivisionError):
        with transaction.atomic():
            Plurk.objects.create(author=author, content="never")
            1 / 0
    assert worker.datagrams() == []
    with transaction.atomic():
        Plurk.objects.create(author=author, content="committed")
    assert keys_of(worker.datagrams()) == sorted(key_of(r, b.user["id"]) for r in RESOURCES)


@pytest.mark.django_db(transaction=True)
def test_dead_missing_and_full_sockets_do_not_fail_the_commit(signup, cache1, workers, tmp_path):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    dead, full, alive = workers(3)
    dead.close()                       # its path stays: ECONNREFUSED
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    filler.setblocking(False)
    try:                               # nobody reads it: EAGAIN once its queue is full
        while True:
            filler.sendto(b"x", full.path)
    except BlockingIOError:
        pass
    finally:
        filler.close()
    (tmp_path / "n0" / "9.sock").symlink_to(tmp_path / "gone.sock")     # ENOENT
    before = dict(notify.stats)
    start = time.monotonic()
    assert a.call("POST", "/api/plurks", {"content": "p"}).status_code == 201
    assert time.monotonic() - start < 5
    assert notify.stats["refused"] > before["refused"] and notify.stats["missing"] > before["missing"]
    assert notify.stats["full"] > before["full"]
    assert keys_of(alive.datagrams()) == sorted(key_of(r, b.user["id"]) for r in RESOURCES)


def test_failures_are_logged_rate_limited(workers, caplog, monkeypatch):
    [worker] = workers(1)
    worker.close()
    monkeypatch.setattr(notify, "_last_log", {})
    notifier = notify.UnixDatagramNotifier()
    with caplog.at_level("WARNING", logger="fastpoll.notify"):
        for _ in range(5):
            notifier.send(["p1:x:1:0"])
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1


def test_the_sender_id_changes_after_fork(workers):
    [worker] = workers(1)
    notifier = notify.UnixDatagramNotifier()
    notifier.send(["p1:x:1:0"])
    pid = os.fork()
    if pid == 0:                       # the child: send one notice, leave at once
        try:
            notifier.send(["p1:x:2:0"])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    notifier.send(["p1:x:3:0"])
    parent, child, parent_again = sorted(worker.datagrams(), key=lambda d: d[2])
    assert parent[0] == parent_again[0] == notify.sender_id() != child[0]
    assert (parent[1], child[1], parent_again[1]) == (1, 1, 2)


class Recorder(notify.Notifier):
    sent = []

    def send(self, keys):
        Recorder.sent.append(sorted(keys))


class Broken(notify.Notifier):
    def send(self, keys):
        raise RuntimeError("broken backend")


@pytest.mark.django_db(transaction=True)
def test_the_backend_is_chosen_by_dotted_path(signup, cache1, settings):
    settings.FASTPOLL = dict(settings.FASTPOLL, NOTIFY_BACKEND=f"{__name__}.Recorder")
    Recorder.sent.clear()
    a, b = signup("a"), signup("b")
    assert isinstance(notify.get_backend(), Recorder)
    assert sorted(key_of(r, a.user["id"]) for r in RESOURCES) in Recorder.sent
    settings.FASTPOLL = dict(settings.FASTPOLL, NOTIFY_BACKEND=f"{__name__}.Broken")
    before = notify.stats["errors"]
    assert b.call("POST", "/api/follow", {"username": "a"}).status_code < 300
    assert notify.stats["errors"] > before


# ---- UdpNotifier: the same datagrams to every worker port of every web host (issue 16) --------

class UdpWorker(Worker):
    """A stand-in for one fastpath worker's UDP notice port (--notify-udp)."""

    limit = notify.MAX_UDP_DATAGRAM

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.dest = "127.0.0.1:%d" % self.sock.getsockname()[1]

    def datagrams(self, expect=0):
        """As Worker.datagrams, waiting (SLACK at most) until at least ``expect`` arrived."""
        out, deadline = [], time.monotonic() + 10
        while True:
            out += super().datagrams()
            if len(out) >= expect or time.monotonic() > deadline:
                return out
            select.select([self.sock], [], [], 0.05)


@pytest.fixture
def udp_workers(settings):
    made = []

    def make(n):
        made.extend(UdpWorker() for _ in range(n))
        settings.FASTPOLL = dict(settings.FASTPOLL, NOTIFY_BACKEND="fastpoll.notify.UdpNotifier",
                                  NOTIFY_UDP=[w.dest for w in made[-n:]])
        return made[-n:]

    yield make
    for worker in made:
        worker.close()


def test_udp_datagrams_batched_with_a_seq_per_destination(udp_workers):
    a, b = udp_workers(2)
    many = [f"p1:getMessages:{uid}:{uid % 7}" for uid in range(1, 301)]      # several datagrams
    notifier = notify.get_backend()
    assert isinstance(notifier, notify.UdpNotifier)
    notifier.send(many)
    notifier.send(["p1:getUnreadCount:1:0"])
    bodies = notify.batches(many, notify.MAX_UDP_DATAGRAM - notify.HEADER_ROOM)
    for worker in (a, b):
        got = worker.datagrams(expect=len(bodies) + 1)
        assert len(got) == len(bodies) + 1 > 2
        assert {sender for sender, _, _ in got} == {notify.sender_id()}
        assert [seq for _, seq, _ in got] == list(range(1, len(got) + 1))
        assert keys_of(got) == sorted(many) + ["p1:getUnreadCount:1:0"]


def test_udp_and_unix_send_the_same_bytes(udp_workers, workers):
    [unix] = workers(1)
    [udp] = udp_workers(1)
    keys = ["p1:getMessages:5:0", "p1:getUnreadCount:5:0"]
    notify.UnixDatagramNotifier().send(keys)
    notify.UdpNotifier().send(keys)
    assert unix.datagrams() == udp.datagrams(expect=1) == [(notify.sender_id(), 1, sorted(keys))]


def test_a_closed_udp_port_is_counted_refused_never_raised(udp_workers, caplog, monkeypatch):
    closed, alive = udp_workers(2)
    closed.close()                     # nothing listens there: the kernel answers ICMP
    monkeypatch.setattr(notify, "_last_log", {})
    notifier = notify.UdpNotifier()
    before = dict(notify.stats)
    with caplog.at_level("WARNING", logger="fastpoll.notify"):
        deadline = time.monotonic() + 10
        n = 0
        while notify.stats["refused"] == before["refused"]:   # the ICMP error comes back later
            assert time.monotonic() < deadline, notify.stats
            notifier.send([f"p1:x:{n}:0"])
            n += 1
            time.sleep(0.01)
    assert [seq for _, seq, _ in alive.datagrams(expect=n)] == list(range(1, n + 1))
    assert any("udp:" + closed.dest in r.getMessage() and "refused" in r.getMessage() for r in caplog.records)


def test_udp_to_an_unreachable_address_is_counted_never_raised(settings):
    settings.FASTPOLL = dict(settings.FASTPOLL, NOTIFY_UDP=["no-such-host.invalid:9100"])
    before = notify.stats["errors"]
    notify.UdpNotifier().send(["p1:x:1:0"])
    assert notify.stats["errors"] == before + 1
