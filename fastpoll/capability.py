"""Capabilities: Django's permission for one user to read one object's answer.

A per-object resource (a thread, a room) has one cached answer that many users read.  fastpath
serves it to a request whose poll token is valid and which carries a capability for that object:
``c1.<resource>.<object>.<uid>.<expires>.<HMAC-SHA256>`` under the shared secret
(docs/contract.md).  Django hands one out where it decides the user may read the object
(:func:`grant`); this module also checks them for the poll view.
"""
import time

from . import conf, keys, resources, tokens
from .auth import signing_key, user_id


class CapabilityError(Exception):
    """The capability is missing, malformed, forged, expired, or for something else."""


def grant(user, resource, obj, now=None):
    """A capability for ``user`` to poll ``resource``'s answer of the object ``obj`` (an instance
    or its id), valid for ``CAPABILITY_TTL`` seconds."""
    now = int(time.time() if now is None else now)
    _check_resource(resource)
    uid = user_id(user, "a capability")
    ident = obj.pk if hasattr(obj, "_meta") else obj
    return tokens.sign_capability(signing_key(), resource, keys.id_text(ident), keys.id_text(uid),
                                  now + conf.get_config()["CAPABILITY_TTL"])


def url(user, resource, obj, now=None):
    """The poll URL of ``resource``'s answer of ``obj`` for ``user``, capability included."""
    ident = obj.pk if hasattr(obj, "_meta") else obj
    cap = grant(user, resource, ident, now)
    return f"{conf.get_config()['PATH_PREFIX']}{resource}/{keys.id_text(ident)}?cap={cap}"


def _check_resource(name):
    """ValueError unless ``name`` is a registered per-object resource: a capability for anything
    else signs a URL that no poll answers."""
    found = resources.get(name)
    if found is not None and found.per == "object":
        return
    known = ", ".join(sorted(resources.names(per="object"))) or "none"
    if found is None:
        raise ValueError(f"a capability needs a registered per-object resource, got unknown {name!r}; "
                         f"per-object resources: {known}")
    raise ValueError(f"{name!r} is a per-user resource: its poll needs no capability (poll "
                     f"{conf.get_config()['PATH_PREFIX']}{name}); per-object resources: {known}")


def check(cap, resource, obj, user, now=None):
    """Nothing if ``cap`` lets ``user`` read ``resource``'s answer of ``obj``; else CapabilityError."""
    if not cap:
        raise CapabilityError("capability required")
    try:
        got = tokens.verify_capability(signing_key(), cap, int(time.time() if now is None else now))
    except tokens.TokenError as exc:
        raise CapabilityError(f"capability refused: {str(exc).replace('token ', '')}") from None
    cap_resource, cap_obj, cap_uid = got[0], got[1], got[2]
    if (cap_resource, cap_obj) != (resource, str(obj)):
        raise CapabilityError("capability is for another object")
    if cap_uid != keys.id_text(user.pk):
        raise CapabilityError("capability is for another user")

