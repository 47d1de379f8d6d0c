"""The models: one id sequence for plurks and responses, follow constraints, proxy managers."""
import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from plurkcore.models import Follow, Plurk, Response, UserState

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
    assert (state.epoch, state.read_upto) == (0, 0)
    assert "epoch 0" in str(state)
