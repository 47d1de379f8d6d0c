"""Self-contained poll tokens: ``v1.<uid>.<epoch>.<expires>.<hex HMAC-SHA256>``.

The byte format is the contract with fastpath (docs/contract.md, section 2); fastpath checks the
same token in C without asking Django.  ``uid`` is text, Django's ``str(pk)`` (``42``, a UUID):
:func:`verify` returns it as a str and the caller maps it to a primary key.  Keep this module free
of Django imports so the test vectors can be produced and checked without a configured project.
"""
import hashlib
import hmac
import re

VERSION = b"v1"
MAX_INT = 2**63 - 1
MAX_UID_LENGTH = 64
#: "v1." + uid + 2 x 19 digits + 64 hex digits + 4 dots
MAX_TOKEN_LENGTH = 3 + MAX_UID_LENGTH + 1 + 19 + 1 + 19 + 1 + 64

UID_RE = re.compile(r"\A[A-Za-z0-9_-]{1,64}\Z")
_TOKEN_RE = re.compile(
    rb"\Av1\.([A-Za-z0-9_-]{1,64})\.(0|[1-9][0-9]{0,18})\.([1-9][0-9]{0,18})\.([0-9a-f]{64})\Z"
)


class TokenError(ValueError):
    """The token is malformed, forged or expired; the message says which."""


def _payload(uid, epoch, expires):
    return b"%s.%s.%d.%d" % (VERSION, uid, epoch, expires)


def _check_range(name, value, minimum):
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_INT:
        raise ValueError(f"{name} must be an integer in {minimum}..2**63-1, got {value!r}")


def uid_text(uid):
    """``uid`` (an int primary key, or its text) as the token's ASCII bytes, or ValueError."""
    if isinstance(uid, bool) or not isinstance(uid, (int, str)):
        raise ValueError(f"uid must be an int or a str, got {uid!r}")
    text = str(uid)
    if UID_RE.match(text) is None:
        raise ValueError(f"uid must be 1..64 of A-Z a-z 0-9 - _ (Django's str(pk)), got {text!r}")
    return text.encode("ascii")


def sign(key, uid, epoch, expires):
    """Return the token (str) for ``uid`` (int or str) at ``epoch``, valid while ``now < expires``."""
    uid = uid_text(uid)
    _check_range("epoch", epoch, 0)
    _check_range("expires", expires, 1)
    payload = _payload(uid, epoch, expires)
    sig = hmac.new(key, payload, hashlib.sha256).hexdigest().encode("ascii")
    return (payload + b"." + sig).decode("ascii")


def _ascii(token):
    if isinstance(token, str):
        try:
            return token.encode("ascii")
        except UnicodeEncodeError:
            raise TokenError("malformed token") from None
    return token


def verify(key, token, now):
    """Return ``(uid, epoch, expires)`` for a valid token, uid as text (str), else raise
    :class:`TokenError`."""
    token = _ascii(token)
    if len(token) > MAX_TOKEN_LENGTH:
        raise TokenError("malformed token")
    match = _TOKEN_RE.match(token)
    if match is None:
        raise TokenError("malformed token")
    uid = match.group(1)
    epoch, expires = int(match.group(2)), int(match.group(3))
    if max(epoch, expires) > MAX_INT:
        raise TokenError("malformed token")
    expected = hmac.new(key, _payload(uid, epoch, expires), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode("ascii"), match.group(4)):
        raise TokenError("bad signature")
    if not now < expires:
        raise TokenError("token expired")
    return uid.decode("ascii"), epoch, expires


# ---- capabilities: per-object polls (docs/contract.md, section 8) ----------------------------

CAP_VERSION = b"c1"
RESOURCE_RE = re.compile(r"\A[A-Za-z0-9_]{1,32}\Z")
#: "c1." + resource + object + uid + 19 digits + 64 hex digits + 5 dots
MAX_CAPABILITY_LENGTH = 3 + 32 + 1 + 64 + 1 + 64 + 1 + 19 + 1 + 64
_CAP_RE = re.compile(
    rb"\Ac1\.([A-Za-z0-9_]{1,32})\.([A-Za-z0-9_-]{1,64})\.([A-Za-z0-9_-]{1,64})\.([1-9][0-9]{0,18})"
    rb"\.([0-9a-f]{64})\Z"
)


def _cap_payload(resource, obj, uid, expires):
    return b"%s.%s.%s.%s.%d" % (CAP_VERSION, resource, obj, uid, expires)


def sign_capability(key, resource, obj, uid, expires):
    """The capability (str) that lets ``uid`` poll object ``obj`` of per-object ``resource``
    while ``now < expires``; obj and uid are ints or str (their str() as for a token uid)."""
    if not isinstance(resource, str) or RESOURCE_RE.match(resource) is None:
        raise ValueError(f"resource must be 1..32 of A-Z a-z 0-9 _, got {resource!r}")
    try:
        obj = uid_text(obj)
    except ValueError:
        raise ValueError(f"object must be 1..64 of A-Z a-z 0-9 - _ (its str(pk)), got {obj!r}") from None
    uid = uid_text(uid)
    _check_range("expires", expires, 1)
    payload = _cap_payload(resource.encode("ascii"), obj, uid, expires)
    return (payload + b"." + hmac.new(key, payload, hashlib.sha256).hexdigest().encode("ascii")).decode("ascii")


def verify_capability(key, cap, now):
    """Return ``(resource, obj, uid, expires)`` (three str and an int) for a valid capability,
    else raise :class:`TokenError`; the caller compares them with the request's."""
    cap = _ascii(cap)
    match = _CAP_RE.match(cap) if len(cap) <= MAX_CAPABILITY_LENGTH else None
    if match is None:
        raise TokenError("malformed capability")
    resource, obj, uid = match.group(1), match.group(2), match.group(3)
    expires = int(match.group(4))
    if expires > MAX_INT:
        raise TokenError("malformed capability")
    expected = hmac.new(key, _cap_payload(resource, obj, uid, expires), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode("ascii"), match.group(5)):
        raise TokenError("bad signature")
    if not now < expires:
        raise TokenError("capability expired")
    return resource.decode("ascii"), obj.decode("ascii"), uid.decode("ascii"), expires
