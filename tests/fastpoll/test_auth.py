"""Poll tokens are for saved users: an anonymous or unsaved user is refused at the call, in one
line (found adopting fastpoll: ``issue_token(AnonymousUser())`` failed deep inside the ORM)."""
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.utils.functional import SimpleLazyObject

import fastpoll
from fastpoll import auth
from fastpoll.models import UserState

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("call", [fastpoll.issue_token, fastpoll.revoke])
def test_an_anonymous_user_is_refused(call):
    name = call.__name__
    with pytest.raises(ValueError, match=f"^{name} needs a saved user, got AnonymousUser$"):
        call(AnonymousUser())
    with pytest.raises(ValueError, match=f"^{name} needs a saved user, got NoneType$"):
        call(None)
    assert not UserState.objects.exists()


@pytest.mark.parametrize("call", [fastpoll.issue_token, fastpoll.revoke])
def test_an_unsaved_user_is_refused(call):
    unsaved = get_user_model()(username="nobody")
    with pytest.raises(ValueError, match=f"{call.__name__} needs a saved user, got an unsaved"):
        call(unsaved)
    assert not UserState.objects.exists()


def test_a_saved_user_or_its_id_gets_a_token_and_is_revoked(cache1):
    user = get_user_model().objects.create(username="someone")
    assert auth.authenticate_token(fastpoll.issue_token(user))[0] == user
    token = fastpoll.issue_token(user.pk)
    fastpoll.revoke(user.pk)
    with pytest.raises(auth.AuthError, match="token revoked"):
        auth.authenticate_token(token)


@pytest.mark.parametrize("call", [fastpoll.issue_token, fastpoll.revoke])
def test_an_anonymous_request_user_is_named_as_what_it_wraps(call):
    """request.user is a SimpleLazyObject: the message names the AnonymousUser it holds."""
    with pytest.raises(ValueError, match=f"^{call.__name__} needs a saved user, got AnonymousUser$"):
        call(SimpleLazyObject(AnonymousUser))
    assert not UserState.objects.exists()


def test_a_request_user_and_an_instance_built_from_a_known_pk_get_tokens(cache1):
    """``User(pk=known)`` (not loaded: ``_state.adding``) is that user, as request.user is."""
    user = get_user_model().objects.create(username="someone")
    built = get_user_model()(pk=user.pk)
    assert built._state.adding
    for who in (SimpleLazyObject(lambda: user), built):
        assert auth.authenticate_token(fastpoll.issue_token(who))[0] == user
    token = fastpoll.issue_token(user)
    fastpoll.revoke(built)
    with pytest.raises(auth.AuthError, match="token revoked"):
        auth.authenticate_token(token)
