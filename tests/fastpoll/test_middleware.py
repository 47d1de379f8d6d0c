"""PollTokenMiddleware and logging out: a session user gets a poll cookie, a logout revokes.

The site here is plurksite's middleware with PollTokenMiddleware after AuthenticationMiddleware
(as docs/integrate.md says), and this module's two views: a page and a logout."""
import pytest
from django.contrib.auth import get_user_model, logout
from django.http import HttpResponse
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import path

from fastpoll import auth, conf, keys, publish
from tests.plurkcore.helpers import server_client

pytestmark = pytest.mark.django_db(transaction=True)

POLL = "fastpoll.middleware.PollTokenMiddleware"
AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"


def page(request):
    # reads request.user as any page of a site with logins does: the session's and the user's
    # queries are Django's, whatever the middleware does
    return HttpResponse("ok" if request.user.is_authenticated else "anonymous")


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


def page_queries(client):
    """(the response to GET /page, the SQL of its queries)."""
    with CaptureQueriesContext(connection) as queries:
        resp = client.get("/page")
    assert resp.status_code == 200 and resp.content == b"ok"
    return resp, [q["sql"] for q in queries.captured_queries]


def test_a_current_cookie_costs_no_query_beyond_djangos_auth(user, cache1, settings):
    client, cookie = logged_in(user)
    resp, with_cookie = page_queries(client)
    assert cookie_name() not in resp.cookies               # kept, not issued again
    assert not [sql for sql in with_cookie if "fastpoll_" in sql], with_cookie
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != POLL]
    _, without_middleware = page_queries(client)
    assert len(with_cookie) == len(without_middleware) > 0   # the session's and the user's


def test_a_revoked_cookie_is_replaced_on_the_next_page(user, cache1):
    client, cookie = logged_in(user)
    auth.revoke(user)                                      # e.g. a logout in another browser
    resp, _ = page_queries(client)
    fresh = resp.cookies[cookie_name()].value
    assert auth.authenticate_token(fresh) == (user, 1)
    with pytest.raises(auth.AuthError, match="token revoked"):
        auth.authenticate_token(cookie)
    _, queries = page_queries(client)                      # the new cookie is current: free again
    assert not [sql for sql in queries if "fastpoll_" in sql], queries


def test_without_its_marker_the_database_decides_and_puts_it_back(user, cache1):
    client, cookie = logged_in(user)
    marker = keys.marker_key(user.pk, 0)
    publish.delete_keys([marker])                          # evicted, or expired (CACHE_TTL)
    resp, queries = page_queries(client)
    assert cookie_name() not in resp.cookies               # still current: kept
    assert [sql for sql in queries if "fastpoll_userstate" in sql]
    assert server_client(cache1.spec).get(marker) == b""
    _, queries = page_queries(client)
    assert not [sql for sql in queries if "fastpoll_" in sql], queries


def test_with_memcached_away_the_database_still_decides(user):
    client, cookie = logged_in(user)                       # the default test cache refuses connections
    resp, _ = page_queries(client)
    assert cookie_name() not in resp.cookies
    auth.revoke(user)
    resp, _ = page_queries(client)
    assert auth.authenticate_token(resp.cookies[cookie_name()].value) == (user, 1)


def test_another_users_or_a_forged_cookie_is_replaced(user):
    client, _ = logged_in(user)
    bob = get_user_model().objects.create_user("bob", password="secret-pass-1")
    mine = auth.issue_token(user)
    forged = mine[:-1] + ("1" if mine.endswith("0") else "0")
    for token in (auth.issue_token(bob), forged, "v1.nonsense"):
        client.cookies[cookie_name()] = token
        resp, _ = page_queries(client)
        assert auth.authenticate_token(resp.cookies[cookie_name()].value) == (user, 0)


def test_a_page_is_served_when_the_cookie_cannot_be_checked(user, settings, caplog):
    client, _ = logged_in(user)
    settings.FASTPOLL = dict(settings.FASTPOLL, SECRET_FILE="/nonexistent/fastpoll.key")
    resp, _ = page_queries(client)                          # 200 "ok", no new cookie
    assert cookie_name() not in resp.cookies
    assert "cannot issue a poll token" in caplog.text
