"""fastpoll.touch: every resource it names is touched, or the call fails at once (found adopting
fastpoll: ``touch(["mytasks", "board"], users=[alice])`` dropped the per-object ``board`` without
a word, and ``touch(["inbox", "board"], objects=[1])`` dropped ``inbox``)."""
import pytest
from django.db import transaction

import fastpoll
from fastpoll import outbox
from fastpoll.models import PendingChange

THREAD = "getThread"             # plurkcore's per-object resource
PER_USER = "getUnreadCount"


@pytest.mark.parametrize("names, kwargs, missing", [
    ([PER_USER, THREAD], {"users": [1]}, "'getThread' is a per-object resource: it needs objects="),
    ([THREAD, PER_USER], {"objects": [1]}, "'getUnreadCount' is a per-user resource: it needs users="),
    (THREAD, {"users": [1]}, "'getThread' is a per-object resource: it needs objects="),
    (PER_USER, {"objects": [1]}, "'getUnreadCount' is a per-user resource: it needs users="),
])
def test_a_named_resource_without_its_kinds_argument_is_an_error(names, kwargs, missing):
    with pytest.raises(ValueError, match=missing):
        fastpoll.touch(names, **kwargs)


@pytest.mark.django_db(transaction=True)
def test_a_mixed_list_touches_each_name_through_its_own_argument():
    with transaction.atomic():
        fastpoll.touch([PER_USER, THREAD], users=[7], objects=[42])
        change = outbox.decode(PendingChange.objects.get().change)
        transaction.set_rollback(True)
    assert change.resources == {PER_USER}
    assert change.users == {7}
    assert change.objects == {(THREAD, 42)}


@pytest.mark.django_db(transaction=True)
def test_none_still_means_every_per_user_resource_and_empty_sets_are_nothing_to_do():
    with transaction.atomic():
        fastpoll.touch(None, users=[7])
        fastpoll.touch([PER_USER, THREAD], users=[], objects=[])       # both named, both empty
        changes = [outbox.decode(c) for c in PendingChange.objects.values_list("change", flat=True)]
        transaction.set_rollback(True)
    assert [(c.resources, c.users) for c in changes] == [(None, {7})]
    with pytest.raises(ValueError, match="objects= needs the name of a per-object resource"):
        fastpoll.touch(None, users=[7], objects=[1])
