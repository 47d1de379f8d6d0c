"""A resource's compute() is the project's code: what it gets wrong is reported in one line naming
the resource, and costs that resource's keys only (found adopting fastpoll: a compute returning
str failed the whole write, every resource's answers with it, and the repair pass forever)."""
import logging

import pytest
from django.db import transaction

import fastpoll
from fastpoll import keys, resources
from fastpoll.models import StaleKey

from tests.plurkcore.helpers import cached, server_client, truth

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broken():
    """A per-user resource whose compute the test sets (``broken.compute = ...``)."""
    class Broken:
        compute = staticmethod(lambda ids: {})

    @fastpoll.resource("testBroken")
    def compute(ids):
        return Broken.compute(ids)

    try:
        yield Broken
    finally:
        resources.unregister("testBroken")


@pytest.mark.parametrize("wrong, says", [
    (lambda ids: {i: "text" for i in ids}, "compute() gave str for id"),
    (lambda ids: [b"x" for _ in ids], "compute() returned list"),
    (lambda ids: {str(i): b"x" for i in ids}, "answered none of the ids it was asked for"),
])
def test_a_wrong_answer_costs_its_own_keys_and_says_which_resource(signup, cache1, broken, wrong, says, caplog):
    a = signup("a")
    uid = a.user["id"]
    broken.compute = wrong
    caplog.set_level(logging.ERROR, logger="fastpoll.publish")
    with transaction.atomic():
        fastpoll.touch(None, users=[uid])
    assert cached("getUnreadCount", uid, [cache1]) == truth("getUnreadCount", uid)   # the others are written
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "'testBroken'" in errors[0].getMessage() and says in errors[0].getMessage()
    assert errors[0].exc_info is None                                                 # one line, no traceback
    epoch = 0
    assert StaleKey.objects.filter(key=keys.answer_key("testBroken", uid, epoch)).exists()


def test_the_poll_view_answers_500_with_one_line_for_a_wrong_answer(signup, cache1, broken, client, caplog):
    a = signup("a")
    broken.compute = lambda ids: {i: {"count": 1} for i in ids}
    resp = client.get("/Poll/testBroken", HTTP_AUTHORIZATION=f"Bearer {a.token}")
    assert resp.status_code == 500 and resp.json() == {"error": "internal error"}
    assert any("'testBroken'" in r.getMessage() and r.exc_info is None for r in caplog.records)


def test_a_bytearray_or_memoryview_is_taken_as_bytes(signup, cache1, broken):
    a = signup("a")
    uid = a.user["id"]
    broken.compute = lambda ids: {i: bytearray(b'{"n":1}') for i in ids}
    with transaction.atomic():
        fastpoll.touch("testBroken", users=[uid])
    assert server_client(cache1.spec).get(keys.answer_key("testBroken", uid, 0)) == b'{"n":1}'


def test_a_name_registered_by_two_functions_is_refused():
    @fastpoll.resource("testTwice")
    def first(ids):
        return {}

    try:
        with pytest.raises(ValueError, match="'testTwice' is registered twice"):
            @fastpoll.resource("testTwice")
            def second(ids):
                return {}
        fastpoll.resource("testTwice")(first)               # the same function again: no clash
        assert resources.get("testTwice").compute is first
    finally:
        resources.unregister("testTwice")


def test_touch_naming_no_one_is_an_error():
    with pytest.raises(TypeError, match="whose answers changed"):
        fastpoll.touch("getUnreadCount")
    fastpoll.touch("getUnreadCount", users=[])             # an empty set is nothing to do


def test_a_new_password_revokes_the_poll_tokens(signup, cache1):
    """As Django's session auth hash ends the user's other sessions (found adopting fastpoll: the
    old token kept answering for TOKEN_TTL after a password change)."""
    from django.contrib.auth import get_user_model

    from fastpoll import auth

    a = signup("a")
    user = get_user_model().objects.get(pk=a.user["id"])
    auth.authenticate_token(a.token)
    user.last_name = "renamed"
    user.save()
    auth.authenticate_token(a.token)                        # any other save keeps the token
    user.set_password("another-pass-2")
    user.save()
    with pytest.raises(auth.AuthError, match="token revoked"):
        auth.authenticate_token(a.token)
    assert server_client(cache1.spec).get(keys.marker_key(user.pk, 0)) is None


@pytest.mark.parametrize("watch", [[StaleKey], StaleKey, (StaleKey, lambda key: [])])
def test_watch_that_is_not_a_dict_says_what_it_maps(watch):
    with pytest.raises(TypeError, match=r"^resource 'testWatch': watch maps a model class to a function of an "
                                        r"instance: \{StaleKey: lambda s: \[\.\.\.\]\}"):
        fastpoll.resource("testWatch", watch=watch)
    assert resources.get("testWatch") is None


@pytest.mark.parametrize("watch, got", [
    ({"fastpoll.StaleKey": lambda key: []}, "the key 'fastpoll.StaleKey', not a model class"),
    ({StaleKey: "ids_of"}, "{StaleKey: 'ids_of'}, whose value is not callable"),
    ({StaleKey(pk=1): lambda key: []}, f"the key {StaleKey(pk=1)!r}, not a model class"),
])
def test_a_dict_watch_of_the_wrong_things_is_the_same_type_error(watch, got):
    """A hostile review: watch={"app.Model": fn} raised ValueError while watch=[...] raised
    TypeError; both are a wrong type, with the same guidance."""
    with pytest.raises(TypeError) as info:
        fastpoll.resource("testWatch", watch=watch)
    assert str(info.value) == ("resource 'testWatch': watch maps a model class to a function of an instance: "
                               "{StaleKey: lambda s: [...]}, got " + got)
    assert resources.get("testWatch") is None
