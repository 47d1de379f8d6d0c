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

from django.contrib.auth.signals import user_logged_out

from . import auth

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
              and response.status_code != 304 and not response.streaming
              and not self._has_valid_cookie(request, user)):
            try:
                auth.issue_token(user, response, request)
            except Exception:
                # no cookie: the page's polls are answered by Django (401) until the next request
                logger.exception("cannot issue a poll token for user %s", user.pk)
        return response

    @staticmethod
    def _has_valid_cookie(request, user):
        token = request.COOKIES.get(auth.conf.get_config()["COOKIE_NAME"])
        if not token:
            return False
        try:
            owner, _ = auth.authenticate_token(token)
        except auth.AuthError:
            return False
        return owner.pk == user.pk


def _logged_out(sender, request, user, **kwargs):
    if user is None:
        return
    if auth.conf.get_config()["REVOKE_ON_LOGOUT"]:
        auth.revoke(user)
    if request is not None:
        request._fastpoll_logged_out = True


def install():
    user_logged_out.connect(_logged_out, dispatch_uid="fastpoll.logged_out")
