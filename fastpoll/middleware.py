"""The poll cookie for users logged in with Django's sessions.

``fastpoll.middleware.PollTokenMiddleware`` (after ``AuthenticationMiddleware``) gives an
authenticated user who has no valid poll cookie a fresh one on the way out, so that a site
logging users in with ``django.contrib.auth`` needs no code of its own.  Logging out with
Django (``user_logged_out``) revokes the user's poll tokens (:func:`fastpoll.auth.revoke`) and
the middleware deletes the cookie.  Revocation is per user (one epoch): every session's and API
client's token goes, not only this browser's, so that a logout also ends a token copied out of
the cookie.  ``FASTPOLL["REVOKE_ON_LOGOUT"] = False`` keeps the others (the cookie is still
deleted; its token stays valid until it expires).
"""
import logging
import time

from django.contrib.auth.signals import user_logged_out

from . import auth, keys, tokens
from .cache import get_cache

logger = logging.getLogger("fastpoll.auth")


class PollTokenMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        user = getattr(request, "user", None)
        if getattr(request, "_fastpoll_logged_out", False):
            auth.delete_cookie(response)
        elif (user is not None and user.is_authenticated and 200 <= response.status_code < 400
              and response.status_code != 304 and not response.streaming):
            try:
                if not self._has_valid_cookie(request, user):
                    auth.issue_token(user, response, request)
            except Exception:
                # no cookie: the page's polls are answered by Django (401) until the next request
                logger.exception("cannot issue a poll token for user %s", user.pk)
        return response

    @staticmethod
    def _has_valid_cookie(request, user):
        """True if the request's poll cookie is a token of ``user`` at the user's current epoch.

        The common case costs no query: the signature, the expiry and the owner are checked
        here, and the epoch by the user's epoch marker in memcached, which is there while the
        epoch is current (:func:`fastpoll.auth.issue_token` puts it, a revocation deletes it after
        its commit: the same check fastpath makes).  Without the marker (evicted, expired,
        memcached away, or revoked) the database decides, and a current epoch gets its marker
        back, so the next requests are free again."""
        token = request.COOKIES.get(auth.conf.get_config()["COOKIE_NAME"])
        if not token or not getattr(user, "is_active", True):
            return False
        try:
            uid, epoch, _ = tokens.verify(auth.signing_key(), token, int(time.time()))
        except tokens.TokenError:
            return False
        if uid != str(user.pk):                        # another user's cookie
            return False
        if _marker_present(uid, epoch):
            return True
        try:
            owner, _ = auth.authenticate_token(token)
        except auth.AuthError:                         # revoked: a fresh cookie
            return False
        auth._put_marker(owner.pk, epoch)
        return True


def _marker_present(uid, epoch):
    key = keys.marker_key(uid, epoch)
    try:
        cache = get_cache()
        return key in cache.get_many(cache.node_for(key), [key])
    except Exception:          # CacheUnavailable, or anything else: the database decides
        return False


def _logged_out(sender, request, user, **kwargs):
    if user is None:
        return
    if auth.conf.get_config()["REVOKE_ON_LOGOUT"]:
        auth.revoke(user)
    if request is not None:
        request._fastpoll_logged_out = True


def install():
    user_logged_out.connect(_logged_out, dispatch_uid="fastpoll.logged_out")
