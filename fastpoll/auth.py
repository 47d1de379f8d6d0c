"""Poll tokens for users: issuing, reading, checking and revoking them.

The token's format is :mod:`fastpoll.tokens`'s (docs/contract.md, section 2); the epoch lives in
:class:`~fastpoll.models.UserState`.  Issuing a token also puts the user's epoch marker in
memcached (the key fastpath checks before it serves a per-object answer); revoking moves the
epoch on, which deletes the old epoch's keys and marker after the commit (:mod:`fastpoll.watch`).
"""
import functools
import logging
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import router, transaction
from django.utils.functional import LazyObject, empty

from . import conf, keys, tokens
from .models import UserState
from .publish import fill
from .secret import read_secret

logger = logging.getLogger("fastpoll.auth")


@functools.lru_cache(maxsize=1)
def signing_key():
    """The shared secret's key bytes, read once per configuration."""
    return read_secret(conf.get_config()["SECRET_FILE"])


conf.on_reset(signing_key.cache_clear)


class AuthError(Exception):
    """The request carries no valid poll token; the message says why (fastpath's words)."""


def user_id(user, caller):
    """The primary key of ``user``, an instance or its primary key (the value or its text), in the
    database's form (the user model's ``pk.to_python``: ``UUID('...')`` for ``pk.hex`` or an
    upper-case UUID, 7 for "07"), so that a token and a capability sign the same text, the one
    the poll compares with its user's ``str(pk)``.  ValueError naming ``caller`` for an anonymous
    or unsaved user (its token or capability would be nobody's) or a key no user can have.

    ``request.user`` (a lazy object) is the user it wraps; an instance with its pk set is that
    user's, loaded or not (``User(pk=known_id)``, as JWT-style authentication builds it), as
    Django's own code treats one."""
    if isinstance(user, LazyObject):
        if user._wrapped is empty:
            user._setup()
        user = user._wrapped
    if getattr(user, "is_anonymous", False) is True or user is None:
        raise ValueError(f"{caller} needs a saved user, got {type(user).__name__}")
    if hasattr(user, "_meta"):
        if user.pk is None:
            raise ValueError(f"{caller} needs a saved user, got an unsaved {type(user).__name__} (its pk is None)")
        field, value = user._meta.pk, user.pk
    else:
        field, value = get_user_model()._meta.pk, user
    try:
        return field.to_python(value)
    except ValidationError as exc:
        raise ValueError(f"{caller} needs a user or its primary key, got {value!r}: "
                         f"{' '.join(exc.messages)}") from None


def state_of(user):
    """The user's poll state, created at epoch 0 when the user has none (users who existed
    before fastpoll was installed)."""
    state, _ = UserState.objects.get_or_create(user_id=user_id(user, "a poll state"))
    return state


def sign(uid, epoch, now=None):
    """The token of ``uid`` at ``epoch``, valid for ``TOKEN_TTL`` seconds from ``now``."""
    now = int(time.time() if now is None else now)
    return tokens.sign(signing_key(), keys.id_text(uid), epoch, now + conf.get_config()["TOKEN_TTL"])


def issue_token(user, response=None, request=None):
    """A poll token for ``user`` (an instance or its primary key) at its current epoch.  With
    ``response``, also set as the poll cookie (``Secure`` when ``request`` is over HTTPS)."""
    state = state_of(user_id(user, "issue_token"))
    token = sign(state.user_id, state.epoch)
    _put_marker(state.user_id, state.epoch)
    if response is not None:
        set_cookie(response, token, request)
    return token


def _put_marker(uid, epoch):
    try:
        fill(keys.marker_key(uid, epoch), b"", uid, epoch)
    except Exception:
        # no marker: fastpath sends this user's object polls to Django, which puts it back
        logger.exception("cannot store the epoch marker of user %s", uid)


def revoke(user, response=None):
    """Revoke every poll token of ``user``: its epoch moves on, and the old epoch's cached
    answers are deleted after the commit.  With ``response``, the cookie is deleted too."""
    uid = user_id(user, "revoke")
    with transaction.atomic(using=router.db_for_write(UserState)):
        # lock the row: the keys to retire are those of the epoch this update replaces
        state, _ = UserState.objects.select_for_update().get_or_create(user_id=uid)
        state.epoch += 1
        state.save(update_fields=["epoch"])
    if response is not None:
        delete_cookie(response)


def set_cookie(response, token, request=None):
    # Secure as the session's cookie is (behind a TLS proxy without SECURE_PROXY_SSL_HEADER,
    # is_secure() is False while the site is served over HTTPS), on cookie_domain()
    secure = bool(request is not None and request.is_secure()) or settings.SESSION_COOKIE_SECURE
    response.set_cookie(conf.get_config()["COOKIE_NAME"], token, max_age=conf.get_config()["TOKEN_TTL"],
                        path="/", domain=cookie_domain(), secure=secure,
                        httponly=True, samesite="Lax")


def delete_cookie(response):
    response.delete_cookie(conf.get_config()["COOKIE_NAME"], path="/", domain=cookie_domain(), samesite="Lax")


def cookie_domain():
    """The poll cookie's Domain: FASTPOLL["COOKIE_DOMAIN"], else the session cookie's (None:
    host-only).  ".example.com" sends it to an edge on poll.example.com as well."""
    return conf.get_config()["COOKIE_DOMAIN"] or settings.SESSION_COOKIE_DOMAIN


def token_from_request(request):
    """(token, source) with source "header" or "cookie", else (None, None).

    ``Authorization: Bearer <token>`` (scheme case-insensitive, one space) wins over the cookie,
    even when the token is invalid; any other Authorization header is not ours and is ignored
    (docs/contract.md, section 2)."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if header[:7].lower() == "bearer ":
        return header[7:], "header"
    cookie = request.COOKIES.get(conf.get_config()["COOKIE_NAME"])
    if cookie:
        return cookie, "cookie"
    return None, None


def authenticate_token(token, now=None):
    """(user, epoch) for a valid token of an active user at its current epoch; else AuthError."""
    if token is None:
        raise AuthError("authentication required")
    try:
        uid, epoch, _ = tokens.verify(signing_key(), token, int(time.time() if now is None else now))
    except tokens.TokenError as exc:
        # the same words as fastpath's (docs/contract.md): the two 401 bodies are byte-identical
        raise AuthError(str(exc)) from None
    try:
        pk = get_user_model()._meta.pk.to_python(uid)
    except Exception:                # a signed id this user model cannot hold
        raise AuthError("unknown user") from None
    state = UserState.objects.select_related("user").filter(user_id=pk).first()
    if state is None or not getattr(state.user, "is_active", True):
        raise AuthError("unknown user")
    if state.epoch != epoch:
        raise AuthError("token revoked")
    return state.user, epoch


def authenticate(request):
    """(user, source) of the request's poll token (source "header" or "cookie"); AuthError
    when it has none that is valid."""
    token, source = token_from_request(request)
    user, _ = authenticate_token(token)
    return user, source
