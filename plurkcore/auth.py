"""Issuing and checking poll tokens (the format is tokens.py's; the epoch lives in UserState)."""
import functools
import time

from fastpoll import conf, tokens
from fastpoll.secret import read_secret


@functools.lru_cache(maxsize=1)
def signing_key():
    """The shared secret's key bytes, read once per configuration."""
    return read_secret(conf.get_config()["SECRET_FILE"])


conf.on_reset(signing_key.cache_clear)


def issue_token(user_id, epoch, now=None):
    now = int(time.time() if now is None else now)
    return tokens.sign(signing_key(), user_id, epoch, now + conf.get_config()["TOKEN_TTL"])


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


class AuthError(Exception):
    pass


def authenticate_token(token, now=None):
    """(user, epoch) for a valid token of an active user at its current epoch; else AuthError."""
    from .models import UserState

    if token is None:
        raise AuthError("authentication required")
    try:
        uid, epoch, _ = tokens.verify(signing_key(), token, int(time.time() if now is None else now))
    except tokens.TokenError as exc:
        # the same words as fastpath's (docs/contract.md): the two 401 bodies are byte-identical
        raise AuthError(str(exc)) from None
    state = (UserState.objects.select_related("user").filter(user_id=uid).first())
    if state is None or not state.user.is_active:
        raise AuthError("unknown user")
    if state.epoch != epoch:
        raise AuthError("token revoked")
    return state.user, epoch

