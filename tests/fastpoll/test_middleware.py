"""PollTokenMiddleware and logging out: a session user gets a poll cookie, a logout revokes.

The site here is plurksite's middleware with PollTokenMiddleware after AuthenticationMiddleware
(as docs/integrate.md says), and this module's two views: a page and a logout."""
import pytest
from django.contrib.auth import get_user_model, logout
from django.http import HttpResponse
from django.test import Client
from django.urls import path

from fastpoll import auth, conf

pytestmark = pytest.mark.django_db(transaction=True)

POLL = "fastpoll.middleware.PollTokenMiddleware"
AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"


def page(request):
    return HttpResponse("ok")


def bye(request):
    logout(request)
    return HttpResponse("bye")


urlpatterns = [path("page", page), path("bye", bye)]


@pytest.fixture
def site(settings):
    middleware = list(settings.MIDDLEWARE)
    middleware.insert(middleware.index(AUTH) + 1, POLL)
    settings.MIDDLEWARE = middleware
    settings.ROOT_URLCONF = __name__


@pytest.fixture
def user(site):
    return get_user_model().objects.create_user("alice", password="secret-pass-1")


def cookie_name():
    return conf.get_config()["COOKIE_NAME"]


def logged_in(user):
    client = Client()
    client.force_login(user)
    resp = client.get("/page")
    assert resp.status_code == 200 and resp.cookies[cookie_name()].value
    return client, resp.cookies[cookie_name()].value


def test_a_session_user_gets_a_poll_cookie_for_its_epoch(user):
    _, token = logged_in(user)
    assert auth.authenticate_token(token) == (user, 0)


def test_logging_out_revokes_every_token_of_the_user(user):
    here, cookie = logged_in(user)
    elsewhere, other_cookie = logged_in(user)           # another browser
    api_token = auth.issue_token(user)                  # an API client
    resp = here.get("/bye")
    assert resp.cookies[cookie_name()].value == "" and resp.cookies[cookie_name()]["max-age"] == 0
    for token in (cookie, other_cookie, api_token):
        with pytest.raises(auth.AuthError, match="token revoked"):
            auth.authenticate_token(token)
    # the other browser is still logged in: its next page brings a cookie of the new epoch
    assert auth.authenticate_token(elsewhere.get("/page").cookies[cookie_name()].value) == (user, 1)


def test_without_revoke_on_logout_only_the_cookie_goes(user, settings):
    settings.FASTPOLL = dict(settings.FASTPOLL, REVOKE_ON_LOGOUT=False)
    here, cookie = logged_in(user)
    api_token = auth.issue_token(user)
    resp = here.get("/bye")
    assert resp.cookies[cookie_name()].value == "" and resp.cookies[cookie_name()]["max-age"] == 0
    assert auth.authenticate_token(api_token) == (user, 0)
    assert auth.authenticate_token(cookie) == (user, 0)  # valid until it expires: the documented cost
