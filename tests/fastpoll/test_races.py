"""No stale answer survives: each race forced deterministically with the publisher's hooks.

A hook runs the interfering change synchronously (in the same thread) at the exact point of the
other writer, so every interleaving below happens on every run, with no sleeps."""
import pytest
from django.core.management import call_command

from fastpoll import publish, repair
from fastpoll import ledger
from fastpoll.cache import get_cache
from fastpoll.models import StaleKey, SuspectServer

from tests.plurkcore.helpers import assert_consistent, cached, key_of, server_client, truth

pytestmark = pytest.mark.django_db(transaction=True)


def once(func):
    """A hook that runs ``func`` the first time only."""
    done = []

    def hook(**context):
        if not done:
            done.append(context)
            func()
    hook.calls = done
    return hook


@pytest.fixture
def pair(cache1, signup):
    a, b = signup("a"), signup("b")
    assert b.call("POST", "/api/follow", {"username": "a"}).status_code == 201
    return a, b


def drop(uid, resource="getUnreadCount"):
    get_cache().client.delete(key_of(resource, uid))


# (a) a miss-fill computed before a change, stored after that change's write ------------------
@pytest.mark.parametrize("resource", ["getUnreadCount", "getMessages"])
def test_fill_computed_before_a_change_never_overwrites_it(pair, cache1, hooks, resource):
    a, b = pair
    drop(b.user["id"], resource)
    hook = once(lambda: a.call("POST", "/api/plurks", {"content": "meanwhile"}))
    hooks("fill.after_read", hook)
    resp = b.get(f"/Poll/{resource}", HTTP_AUTHORIZATION=f"Bearer {b.token}")
    assert hook.calls and resp.status_code == 204       # answered from before the change...
    assert cached(resource, b.user["id"], [cache1]) == truth(resource, b.user["id"]) != b""   # ...not cached


def test_fill_for_a_revoked_epoch_does_not_survive(pair, cache1, hooks):
    a, b = pair
    old = key_of("getUnreadCount", b.user["id"])
    drop(b.user["id"])
    hooks("fill.after_read", once(lambda: b.call("POST", "/api/logout")))
    b.get("/Poll/getUnreadCount", HTTP_AUTHORIZATION=f"Bearer {b.token}")
    assert server_client(cache1.spec).get(old) is None


# (b) two changes' writes arriving out of order --------------------------------------------
@pytest.mark.parametrize("present", [True, False], ids=["cas", "add"])
def test_older_write_arriving_last_is_rejected_and_retried(pair, cache1, hooks, present):
    a, b = pair
    if not present:
        drop(b.user["id"])
    conflicts = publish.stats["conflicts"]
    # writer 1 (first plurk) has read the database; writer 2 (second plurk) runs to completion
    hook = once(lambda: a.call("POST", "/api/plurks", {"content": "second"}))
    hooks("write.after_read", hook)
    a.call("POST", "/api/plurks", {"content": "first"})
    assert hook.calls
    assert publish.stats["conflicts"] > conflicts
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":2}'
    assert_consistent([a.user["id"], b.user["id"]], [cache1], require=True)


def test_write_for_a_revoked_epoch_does_not_survive(pair, cache1, hooks):
    a, b = pair
    old = key_of("getUnreadCount", b.user["id"])
    hooks("write.after_read", once(lambda: b.call("POST", "/api/logout")))
    a.call("POST", "/api/plurks", {"content": "x"})
    assert server_client(cache1.spec).get(old) is None
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":1}'


def test_endless_conflicts_become_stale_keys_for_the_repair_pass(pair, cache1, hooks, settings):
    a, b = pair
    settings.FASTPOLL = dict(settings.FASTPOLL, MEMCACHED_SERVERS=[cache1.spec], CAS_ATTEMPTS=2)
    other = server_client(cache1.spec)
    key = key_of("getUnreadCount", b.user["id"])
    hooks("write.after_read", lambda **ctx: other.set(key, b"garbage"))   # a conflict every time
    a.call("POST", "/api/plurks", {"content": "x"})
    hooks("write.after_read", None)
    assert StaleKey.objects.filter(key=key).exists()
    assert other.get(key) == b"garbage"
    call_command("repaircache")
    assert not StaleKey.objects.exists()
    assert other.get(key) == b'{"count":1}'


def _stale_pair(pair):
    """Every key of the pair recorded stale, as a writer that ran out of attempts records them."""
    stale = [key_of(resource, user.user["id"]) for user in pair for resource in ("getUnreadCount", "getMessages")]
    ledger.mark_stale(stale)
    return stale


def test_paid_stale_keys_are_forgotten_in_one_statement(pair, cache1):
    """A statement per row was a write transaction each: on SQLite every other writer queued
    behind a pass that forgot hundreds of keys."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    stale = _stale_pair(pair)
    with CaptureQueriesContext(connection) as ctx:
        report = repair.repair()
    deletes = [q["sql"] for q in ctx.captured_queries
               if q["sql"].startswith("DELETE") and StaleKey._meta.db_table in q["sql"]]
    assert report["rewritten"] == len(stale) and not StaleKey.objects.exists()
    assert len(deletes) == 1, deletes


def test_a_stale_key_marked_again_while_paid_is_kept(pair, cache1, hooks):
    stale = _stale_pair(pair)
    hooks("write.after_store", once(lambda: ledger.mark_stale(stale[:1])))   # generation 2 meanwhile
    repair.repair()
    assert list(StaleKey.objects.values_list("key", flat=True)) == stale[:1]


def test_one_quick_pass_at_a_time_in_a_process(pair, cache1, hooks):
    """While one thread rewrites the stale keys, another thread's publish does not rewrite them
    too (the threads of a busy worker all did, conflicting with one another on those keys)."""
    import threading

    _stale_pair(pair)
    entered, go = threading.Event(), threading.Event()
    passes = []

    def rewrite(**context):
        passes.append(threading.current_thread().name)
        entered.set()
        assert go.wait(10)
    hooks("repair.before_rewrite", rewrite)
    first = threading.Thread(target=repair.repair, kwargs={"quick": True}, name="first")
    first.start()
    try:
        assert entered.wait(10)
        report = repair.repair(quick=True)
    finally:
        go.set()
        first.join(10)
    assert report["busy"] and report["rewritten"] == 0
    assert passes == ["first"] and not StaleKey.objects.exists()
    # and the next quick pass, with the first one done, runs again
    _stale_pair(pair)
    assert repair.repair(quick=True)["rewritten"] == 4 and passes == ["first", "MainThread"]


def test_a_thread_turned_away_gets_its_pass_from_the_one_running(pair, cache1, hooks):
    """A debt recorded after the running pass read the tables, by a thread that is then turned
    away, is paid by the running thread's second pass, not left to the next publish."""
    import threading

    stale = _stale_pair(pair)
    StaleKey.objects.filter(key__in=stale[2:]).delete()     # the first pass sees two keys
    entered, go = threading.Event(), threading.Event()
    seen = []

    def rewrite(keys, **context):
        seen.append(sorted(keys))
        if len(seen) == 1:
            entered.set()
            assert go.wait(10)
    hooks("repair.before_rewrite", rewrite)
    first = threading.Thread(target=repair.repair, kwargs={"quick": True})
    first.start()
    try:
        assert entered.wait(10)
        ledger.mark_stale(stale[2:])                         # recorded after it read them
        assert repair.repair(quick=True)["busy"]
    finally:
        go.set()
        first.join(10)
    assert seen == [sorted(stale[:2]), sorted(stale[2:])] and not StaleKey.objects.exists()


def test_a_failing_quick_pass_does_not_stop_the_write(pair, cache1, monkeypatch):
    a, b = pair

    def broken(quick=False):
        raise RuntimeError("the debts tables are unreadable")
    monkeypatch.setattr(repair, "repair", broken)
    assert a.call("POST", "/api/plurks", {"content": "x"}).status_code == 201
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":1}'


def test_paid_stale_keys_that_cannot_be_forgotten_stay_for_the_next_pass(pair, cache1, monkeypatch):
    from django.db import OperationalError
    from django.db.models import QuerySet

    stale = _stale_pair(pair)
    real = QuerySet.delete

    def deadlocked(self):
        if self.model is StaleKey:
            raise OperationalError("deadlock detected")
        return real(self)
    monkeypatch.setattr(QuerySet, "delete", deadlocked)
    report = repair.repair()
    assert report["rewritten"] == len(stale) and StaleKey.objects.count() == len(stale)
    monkeypatch.setattr(QuerySet, "delete", real)
    assert repair.repair()["rewritten"] == len(stale) and not StaleKey.objects.exists()


# (c) a change committed while memcached is unreachable -------------------------------------
def test_change_while_unreachable_then_server_returns_with_old_entries(pair, cache1, settings):
    a, b = pair
    settings.FASTPOLL = dict(settings.FASTPOLL, MEMCACHED_SERVERS=[cache1.spec],
                              MEMCACHED_RETRY_INTERVAL=0.001)
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b""
    cache1.pause()                                 # partition: it keeps its (soon stale) entries
    try:
        assert a.call("POST", "/api/plurks", {"content": "during"}).status_code == 201
    finally:
        cache1.resume()
    assert SuspectServer.objects.filter(server=cache1.spec).exists()
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b""      # stale, but the debt is known
    # the next publish pays the debt first: flush, then write
    a.call("POST", "/api/plurks/%d/responses" % a.call("POST", "/api/plurks", {"content": "next"}).json()["id"],
           {"content": "r"})
    assert not SuspectServer.objects.exists()
    assert_consistent([a.user["id"], b.user["id"]], [cache1])
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":3}'


def test_flush_racing_a_new_failure_keeps_the_server_suspect(pair, cache1, settings, hooks):
    a, b = pair
    settings.FASTPOLL = dict(settings.FASTPOLL, MEMCACHED_SERVERS=[cache1.spec],
                              MEMCACHED_RETRY_INTERVAL=0.001)
    ledger.mark_suspect(cache1.spec)
    # a second failure is recorded while the repair pass is flushing: the row must stay
    hooks("repair.before_flush", once(lambda: ledger.mark_suspect(cache1.spec)))
    repair.repair()
    assert SuspectServer.objects.filter(server=cache1.spec).exists()
    repair.repair()
    assert not SuspectServer.objects.exists()


def test_a_debt_made_anew_while_another_pass_runs_is_not_paid_by_it(pair, cache1, settings, hooks):
    """Two repair passes at once (every Django process runs one, and a repaircache on each cluster
    host with the repair role): pass B read the row; pass A flushed and deleted it; a new failure
    made the row again, generation 1 like the one B read.  B must not delete the new debt."""
    settings.FASTPOLL = dict(settings.FASTPOLL, MEMCACHED_SERVERS=[cache1.spec],
                              MEMCACHED_RETRY_INTERVAL=0.001)
    ledger.mark_suspect(cache1.spec)

    def other_pass_then_new_failure(**_):
        repair.repair()                                   # pass A pays the debt B read
        assert not SuspectServer.objects.exists()
        ledger.mark_suspect(cache1.spec)                  # and a new one is recorded
    hooks("repair.before_flush", once(other_pass_then_new_failure))
    repair.repair()                                       # pass B
    assert SuspectServer.objects.filter(server=cache1.spec).exists()
    repair.repair()
    assert not SuspectServer.objects.exists()


# (d) a server that goes away and comes back holding pre-outage entries -----------------------
def test_server_away_keys_not_moved_then_back_with_old_entries(signup, cache3, settings):
    settings.FASTPOLL = dict(settings.FASTPOLL, MEMCACHED_RETRY_INTERVAL=0.001)
    a = signup("a")
    followers = [signup(f"f{i}") for i in range(12)]
    for f in followers:
        f.call("POST", "/api/follow", {"username": "a"})
    away = cache3[0]
    on_away = [f for f in followers if get_cache().node_for(key_of("getUnreadCount", f.user["id"])) == away.spec]
    assert on_away, "no follower's key maps to the paused server; add followers"
    before = {f.user["id"]: cached("getUnreadCount", f.user["id"], cache3) for f in on_away}
    assert set(before.values()) == {b""}
    away.pause()
    try:
        assert a.call("POST", "/api/plurks", {"content": "while away"}).status_code == 201
        # nothing was written to a substitute server: fastpath would never read it there
        for f in on_away:
            key = key_of("getUnreadCount", f.user["id"])
            for other in cache3[1:]:
                assert server_client(other.spec).get(key) is None
        # the keys on the other servers are fresh
        fresh = 0
        for f in followers:
            for resource in ("getUnreadCount", "getMessages"):
                if get_cache().node_for(key_of(resource, f.user["id"])) != away.spec:
                    assert cached(resource, f.user["id"], cache3) == truth(resource, f.user["id"]) != b""
                    fresh += 1
        assert fresh
    finally:
        away.resume()
    for f in on_away:   # back, holding the pre-outage entries
        assert cached("getUnreadCount", f.user["id"], cache3) == b""
    call_command("repaircache")                     # what the runner's service does
    assert not SuspectServer.objects.exists()
    for f in on_away:
        assert cached("getUnreadCount", f.user["id"], cache3) is None      # flushed: a miss
        resp = f.get("/Poll/getUnreadCount", HTTP_AUTHORIZATION=f"Bearer {f.token}")
        assert resp.json() == {"count": 1}
        assert cached("getUnreadCount", f.user["id"], cache3) == b'{"count":1}'
    assert_consistent([f.user["id"] for f in followers], cache3)


def test_repair_leaves_an_unreachable_server_suspect(pair, cache1, settings):
    a, b = pair
    cache1.kill()
    a.call("POST", "/api/plurks", {"content": "x"})
    assert SuspectServer.objects.exists()
    report = repair.repair()
    assert report["unreachable"] == [cache1.spec] and SuspectServer.objects.exists()
    cache1.start()                                   # back empty: flushing it is harmless
    settings.FASTPOLL = dict(settings.FASTPOLL, MEMCACHED_SERVERS=[cache1.spec])
    assert repair.repair()["flushed"] == [cache1.spec]


def test_entries_commit_in_id_order(signup):
    """The read cursor is an id: an entry with a smaller id must never commit after a larger one
    (it would count as read before anyone saw it).  A first plurk's transaction stays open; a
    second plurk, from another connection, must wait for it and get the larger id."""
    import threading

    from django.db import connection, connections, transaction

    from plurkcore.models import Plurk

    if connection.vendor != "postgresql":
        pytest.skip("SQLite serialises writers; its in-memory test database cannot even wait")
    a = signup("a")
    author_id = a.user["id"]
    first_inserted, release = threading.Event(), threading.Event()
    ids = {}

    def first():
        try:
            with transaction.atomic():
                ids["first"] = Plurk.objects.create(author_id=author_id, content="first").pk
                first_inserted.set()
                release.wait(10)
        finally:
            connections.close_all()

    def second():
        try:
            ids["second"] = Plurk.objects.create(author_id=author_id, content="second").pk
        finally:
            connections.close_all()

    t1 = threading.Thread(target=first)
    t1.start()
    assert first_inserted.wait(10)
    t2 = threading.Thread(target=second)
    t2.start()
    t2.join(0.5)
    assert t2.is_alive(), "a second entry committed while an earlier one was still open"
    release.set()
    t1.join(10)
    t2.join(10)
    assert ids["first"] < ids["second"]
