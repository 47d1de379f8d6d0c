"""Capabilities are refused at the call for what no poll could use (found adopting fastpoll: a
capability for an unknown or per-user resource, or for an anonymous user, was signed and
handed out, and failed only when the browser polled it)."""
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser

import fastpoll
from fastpoll import capability, tokens
from fastpoll.auth import signing_key

pytestmark = pytest.mark.django_db

THREAD = "getThread"              # plurkcore's per-object resource


@pytest.fixture
def user():
    return get_user_model().objects.create(username="capuser")


def test_a_capability_url_of_a_saved_user_for_a_per_object_resource(user):
    url = fastpoll.capability_url(user, THREAD, 42)
    path, cap = url.split("?cap=")
    assert path.endswith(f"/{THREAD}/42")
    assert tokens.verify_capability(signing_key(), cap, 0)[:3] == (THREAD, "42", str(user.pk))
    capability.check(cap, THREAD, 42, user)


@pytest.mark.parametrize("resource, says", [
    ("getThreads", "unknown 'getThreads'; per-object resources: getThread"),
    ("getUnreadCount", "'getUnreadCount' is a per-user resource: its poll needs no capability"),
])
def test_a_resource_that_takes_no_capability_is_refused(user, resource, says):
    for call in (fastpoll.capability_url, fastpoll.grant):
        with pytest.raises(ValueError, match=says):
            call(user, resource, 42)


@pytest.mark.parametrize("who, says", [
    (AnonymousUser(), "a capability needs a saved user, got AnonymousUser"),
    (None, "a capability needs a saved user, got NoneType"),
])
def test_no_capability_for_an_anonymous_user(who, says):
    for call in (fastpoll.capability_url, fastpoll.grant):
        with pytest.raises(ValueError, match=says):
            call(who, THREAD, 42)


def test_no_capability_for_an_unsaved_user():
    unsaved = get_user_model()(username="nobody")
    with pytest.raises(ValueError, match="a capability needs a saved user, got an unsaved"):
        fastpoll.capability_url(unsaved, THREAD, 42)


@pytest.mark.parametrize("form", [str, lambda pk: f"0{pk}", lambda pk: f"{pk}".zfill(6)], ids=["str", "0pk", "zfill"])
def test_a_capability_and_a_token_sign_the_databases_form_of_the_user(user, cache1, form):
    """A hostile review: the capability signed the user's text as given, the token the database's;
    a capability for "07" was refused to the token of user 7 (fastpath: 404 capability refused)."""
    who = form(user.pk)
    cap = fastpoll.grant(who, THREAD, 42)
    assert tokens.verify_capability(signing_key(), cap, 0)[2] == str(user.pk)
    assert tokens.verify(signing_key(), fastpoll.issue_token(who), 0)[0] == str(user.pk)
    capability.check(cap, THREAD, 42, user)
    assert fastpoll.capability_url(who, THREAD, 42).split("?cap=")[1].split(".")[3] == str(user.pk)


def test_a_key_no_user_can_have_is_refused_in_one_line():
    for call, name in [(lambda who: fastpoll.grant(who, THREAD, 42), "a capability"),
                       (fastpoll.issue_token, "issue_token"), (fastpoll.revoke, "revoke")]:
        with pytest.raises(ValueError, match=f"^{name} needs a user or its primary key, got 'alice': .* must be an "
                                             "integer"):
            call("alice")


def test_a_capability_for_a_request_user_or_an_instance_built_from_a_known_pk(user):
    from django.utils.functional import SimpleLazyObject

    for who in (SimpleLazyObject(lambda: user), get_user_model()(pk=user.pk)):
        cap = fastpoll.grant(who, THREAD, 42)
        capability.check(cap, THREAD, 42, user)
    with pytest.raises(ValueError, match="^a capability needs a saved user, got AnonymousUser$"):
        fastpoll.grant(SimpleLazyObject(AnonymousUser), THREAD, 42)
