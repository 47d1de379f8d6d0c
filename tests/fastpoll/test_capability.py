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
