"""Several databases (docs/integrate.md, "Several databases"): a change is written after the
commit of the database that made it (the signal's ``using``); fastpoll's tables are where the
router writes them (``db_for_write``); an audience's relation is read where the router reads its
model.  The second database is "other" (tests/fastpoll/conftest.py), SQLite in memory."""
import datetime

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connections, models, transaction
from django.db.models.functions import Now

import fastpoll
from fastpoll import audiences, auth, db, keys, repair, resources
from fastpoll.models import PendingChange, UserState

from tests.fastpoll.conftest import OTHER, subscriptions
from tests.plurkcore.helpers import server_client

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", OTHER])

ANSWER = b'{"groups":1}'


@pytest.fixture
def watched_groups():
    """A per-user resource watching auth's Group: any group saved changes the answers of the
    users in ``user_ids`` (a list the test fills)."""
    user_ids = []

    @fastpoll.resource("test_groups", watch={Group: lambda group: list(user_ids)})
    def compute(ids):
        return {uid: ANSWER for uid in ids}

    yield user_ids
    resources.unregister("test_groups")


@pytest.fixture
def in_atomic_on_other_when_written(hooks):
    """[whether "other" was inside a transaction] for each write of answers."""
    seen = []
    hooks("write.after_gets", lambda **context: seen.append(connections[OTHER].in_atomic_block))
    return seen


def cached_answer(cache, uid, epoch=0):
    client = server_client(cache.spec)
    try:
        return client.get(keys.answer_key("test_groups", uid, epoch))
    finally:
        client.close()


def aged():
    PendingChange.objects.update(created=Now() - datetime.timedelta(minutes=1))


def test_a_change_on_another_database_is_written_after_that_databases_commit(
        cache1, watched_groups, in_atomic_on_other_when_written):
    user = get_user_model().objects.create_user("alice")
    watched_groups.append(user.pk)
    in_atomic_on_other_when_written.clear()                   # alice's own answers
    with transaction.atomic(using=OTHER):
        Group.objects.using(OTHER).create(name="readers")
        assert in_atomic_on_other_when_written == []         # not before the commit it waits for
        assert PendingChange.objects.using("default").count() == 1     # the router's database
        assert PendingChange.objects.using(OTHER).count() == 0
    assert in_atomic_on_other_when_written == [False]
    assert cached_answer(cache1, user.pk) == ANSWER
    assert PendingChange.objects.count() == 0


def test_a_rollback_on_another_database_leaves_a_row_replayed_once(
        cache1, watched_groups, in_atomic_on_other_when_written):
    user = get_user_model().objects.create_user("alice")
    watched_groups.append(user.pk)
    in_atomic_on_other_when_written.clear()
    with pytest.raises(RuntimeError):
        with transaction.atomic(using=OTHER):
            Group.objects.using(OTHER).create(name="readers")
            raise RuntimeError
    assert in_atomic_on_other_when_written == []              # the batch went with the rollback
    assert PendingChange.objects.count() == 1                 # committed on its own database
    aged()
    assert repair.repair()["replayed"] == 1                   # a harmless rewrite, once
    assert cached_answer(cache1, user.pk) == ANSWER
    assert PendingChange.objects.count() == 0


class UsersAndFastpollOnOther:
    """A router that keeps the users, fastpoll's tables and the Plurk store (whose rows point at
    the users) on "other"."""

    apps = {"auth", "fastpoll", "plurkcore"}

    def db_for_read(self, model, **hints):
        return OTHER if model._meta.app_label in self.apps else None

    db_for_write = db_for_read


def test_fastpolls_tables_follow_the_router(cache1, settings, watched_groups):
    settings.DATABASE_ROUTERS = [f"{__name__}.UsersAndFastpollOnOther"]
    user = get_user_model().objects.create_user("alice")     # on "other", its poll state too
    assert UserState.objects.using(OTHER).filter(user_id=user.pk).exists()
    assert not UserState.objects.using("default").filter(user_id=user.pk).exists()
    assert db.epochs([user.pk]) == {user.pk: 0}
    assert cached_answer(cache1, user.pk) == ANSWER           # its creation's answers, written
    assert PendingChange.objects.using(OTHER).count() == 0    # and forgotten where written
    watched_groups.append(user.pk)
    with transaction.atomic(using=OTHER):
        UserState.objects.filter(user_id=user.pk).update(epoch=5)
        fastpoll.touch("test_groups", users=[user.pk], using=OTHER)
    assert cached_answer(cache1, user.pk, epoch=5) == ANSWER
    fastpoll.revoke(user)                                     # the epoch moves on, on "other"
    assert UserState.objects.using(OTHER).get(user_id=user.pk).epoch == 6
    assert cached_answer(cache1, user.pk, epoch=5) is None    # the revoked epoch's key is gone
    assert cached_answer(cache1, user.pk, epoch=6) == ANSWER


@pytest.fixture
def topics():
    """An audience whose relation lives on "other" only (the users and their poll states on the
    default database), read there through the router."""
    with subscriptions(models.BigIntegerField(), OTHER) as made:
        yield made


class SubscriptionsOnOther:
    def db_for_read(self, model, **hints):
        return OTHER if model._meta.db_table == "fastpoll_test_subscription" else None

    db_for_write = db_for_read


def test_an_audiences_relation_is_read_where_the_router_reads_it(settings, topics):
    settings.DATABASE_ROUTERS = [f"{__name__}.SubscriptionsOnOther"]
    Subscription, readers = topics
    alice, bob, carol = (get_user_model().objects.create_user(name) for name in ("alice", "bob", "carol"))
    UserState.objects.filter(user_id=bob.pk).update(epoch=3)
    carol.is_active = False
    carol.save()
    for reader in (alice, bob, carol):
        Subscription.objects.create(topic=7, reader=reader.pk)
    Subscription.objects.create(topic=8, reader=alice.pk)
    members, epochs = audiences.expand({"test_topic_readers": {7}})
    assert members == {("test_topic_readers", 7): {alice.pk, bob.pk}}     # carol is inactive
    assert epochs == {alice.pk: 0, bob.pk: 3}


class FastpollReadsFromReplica:
    """A primary ("default") and a replica ("other") that lags: the router reads fastpoll's
    tables from the replica."""

    def db_for_read(self, model, **hints):
        return OTHER if model._meta.app_label == "fastpoll" else None

    def db_for_write(self, model, **hints):
        return None


def test_poll_states_are_read_where_written_not_from_a_replica(settings):
    settings.DATABASE_ROUTERS = [f"{__name__}.FastpollReadsFromReplica"]
    user = get_user_model().objects.create_user("alice")
    fastpoll.revoke(user)
    fastpoll.revoke(user)                                     # epoch 2 on the primary
    # the replica has not caught up: it still says epoch 0 (rows put there without signals)
    get_user_model().objects.using(OTHER).bulk_create([get_user_model()(pk=user.pk, username="alice")])
    UserState.objects.using(OTHER).bulk_create([UserState(user_id=user.pk, epoch=0)])
    assert db.epochs([user.pk]) == {user.pk: 2}
    assert auth.authenticate_token(auth.sign(user.pk, 2)) == (user, 2)
    with pytest.raises(auth.AuthError, match="token revoked"):
        auth.authenticate_token(auth.sign(user.pk, 0))
