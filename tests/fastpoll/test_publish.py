"""After-commit cache writes against real memcached: every change rewrites every affected answer."""
import pytest

import fastpoll
from fastpoll import outbox
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from fastpoll import changes, keys, publish
from fastpoll.cache import get_cache
from fastpoll.models import SuspectServer, UserState
from plurkcore.models import ReadCursor, Follow, Plurk

from tests.plurkcore.helpers import assert_consistent, cached, elapsed_below, key_of, server_client, truth

pytestmark = pytest.mark.django_db(transaction=True)

RESOURCES = ("getUnreadCount", "getMessages")


def test_signup_writes_empty_answers(signup, cache1):
    a = signup("a")
    for resource in RESOURCES:
        assert cached(resource, a.user["id"], [cache1]) == b""


def test_every_change_kind_rewrites_answers(signup, cache1):
    a, b, c = signup("a"), signup("b"), signup("c")
    users = [a.user["id"], b.user["id"], c.user["id"]]
    steps = [
        lambda: b.call("POST", "/api/follow", {"username": "a"}),
        lambda: c.call("POST", "/api/follow", {"username": "a"}),
        lambda: a.call("POST", "/api/plurks", {"content": "p1"}),
        lambda: c.call("POST", "/api/plurks/%d/responses" % Plurk.objects.first().pk, {"content": "r"}),
        lambda: b.call("POST", "/api/markRead", {"upto": Plurk.objects.first().pk}),
        lambda: c.call("DELETE", "/api/follow/a"),
        lambda: a.call("POST", "/api/plurks", {"content": "p2"}),
    ]
    for step in steps:
        assert step().status_code < 300
        assert_consistent(users, [cache1], require=True)
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":2}'


def test_logout_deletes_old_keys_and_writes_new_epoch(signup, cache1):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    a.call("POST", "/api/plurks", {"content": "p"})
    old = {r: key_of(r, b.user["id"]) for r in RESOURCES}
    client = server_client(cache1.spec)
    assert client.get(old["getUnreadCount"]) == b'{"count":1}'
    assert b.call("POST", "/api/logout").status_code == 204
    for resource, key in old.items():
        assert client.get(key) is None
        assert key_of(resource, b.user["id"]).endswith(":1")
        assert cached(resource, b.user["id"], [cache1]) == truth(resource, b.user["id"])


def test_admin_edits_and_deletes_are_published(signup, cache1, client):
    a, b, c = signup("a"), signup("b"), signup("c")
    b.call("POST", "/api/follow", {"username": "a"})
    c.call("POST", "/api/follow", {"username": "b"})
    p = a.call("POST", "/api/plurks", {"content": "p"}).json()
    b.call("POST", f"/api/plurks/{p['id']}/responses", {"content": "r"})
    q = b.call("POST", "/api/plurks", {"content": "q"}).json()
    users = [a.user["id"], b.user["id"], c.user["id"]]
    admin = get_user_model().objects.create_superuser("root", password="root-pass-1")
    client.force_login(admin)
    resp = client.post(f"/admin/plurkcore/plurk/{p['id']}/change/", {"author": a.user["id"], "content": "edited",
                                                                     "created_0": "2026-01-01", "created_1": "00:00:00"})
    assert resp.status_code == 302, resp.content[:500]
    assert b"edited" in cached("getMessages", b.user["id"], [cache1])
    resp = client.post(f"/admin/plurkcore/plurk/{p['id']}/delete/", {"post": "yes"})
    assert resp.status_code == 302
    assert_consistent(users, [cache1], require=True)
    assert cached("getUnreadCount", a.user["id"], [cache1]) == b""      # the response went with it
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b""
    state = UserState.objects.get(user_id=b.user["id"])
    old_key = key_of("getUnreadCount", b.user["id"])
    state.epoch += 5
    state.save()
    assert server_client(cache1.spec).get(old_key) is None
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b""
    # deleting a user: its followers' answers lose its plurks, its own keys go away
    c_key = key_of("getUnreadCount", c.user["id"])
    assert server_client(cache1.spec).get(c_key) == b'{"count":1}'
    b_key = key_of("getUnreadCount", b.user["id"])
    get_user_model().objects.get(pk=b.user["id"]).delete()
    assert server_client(cache1.spec).get(c_key) == b""
    assert server_client(cache1.spec).get(b_key) is None
    assert q["id"] not in Plurk.entries.values_list("id", flat=True)


def test_one_transaction_one_batch(signup, cache1, monkeypatch):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    calls = []
    real = publish.publish
    monkeypatch.setattr(publish, "publish", lambda batch, alive=None: (calls.append(batch), real(batch, alive)))
    author = get_user_model().objects.get(pk=a.user["id"])
    with transaction.atomic():
        for i in range(20):
            Plurk.objects.create(author=author, content=f"p{i}")
        assert calls == []
    assert len(calls) == 1
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b'{"count":20}'


def test_rolled_back_changes_are_not_published(signup, cache1):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    author = get_user_model().objects.get(pk=a.user["id"])
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            Plurk.objects.create(author=author, content="never")
            raise RuntimeError
    assert cached("getUnreadCount", b.user["id"], [cache1]) == b""


@pytest.fixture
def batches(monkeypatch):
    """The batches the writer is given, as {resources: users} per batch (None: every resource)."""
    calls = []
    real = publish.publish

    def spy(batch, alive=None):
        calls.append({None if c.resources is None else tuple(sorted(c.resources)): set(c.users) for c in batch})
        return real(batch, alive)
    monkeypatch.setattr(publish, "publish", spy)
    return calls


def test_rolled_back_changes_are_not_written_at_the_next_commit(batches):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            fastpoll.touch(None, users={1})
            raise RuntimeError
    with transaction.atomic():
        fastpoll.touch(RESOURCES, users={2})
    assert batches == [{tuple(sorted(RESOURCES)): {2}}]


def test_a_change_after_a_rolled_back_savepoint_is_written(batches):
    with transaction.atomic():
        with pytest.raises(RuntimeError):
            with transaction.atomic():      # the transaction's first change, in a savepoint
                fastpoll.touch(None, users={1})
                raise RuntimeError
        fastpoll.touch(RESOURCES, users={2})
        assert batches == []
    assert batches == [{tuple(sorted(RESOURCES)): {2}}]


def test_first_poll_after_login_is_a_hit_without_update_last_login(signup, cache1):
    from django.contrib.auth.models import update_last_login
    from django.contrib.auth.signals import user_logged_in

    a = signup("a")
    uid = a.user["id"]
    for resource in RESOURCES:
        get_cache().client.delete(key_of(resource, uid))
    assert user_logged_in.disconnect(update_last_login, dispatch_uid="update_last_login")
    try:
        resp = a.call("POST", "/api/login", {"username": "a", "password": "secret-pass-1"})
    finally:
        user_logged_in.connect(update_last_login, dispatch_uid="update_last_login")
    assert resp.status_code == 200
    for resource in RESOURCES:
        assert cached(resource, uid, [cache1]) == b""      # present: fastpath answers it (HIT)
        poll = a.get(f"/Poll/{resource}", HTTP_AUTHORIZATION=f"Bearer {resp.json()['token']}")
        assert poll.status_code == 204


def test_last_login_alone_publishes_nothing_and_a_login_publishes_once(signup, cache1, batches):
    a = signup("a")
    user = get_user_model().objects.get(pk=a.user["id"])
    batches.clear()
    user.last_login = timezone.now()
    user.save(update_fields=["last_login"])         # no answer shows it
    assert batches == []
    assert a.call("POST", "/api/login", {"username": "a", "password": "secret-pass-1"}).status_code == 200
    assert batches == [{tuple(sorted(RESOURCES)): {user.pk}}]


def test_fanout_to_many_followers_on_three_servers(signup, cache3):
    a = signup("a")
    User = get_user_model()
    followers = User.objects.bulk_create([User(username=f"f{i}") for i in range(600)])
    UserState.objects.bulk_create([UserState(user=u) for u in followers])
    ReadCursor.objects.bulk_create([ReadCursor(user=u) for u in followers])
    Follow.objects.bulk_create([Follow(follower=u, followee_id=a.user["id"]) for u in followers])
    with elapsed_below(3):
        assert a.call("POST", "/api/plurks", {"content": "to everyone"}).status_code == 201
    per_server = {s.spec: 0 for s in cache3}
    for user in followers:
        for resource in RESOURCES:
            key = key_of(resource, user.pk)
            per_server[get_cache().node_for(key)] += 1
    assert all(n > 0 for n in per_server.values())      # really spread over the three
    sample = followers[::37]
    assert_consistent([u.pk for u in sample], cache3, require=True)
    assert cached("getUnreadCount", followers[-1].pk, cache3) == b'{"count":1}'


def test_memcached_dead_api_stays_fast_and_polls_answer_from_db(signup, cache1, settings):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    cache1.kill()
    with elapsed_below(1.0):
        for i in range(5):
            assert a.call("POST", "/api/plurks", {"content": f"p{i}"}).status_code == 201
        for _ in range(5):
            resp = b.get("/Poll/getUnreadCount", HTTP_AUTHORIZATION=f"Bearer {b.token}")
            assert resp.status_code == 200 and resp.json() == {"count": 5} and resp["X-Cache"] == "MISS"
    assert SuspectServer.objects.filter(server=cache1.spec).exists()
    assert get_cache().is_down(cache1.spec)


def test_memcached_frozen_api_stays_fast(signup, cache1):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    cache1.pause()
    try:
        with elapsed_below(1.5):
            for i in range(5):
                assert a.call("POST", "/api/plurks", {"content": f"p{i}"}).status_code == 201
                assert b.get("/Poll/getMessages", HTTP_AUTHORIZATION=f"Bearer {b.token}").json()["count"] == i + 1
    finally:
        cache1.resume()


def test_deactivated_user_keys_are_deleted_and_not_rewritten(signup, cache1):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    key = key_of("getUnreadCount", b.user["id"])
    assert server_client(cache1.spec).get(key) == b""
    user = get_user_model().objects.get(pk=b.user["id"])
    user.is_active = False
    user.save()
    assert server_client(cache1.spec).get(key) is None
    a.call("POST", "/api/plurks", {"content": "x"})
    assert server_client(cache1.spec).get(key) is None
    user.is_active = True
    user.save()
    assert server_client(cache1.spec).get(key) == b'{"count":1}'


def test_admin_response_needs_a_plurk_parent(signup, cache1, client):
    a, b = signup("a"), signup("b")
    p = a.call("POST", "/api/plurks", {"content": "p"}).json()
    r = b.call("POST", f"/api/plurks/{p['id']}/responses", {"content": "r"}).json()
    client.force_login(get_user_model().objects.create_superuser("root", password="root-pass-1"))
    data = {"author": b.user["id"], "content": "x", "created_0": "2026-01-01", "created_1": "00:00:00"}
    assert client.post("/admin/plurkcore/response/add/", data).status_code == 200          # no parent
    assert client.post("/admin/plurkcore/response/add/", {**data, "parent": r["id"]}).status_code == 200
    assert client.post("/admin/plurkcore/response/add/", {**data, "parent": p["id"]}).status_code == 302
    assert cached("getUnreadCount", a.user["id"], [cache1]) == b'{"count":2}'
    for app, model in (("plurkcore", "plurk"), ("plurkcore", "response"), ("plurkcore", "follow"),
                       ("plurkcore", "readcursor"), ("fastpoll", "userstate"), ("fastpoll", "suspectserver"),
                       ("fastpoll", "stalekey")):
        assert client.get(f"/admin/{app}/{model}/").status_code == 200, model
    assert client.get("/admin/plurkcore/plurk/").context["cl"].result_count == 1
    assert client.get("/admin/plurkcore/response/").context["cl"].result_count == 2


def test_rename_rewrites_the_answers_that_show_the_name(signup, cache1):
    a, b, c = signup("a"), signup("b"), signup("c")
    b.call("POST", "/api/follow", {"username": "a"})
    c.call("POST", "/api/follow", {"username": "b"})
    b.call("POST", "/api/plurks", {"content": "b's plurk"})
    a.call("POST", "/api/plurks/%d/responses" % Plurk.objects.get(content="b's plurk").pk, {"content": "hi"})
    a.call("POST", "/api/plurks", {"content": "a's plurk"})
    users = [a.user["id"], b.user["id"], c.user["id"]]
    assert_consistent(users, [cache1], require=True)
    user = get_user_model().objects.get(pk=a.user["id"])
    user.username = "a_renamed"
    user.save()
    # b follows a (a's plurk); c follows b, on whose plurk a responded
    assert b"a_renamed" in cached("getMessages", b.user["id"], [cache1])
    assert_consistent(users, [cache1], require=True)


def test_logout_retires_the_epoch_it_replaced(signup, cache1, monkeypatch):
    """Two logouts race with tokens of the same epoch; between the second one's token check and
    its update, the first one commits and a login writes epoch 1's answers.  The second logout
    must delete the keys of the epoch its own update replaced (1), not those of its token's (0),
    or fastpath would go on serving epoch 1's entries to revoked tokens until the TTL."""
    from fastpoll import auth as http

    a = signup("a")
    uid = a.user["id"]
    login = {"username": "a", "password": "secret-pass-1"}
    racing = a.call("POST", "/api/login", login).json()["token"]          # epoch 0, like a.token
    real = http.authenticate_token
    interleaved = []

    def authenticate_then_let_the_other_logout_win(token):
        result = real(token)
        if token == racing and not interleaved:
            interleaved.append(True)
            assert a.call("POST", "/api/logout").status_code == 204         # epoch 0 -> 1
            assert a.call("POST", "/api/login", login).status_code == 200   # writes epoch 1 keys
        return result

    monkeypatch.setattr(http, "authenticate_token", authenticate_then_let_the_other_logout_win)
    for resource in RESOURCES:
        assert cached(resource, uid, [cache1], epoch=0) == b""
    assert a.call("POST", "/api/logout", token=racing).status_code == 204   # epoch 1 -> 2
    assert interleaved
    assert UserState.objects.get(user_id=uid).epoch == 2
    for resource in RESOURCES:
        assert cached(resource, uid, [cache1], epoch=0) is None
        assert cached(resource, uid, [cache1], epoch=1) is None
        assert cached(resource, uid, [cache1], epoch=2) == b""


# -- answers_stored: the writer's last step, where long-polling's notify will go ---------------
@pytest.fixture
def stored_signals():
    from fastpoll.signals import answers_stored

    sent = []

    def receiver(sender, keys, deleted, **kwargs):
        sent.append((set(keys), set(deleted)))

    answers_stored.connect(receiver, dispatch_uid="test.stored_signals")
    yield sent
    answers_stored.disconnect(dispatch_uid="test.stored_signals")


def test_answers_stored_names_exactly_the_keys_stored(signup, cache3, hooks, stored_signals):
    a = signup("a")
    followers = [signup(f"f{i}") for i in range(8)]
    for f in followers:
        f.call("POST", "/api/follow", {"username": "a"})
    dead = cache3[0]
    keys = {key_of(r, f.user["id"]) for f in followers for r in RESOURCES}
    on_dead = {k for k in keys if get_cache().node_for(k) == dead.spec}
    assert on_dead and on_dead != keys
    hooks("write.after_read", lambda **context: dead.kill())     # its stores fail, the others' not
    stored_signals.clear()
    assert a.call("POST", "/api/plurks", {"content": "p"}).status_code == 201
    assert stored_signals and all(not deleted for _, deleted in stored_signals)
    stored = set().union(*(stored for stored, _ in stored_signals))
    thread = {k for k in stored if ":getThread:" in k}           # the plurk's, if not on the dead server
    assert stored - thread == keys - on_dead and len(thread) <= 1
    hooks("write.after_read", None)
    # a poll's miss-fill is a store too
    f = next(f for f in followers if key_of("getUnreadCount", f.user["id"]) not in on_dead)
    get_cache().client.delete(key_of("getUnreadCount", f.user["id"]))
    stored_signals.clear()
    f.get("/Poll/getUnreadCount", HTTP_AUTHORIZATION=f"Bearer {f.token}")
    assert stored_signals == [({key_of("getUnreadCount", f.user["id"])}, set())]


def test_answers_stored_names_the_keys_deleted(signup, cache1, stored_signals):
    b = signup("b")
    old = {key_of(r, b.user["id"]) for r in RESOURCES} | {f"p1:@:{b.user['id']}:0"}
    stored_signals.clear()
    assert b.call("POST", "/api/logout").status_code == 204
    new = {key_of(r, b.user["id"]) for r in RESOURCES}
    assert old.isdisjoint(new)
    assert stored_signals == [(set(), old), (new, set())]


def test_answers_stored_leaves_out_conflicted_stores(signup, cache1, hooks, stored_signals):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    done = []

    def second_writer(**context):
        if not done:
            done.append(True)
            a.call("POST", "/api/plurks", {"content": "second"})
    hooks("write.after_read", second_writer)
    stored_signals.clear()
    a.call("POST", "/api/plurks", {"content": "first"})
    b_keys = {key_of(r, b.user["id"]) for r in RESOURCES}
    # the second writer stores b's keys; the first one's stores then conflict (no signal) and
    # succeed on its next round
    users_keys = [(stored - {k for k in stored if ":getThread:" in k}, deleted) for stored, deleted in stored_signals]
    assert done and [s for s in users_keys if s != (set(), set())] == [(b_keys, set()), (b_keys, set())]


def test_chunks_are_pipelined_and_a_chunk_stored_meanwhile_conflicts_and_goes_round_again(
        signup, cache1, hooks, settings):
    """With BATCH_SIZE 8 the 11 users (author and followers) go in chunks of 2, 8 and 1, and
    chunk 2's gets go out before chunk 1 is computed.  A second writer that stores every
    follower's keys while chunk 1 is computed comes after those gets on the connection: the
    stores of chunks 1 and 2 then hold old uniques, conflict and go round again, never
    overwriting a newer answer; chunk 3's gets go out after it (no conflict)."""
    from django.test import override_settings

    a = signup("a")
    followers = [signup(f"f{i}") for i in range(10)]
    for f in followers:
        f.call("POST", "/api/follow", {"username": "a"})
    done = []

    def second_writer(**context):
        if not done:
            done.append(context["keys"])
            a.call("POST", "/api/plurks", {"content": "second"})
    with override_settings(FASTPOLL={**settings.FASTPOLL, "BATCH_SIZE": 8}):
        hooks("write.after_read", second_writer)
        conflicts = publish.stats["conflicts"]
        assert a.call("POST", "/api/plurks", {"content": "first"}).status_code == 201
        hooks("write.after_read", None)
    assert len(done[0]) == 2 * 2                       # the hook ran in the first chunk (a quarter)
    # chunk 1's keys and chunk 2's, whose gets were out before the second writer (unpipelined: 4)
    assert publish.stats["conflicts"] - conflicts == 2 * 2 + 2 * 8
    uids = [f.user["id"] for f in followers]
    assert_consistent(uids, [cache1], require=True)
    assert all(cached("getUnreadCount", uid, [cache1]) == b'{"count":2}' for uid in uids)


def test_a_fan_out_is_large_above_fanout_in_request_followers_and_never_with_a_revocation(settings):
    User = get_user_model()
    author, *followers = User.objects.bulk_create([User(username=f"l{i}", password="!") for i in range(4)])
    if not author.pk:
        author, *followers = User.objects.filter(username__startswith="l").order_by("id")
    Follow.objects.bulk_create([Follow(follower=f, followee=author) for f in followers])
    post = outbox.make(None, audiences={("followers", author.pk)})
    for limit, large in ((3, False), (2, True)):
        settings.FASTPOLL = dict(settings.FASTPOLL, FANOUT_IN_REQUEST=limit)
        assert publish.is_large([post]) is large, limit
    assert not publish.is_large([outbox.make(None, {author.pk})])
    assert not publish.is_large([post, outbox.make(None, {author.pk}, dead_keys={"p1:k:1:0"})])


def test_a_chunk_whose_resources_name_different_users_skips_only_those_gone(signup, cache1):
    # the keys of a chunk are built per resource from the epochs read for the whole chunk: a
    # user with no poll state (gone) is left out of the resource that names it, not of the
    # others, and a present user of the same count is still written
    a, b = signup("a"), signup("b")
    gone = b.user["id"] + 1000                               # no such user, no poll state
    raw = server_client(cache1.spec)
    raw.delete(key_of("getUnreadCount", a.user["id"]))
    raw.delete(key_of("getMessages", b.user["id"]))
    failed = publish.write_answers({"getUnreadCount": {a.user["id"], gone}, "getMessages": {b.user["id"]}})
    assert failed == set()
    assert raw.get(key_of("getUnreadCount", a.user["id"])) == b""
    assert raw.get(key_of("getMessages", b.user["id"])) == b""
    assert raw.get(keys.answer_key("getUnreadCount", gone, 0)) is None
