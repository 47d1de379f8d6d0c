"""The models: one id sequence for plurks and responses, follow constraints, proxy managers."""
import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from fastpoll.models import UserState
from plurkcore.models import ReadCursor, Follow, Plurk, Response

pytestmark = pytest.mark.django_db


@pytest.fixture
def users():
    User = get_user_model()
    return User.objects.create_user("a"), User.objects.create_user("b")


def test_plurks_and_responses_share_one_id_sequence(users):
    a, b = users
    p1 = Plurk.objects.create(author=a, content="p1")
    r = Response.objects.create(author=b, parent=p1, content="r")
    p2 = Plurk.objects.create(author=a, content="p2")
    assert p1.pk < r.pk < p2.pk
    assert list(Plurk.objects.values_list("pk", flat=True).order_by("pk")) == [p1.pk, p2.pk]
    assert list(Response.objects.values_list("pk", flat=True)) == [r.pk]
    assert Plurk.entries.count() == 3
    assert r.is_response and not p1.is_response and list(p1.responses.all()) == [r]
    p1.delete()
    assert not Plurk.entries.filter(pk=r.pk).exists()


def test_follow_is_unique_and_never_self(users):
    a, b = users
    Follow.objects.create(follower=a, followee=b)
    with pytest.raises(IntegrityError), transaction.atomic():
        Follow.objects.create(follower=a, followee=b)
    with pytest.raises(IntegrityError), transaction.atomic():
        Follow.objects.create(follower=a, followee=a)


def test_every_user_gets_a_state(users):
    a, _ = users
    state = UserState.objects.get(user=a)
    assert state.epoch == 0 and "epoch 0" in str(state)
    cursor = ReadCursor.objects.get(user=a)
    assert cursor.read_upto == 0 and "read up to 0" in str(cursor)


def test_a_response_knows_its_parents_author_however_it_is_made(users):
    """``parent_author`` is what the unread query reads responses by: save(), bulk_create() with a
    parent object or only its id, and a response moved to another plurk all keep it right."""
    a, b = users
    pa = Plurk.objects.create(author=a, content="pa")
    pb = Plurk.objects.create(author=b, content="pb")
    saved = Response.objects.create(author=b, parent_id=pa.pk, content="r1")
    by_object, by_id = Plurk.entries.bulk_create([Plurk(author=a, parent=pb, content="r2"),
                                                  Plurk(author=b, parent_id=pa.pk, content="r3")])
    rows = dict(Plurk.entries.values_list("content", "parent_author_id"))
    assert rows == {"pa": None, "pb": None, "r1": a.pk, "r2": b.pk, "r3": a.pk}
    saved.parent = pb
    saved.save()
    assert Plurk.entries.get(pk=saved.pk).parent_author_id == b.pk
    saved.parent = pa
    saved.save(update_fields=["parent"])
    assert Plurk.entries.get(pk=saved.pk).parent_author_id == a.pk


def test_the_migration_fills_the_parents_author_of_existing_responses(users):
    import importlib

    from django.apps import apps

    a, b = users
    p = Plurk.objects.create(author=a, content="p")
    r = Response.objects.create(author=b, parent=p, content="r")
    Plurk.entries.update(parent_author=None)           # as the rows were before the migration
    importlib.import_module("plurkcore.migrations.0004_parent_author").fill_parent_author(apps, None)
    assert Plurk.entries.get(pk=r.pk).parent_author_id == a.pk
    assert Plurk.entries.get(pk=p.pk).parent_author_id is None
