"""Audience ids keep their field's type through the outbox: a row gives back JSON (a UUID as text,
whatever text a caller passed), and the writer keys the members it reads by the field's values, so
an id of the wrong type reached nobody (or failed the whole write).  Both audiences are replayed
from outbox rows, as the repair pass finds them after a writer died."""
import datetime
import json
import uuid

import pytest
from django.db import models, transaction
from django.db.models.functions import Now

import fastpoll
from fastpoll import audiences, changes, outbox, publish, repair
from fastpoll.models import PendingChange
from plurkcore.answers import followers

from tests.fastpoll.conftest import subscriptions
from tests.plurkcore.helpers import cached, key_of, truth

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def no_grace(settings):
    settings.FASTPOLL = dict(settings.FASTPOLL, OUTBOX_GRACE=0.001)


@pytest.fixture
def topics():
    """An audience keyed by a UUID: the readers of a topic."""
    with subscriptions(models.UUIDField()) as made:
        yield made


def aged():
    """Every outbox row older than OUTBOX_GRACE by the database's clock (1 ms resolution)."""
    PendingChange.objects.update(created=Now() - datetime.timedelta(minutes=1))


def stale(uid):
    """Forget ``uid``'s unread count in the cache (what a change the writer did not write leaves)."""
    publish.delete_keys([key_of("getUnreadCount", uid)])


def replay_row(audience):
    """An outbox row naming ``audience`` as JSON holds it, replayed by the repair pass."""
    name, value = audience
    PendingChange.objects.create(change=json.dumps({
        "resources": ["getUnreadCount"], "users": [], "objects": [], "audiences": [[name, value]],
        "dead_keys": []}))
    aged()
    report = repair.repair()
    assert PendingChange.objects.count() == 0
    return report["replayed"]


def test_a_uuid_keyed_audience_is_replayed(cache1, signup, topics, no_grace, monkeypatch):
    Subscription, readers = topics
    reader, other = signup("reader"), signup("other")
    topic = uuid.uuid4()
    Subscription.objects.create(topic=topic, reader=reader.user["id"])
    Subscription.objects.create(topic=uuid.uuid4(), reader=other.user["id"])
    for uid in (reader.user["id"], other.user["id"]):
        stale(uid)
    with monkeypatch.context() as m, transaction.atomic():
        m.setattr(changes._Batch, "__call__", lambda self: None)      # its writer died after COMMIT
        fastpoll.touch("getUnreadCount", users=readers(topic))
    [row] = PendingChange.objects.values_list("change", flat=True)
    assert json.loads(row)["audiences"] == [["test_topic_readers", str(topic)]]     # text in JSON
    assert outbox.decode(row).audiences == {("test_topic_readers", topic)}        # a UUID again
    aged()
    assert repair.repair()["replayed"] == 1 and PendingChange.objects.count() == 0
    assert cached("getUnreadCount", reader.user["id"], [cache1]) == truth("getUnreadCount", reader.user["id"])
    assert cached("getUnreadCount", other.user["id"], [cache1]) is None        # not a reader of it


def test_a_uuid_keyed_audience_given_as_text(cache1, signup, topics, no_grace):
    Subscription, readers = topics
    reader = signup("reader")
    topic = uuid.uuid4()
    Subscription.objects.create(topic=topic, reader=reader.user["id"])
    stale(reader.user["id"])
    assert replay_row(("test_topic_readers", str(topic).replace("-", ""))) == 1    # hex, as SQLite keeps it
    assert cached("getUnreadCount", reader.user["id"], [cache1]) == truth("getUnreadCount", reader.user["id"])


def test_an_int_keyed_audience_given_as_text_is_replayed(cache1, signup, no_grace):
    author, follower = signup("author"), signup("follower")
    assert follower.call("POST", "/api/follow", {"username": "author"}).status_code == 201
    stale(follower.user["id"])
    assert replay_row(("followers", str(author.user["id"]))) == 1
    assert cached("getUnreadCount", follower.user["id"], [cache1]) == truth("getUnreadCount", follower.user["id"])


def test_an_audience_takes_its_ids_as_its_field_does():
    assert followers("42") == followers(42) == audiences.Members("followers", frozenset({42}))
    with pytest.raises(ValueError, match=r"audience 'followers' got 'x', which is not a value of plurkcore.Follow.followee"):
        followers("x")
