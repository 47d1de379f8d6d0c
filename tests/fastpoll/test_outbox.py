"""The outbox: a committed change's answers are written even when the process that committed dies
before writing them (a web host killed mid-load; docs/consistency.md, case (e)).

Most tests make a process "die" by never running its after-commit callback: the change is
committed, its outbox row with it, and nothing else happens, which is what SIGKILL between the
commit and the stores leaves behind.  The last test does it for real, to a separate Django process
at the writer's hook point; the drill ``web-host-lost`` kills whole web hosts."""
import threading
import time
import types

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import transaction

from fastpoll import background, changes, publish, repair
from fastpoll.models import PendingChange
from plurkcore.models import Plurk

from tests.plurkcore.helpers import assert_consistent, cached, truth

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pair(cache1, signup):
    a, b = signup("a"), signup("b")
    assert b.call("POST", "/api/follow", {"username": "a"}).status_code == 201
    return a, b


@pytest.fixture
def no_grace(settings):
    """Rows are abandoned at once (the default, OUTBOX_GRACE 5 s, waits for a slow writer)."""
    settings.FASTPOLL = dict(settings.FASTPOLL, OUTBOX_GRACE=0.001)


@pytest.fixture
def killed_writer(monkeypatch):
    """Commits go through; their writers never run (the process died right after COMMIT)."""
    monkeypatch.setattr(changes._Batch, "__call__", lambda self: None)


def post(author_id, content):
    with transaction.atomic():
        return Plurk.objects.create(author=get_user_model().objects.get(pk=author_id), content=content)


def test_a_written_change_leaves_no_outbox_row(pair, cache1):
    a, b = pair
    post(a.user["id"], "hello")
    assert PendingChange.objects.count() == 0
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":1}'


def test_the_row_commits_with_the_change_and_rolls_back_with_it(pair, killed_writer):
    a, _ = pair
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            Plurk.objects.create(author=get_user_model().objects.get(pk=a.user["id"]), content="x")
            assert PendingChange.objects.count() == 1
            raise RuntimeError
    assert PendingChange.objects.count() == 0
    post(a.user["id"], "kept")
    assert PendingChange.objects.count() == 1


def test_a_change_whose_writer_died_is_written_by_the_repair_pass(pair, cache1, no_grace, monkeypatch):
    a, b = pair
    with monkeypatch.context() as m:
        m.setattr(changes._Batch, "__call__", lambda self: None)
        post(a.user["id"], "nobody wrote my answers")
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b""          # stale
    assert PendingChange.objects.count() == 1
    report = repair.repair()
    assert report["replayed"] == 1
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":1}'
    assert_consistent([a.user["id"], b.user["id"]], [cache1], require=True)
    assert PendingChange.objects.count() == 0


def test_the_repair_service_replays_too(pair, cache1, no_grace, killed_writer, capsys):
    a, b = pair
    post(a.user["id"], "one")
    post(a.user["id"], "two")
    call_command("repaircache")
    assert "wrote the answers of 2 change(s)" in capsys.readouterr().out
    assert cached("getMessages", b.user["id"], [cache1]) == truth("getMessages", b.user["id"])


def test_a_young_row_is_left_to_its_writer(pair, cache1, killed_writer):
    a, b = pair
    post(a.user["id"], "still being written")       # OUTBOX_GRACE is 5 s
    assert repair.repair()["replayed"] == 0
    assert PendingChange.objects.count() == 1


def test_the_quick_pass_of_a_publish_leaves_the_outbox_alone(pair, cache1, no_grace, killed_writer):
    a, _ = pair
    post(a.user["id"], "one")
    assert repair.repair(quick=True)["replayed"] == 0
    assert PendingChange.objects.count() == 1


def test_a_write_that_failed_keeps_its_row_until_written(pair, cache1, no_grace, hooks):
    a, b = pair

    def database_gone(**context):
        raise RuntimeError("the database went away after the commit")
    hooks("write.after_gets", database_gone)
    errors = publish.stats["errors"]
    post(a.user["id"], "hello")
    assert publish.stats["errors"] == errors + 1
    assert PendingChange.objects.count() == 1
    hooks("write.after_gets", None)
    assert repair.repair()["replayed"] == 1
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":1}'
    assert PendingChange.objects.count() == 0


def test_a_debt_that_could_not_be_recorded_keeps_the_row(pair, cache1, monkeypatch):
    a, _ = pair
    monkeypatch.setattr(repair.StaleKey.objects, "filter",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("database gone")))
    failing = types.SimpleNamespace(per="user", compute=lambda uids: (_ for _ in ()).throw(RuntimeError("query failed")))
    monkeypatch.setattr(publish.resources, "get", lambda name: failing)
    unrecorded = repair.stats["unrecorded"]
    post(a.user["id"], "hello")
    assert repair.stats["unrecorded"] > unrecorded
    assert PendingChange.objects.count() == 1


def test_an_unreadable_row_is_dropped_not_retried_forever(cache1, no_grace):
    PendingChange.objects.create(change="{not json")
    time.sleep(0.01)                 # older than OUTBOX_GRACE by the database's clock (1 ms resolution)
    assert repair.repair()["replayed"] == 1
    assert PendingChange.objects.count() == 0


@pytest.fixture
def crowd(pair, signup, settings):
    """a with two followers (b, c), and FANOUT_IN_REQUEST 1: a's posts are large fan-outs."""
    c = signup("c")
    assert c.call("POST", "/api/follow", {"username": "a"}).status_code == 201
    settings.FASTPOLL = dict(settings.FASTPOLL, FANOUT_IN_REQUEST=1)
    return (*pair, c)


@pytest.fixture
def gated_background(monkeypatch):
    """Background writes wait for ``gate.set()``; ``fail`` makes them raise instead."""
    gate, real = threading.Event(), changes._Batch.write
    state = {"fail": False}

    def write(self):
        if threading.current_thread() is threading.main_thread():
            return real(self)                            # written in the request: not gated
        assert gate.wait(10), "the test never opened the gate"
        if state["fail"]:
            raise RuntimeError("the process went away mid-write")
        real(self)
    monkeypatch.setattr(changes._Batch, "write", write)
    yield types.SimpleNamespace(gate=gate, state=state)
    gate.set()
    background.wait()


def test_a_large_fan_out_is_written_after_the_request_its_row_kept_until_then(crowd, cache1, gated_background):
    a, b, c = crowd
    submitted = background.stats["submitted"]
    post(a.user["id"], "to my many followers")          # returns with nothing written yet
    assert background.stats["submitted"] == submitted + 1
    assert PendingChange.objects.count() == 1
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b""
    gated_background.gate.set()
    background.wait()
    assert PendingChange.objects.count() == 0
    for follower in (b, c):
        assert cached("getUnreadCount", follower.user["id"], [cache1]) == b'{"count":1}'
    assert_consistent([a.user["id"], b.user["id"], c.user["id"]], [cache1], require=True)


def test_a_small_change_is_still_written_in_the_request(crowd, cache1, gated_background):
    a, b, _ = crowd
    submitted = background.stats["submitted"]
    b_plurk = post(b.user["id"], "nobody follows me")     # no followers: in the request
    assert background.stats["submitted"] == submitted and PendingChange.objects.count() == 0
    with transaction.atomic():                           # a response: b's own answers and a's followers'
        Plurk.entries.create(author=get_user_model().objects.get(pk=a.user["id"]), parent=b_plurk,
                             content="re")
    assert background.stats["submitted"] == submitted
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":1}'


def test_a_fan_out_that_cannot_be_sized_is_written_in_the_request(crowd, cache1, monkeypatch):
    a, b, _ = crowd
    monkeypatch.setattr(publish, "is_large", lambda batch: (_ for _ in ()).throw(RuntimeError("database gone")))
    submitted = background.stats["submitted"]
    post(a.user["id"], "sized or not")                     # no exception reaches the committer
    assert background.stats["submitted"] == submitted
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":1}'
    assert PendingChange.objects.count() == 0


def test_a_background_write_that_dies_leaves_its_row_to_the_repair_pass(crowd, cache1, no_grace,
                                                                        gated_background):
    a, b, _ = crowd
    errors = background.stats["errors"]
    post(a.user["id"], "lost with its writer")
    gated_background.state["fail"] = True
    gated_background.gate.set()
    background.wait()
    assert background.stats["errors"] == errors + 1
    assert PendingChange.objects.count() == 1
    assert repair.repair()["replayed"] == 1
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":1}'
    assert PendingChange.objects.count() == 0


def test_a_long_write_renews_its_rows_so_the_repair_pass_leaves_them_alone(pair, signup, cache1, settings,
                                                                          hooks):
    """A write that outlives OUTBOX_GRACE would otherwise be written a second time by the repair
    pass, at once (the same fan-out twice); its writer moves its rows' age forward between chunks."""
    a, b = pair
    for name in ("c", "d", "e"):
        assert signup(name).call("POST", "/api/follow", {"username": "a"}).status_code == 201
    settings.FASTPOLL = dict(settings.FASTPOLL, OUTBOX_GRACE=0.2, BATCH_SIZE=4)   # chunks of 1, then 3
    seen = []

    def slow_first_chunk(**context):
        if not seen:
            seen.append("outlived the grace")
            time.sleep(0.3)
        elif len(seen) == 1:                      # the second chunk, after its writer's renewal
            seen.append("repairing")              # (a replay runs this hook too)
            seen[1] = repair.repair()["replayed"]
    hooks("write.after_gets", slow_first_chunk)
    post(a.user["id"], "a slow fan-out")
    assert seen == ["outlived the grace", 0]
    assert PendingChange.objects.count() == 0
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":1}'


def test_rows_round_trip():
    from fastpoll import outbox

    for change in (outbox.make(None, {3, 1}, (), {("followers", 2)}, {"k:1"}),
                   outbox.make(["getMessages"], {7}),
                   outbox.make(["thread"], objects={("thread", 5), ("thread", "a-b")})):
        assert outbox.decode(outbox.encode(change)) == change


# ---- for real: a separate Django process SIGKILLed between its commit and its stores ------------

_SETUP = """
from django.contrib.auth import get_user_model
from fastpoll import keys
from fastpoll.models import UserState
from plurkcore.models import Follow
User = get_user_model()
a, b = User.objects.create_user("a"), User.objects.create_user("b")
Follow.objects.create(follower=b, followee=a)
print(keys.answer_key("getUnreadCount", b.pk, UserState.objects.get(user=b).epoch))
"""

_KILLED = """
import os, signal
from django.contrib.auth import get_user_model
from django.db import transaction
from fastpoll import _testhooks
from plurkcore.models import Plurk
_testhooks.set_hook("write.after_gets", lambda **context: os.kill(os.getpid(), signal.SIGKILL))
with transaction.atomic():
    Plurk.objects.create(author=get_user_model().objects.get(username="a"), content="and then I died")
print("still alive")
"""

_REPAIR = """
from django.conf import settings
from fastpoll import conf
from fastpoll import repair
settings.FASTPOLL = dict(settings.FASTPOLL, OUTBOX_GRACE=0.001)
conf.reset()
print(repair.repair()["replayed"])
"""


def test_a_django_process_killed_after_its_commit_leaves_its_answers_to_the_repairer(memcached, manage_py):
    from tests.plurkcore.helpers import server_client

    manage = manage_py
    setup = manage("shell", "-c", _SETUP)
    key = setup.stdout.split()[-1]
    client = server_client(memcached.spec)
    assert client.get(key) == b"", setup.stderr          # b follows a: nothing new yet
    killed = manage("shell", "-c", _KILLED)
    assert killed.returncode == -9 and "still alive" not in killed.stdout, killed.stderr
    assert client.get(key) == b""                       # committed, never written: stale
    repaired = manage("shell", "-c", _REPAIR)
    assert repaired.stdout.split()[-1] == "1", repaired.stdout + repaired.stderr
    assert client.get(key) == b'{"count":1}'


def test_a_row_that_cannot_be_written_does_not_hold_the_others_back(pair, cache1, no_grace, killed_writer):
    """One poison row (an audience no longer registered) fails alone; the rows beside it are
    written and forgotten, it stays for an operator."""
    from fastpoll import outbox

    a, b = pair
    post(a.user["id"], "hello")
    PendingChange.objects.create(change=outbox.encode(outbox.make(None, audiences={("gone", 1)})))
    time.sleep(0.01)
    assert repair.repair()["replayed"] == 1
    assert [outbox.decode(c).audiences for c in PendingChange.objects.values_list("change", flat=True)] == \
        [frozenset({("gone", 1)})]
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":1}'


@pytest.mark.parametrize("users", [[get_user_model()], {"a": 1}, ["not-a-number"]])
def test_touch_refuses_what_is_not_a_user(users):
    import fastpoll

    with pytest.raises((TypeError, ValueError), match="users="):
        fastpoll.touch("getMessages", users=users)
    with pytest.raises(TypeError, match="resource name"):
        fastpoll.touch(5, users=[1])
