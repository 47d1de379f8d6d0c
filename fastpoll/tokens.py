"""Self-contained poll tokens: ``v1.<uid>.<epoch>.<expires>.<hex HMAC-SHA256>``.

The byte format is the contract with fastpath (docs/contract.md, section 2); fastpath checks the
same token in C without asking Django.  Keep this module free of Django imports so the test vectors
can be produced and checked without a configured project.
"""
import hashlib
import hmac
import re

VERSION = b"v1"
MAX_INT = 2**63 - 1
MAX_TOKEN_LENGTH = 128

_TOKEN_RE = re.compile(
    rb"\Av1\.([1-9][0-9]{0,18})\.(0|[1-9][0-9]{0,18})\.([1-9][0-9]{0,18})\.([0-9a-f]{64})\Z"
)


class TokenError(ValueError):
    """The token is malformed, forged or expired; the message says which."""


def _payload(uid, epoch, expires):
    return b"%s.%d.%d.%d" % (VERSION, uid, epoch, expires)


def _check_range(name, value, minimum):
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_INT:
        raise ValueError(f"{name} must be an integer in {minimum}..2**63-1, got {value!r}")


def sign(key, uid, epoch, expires):
    """Return the token (str) for ``uid`` at ``epoch``, valid while ``now < expires``."""
    _check_range("uid", uid, 1)
    _check_range("epoch", epoch, 0)
    _check_range("expires", expires, 1)
    payload = _payload(uid, epoch, expires)
    sig = hmac.new(key, payload, hashlib.sha256).hexdigest().encode("ascii")
    return (payload + b"." + sig).decode("ascii")


def verify(key, token, now):
    """Return ``(uid, epoch, expires)`` for a valid token, else raise :class:`TokenError`."""
    if isinstance(token, str):
        try:
            token = token.encode("ascii")
        except UnicodeEncodeError:
            raise TokenError("malformed token") from None
    if len(token) > MAX_TOKEN_LENGTH:
        raise TokenError("malformed token")
    match = _TOKEN_RE.match(token)
    if match is None:
        raise TokenError("malformed token")
    uid, epoch, expires = (int(group) for group in match.groups()[:3])
    if max(uid, epoch, expires) > MAX_INT:
        raise TokenError("malformed token")
    expected = hmac.new(key, _payload(uid, epoch, expires), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode("ascii"), match.group(4)):
        raise TokenError("bad signature")
    if not now < expires:
        raise TokenError("token expired")
    return uid, epoch, expires
