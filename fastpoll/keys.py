"""Cache keys (docs/contract.md, section 3).

- a user's answer: ``<prefix>:<resource>:<uid>:<epoch>``;
- an object's answer: ``<prefix>:<resource>:<object>:o``;
- a user's epoch marker (present while the epoch's tokens are valid; fastpath serves an object's
  answer only when the reader's marker is there): ``<prefix>:@:<uid>:<epoch>``.

``<prefix>`` is ``FASTPOLL["KEY_PREFIX"]`` (``p1``); ids are the text of ``str(pk)``: a number
or a UUID, 1-64 of A-Z a-z 0-9 ``-`` ``_``.
"""
import collections
import re

from . import conf

RESOURCE_RE = re.compile(r"\A[A-Za-z0-9_]{1,32}\Z")
ID_RE = re.compile(r"\A[A-Za-z0-9_-]{1,64}\Z")
PREFIX_RE = re.compile(r"\A[A-Za-z0-9_-]{1,16}\Z")
MARKER = "@"
OBJECT = "o"

#: a parsed key: ``kind`` is "user", "object" or "marker"; ``id`` the text of the user or object id;
#: ``epoch`` an int (None for an object's key)
Key = collections.namedtuple("Key", "kind resource id epoch")


def is_valid_resource(name):
    return isinstance(name, str) and RESOURCE_RE.match(name) is not None


def id_text(value):
    """The text of a user or object id in keys and tokens: ``str(value)``, checked."""
    if type(value) is int:
        if value < 0:
            raise ValueError(f"invalid id {value!r}: ids are 1-64 of A-Z a-z 0-9 - _")
        return str(value)
    text = str(value)
    if isinstance(value, bool) or ID_RE.match(text) is None:
        raise ValueError(f"invalid id {value!r}: ids are 1-64 of A-Z a-z 0-9 - _")
    return text


def is_many(value):
    """True for several ids or names (a list, set, queryset, generator...), False for one: text
    is one id or name, not its characters."""
    return not isinstance(value, (str, bytes)) and hasattr(value, "__iter__")


_prefix = None


def prefix():
    global _prefix
    if _prefix is None:
        _prefix = conf.get_config()["KEY_PREFIX"]
    return _prefix


def _forget_prefix():
    global _prefix
    _prefix = None


conf.on_reset(_forget_prefix)

#: resource names already checked (a fan-out builds tens of thousands of keys of two names)
_checked = set()


def _check(resource):
    if type(resource) is not str or resource not in _checked:
        if not is_valid_resource(resource):
            raise ValueError(f"invalid poll resource name {resource!r}")
        if len(_checked) < 1024:
            _checked.add(resource)


def answer_key(resource, uid, epoch):
    """The memcached key that holds ``resource``'s answer for ``uid`` at ``epoch``."""
    _check(resource)
    return f"{prefix()}:{resource}:{id_text(uid)}:{int(epoch)}"


def key_prefix(resource):
    """``<prefix>:<resource>:``, checked: a fan-out builds the keys of thousands of users from it,
    ``"%s%s:%d" % (prefix, uid, epoch)`` with ids the database gave (no check per key)."""
    _check(resource)
    return f"{prefix()}:{resource}:"


def object_key(resource, obj):
    """The memcached key that holds ``resource``'s answer for the object ``obj``."""
    _check(resource)
    return f"{prefix()}:{resource}:{id_text(obj)}:{OBJECT}"


def marker_key(uid, epoch):
    """The key whose presence says that ``uid``'s tokens of ``epoch`` are valid."""
    return f"{prefix()}:{MARKER}:{id_text(uid)}:{int(epoch)}"


def parse_key(key):
    """The inverse of the three makers: a :class:`Key`, or None for anything else."""
    parts = key.split(":")
    if len(parts) != 4 or parts[0] != prefix() or ID_RE.match(parts[2]) is None:
        return None
    resource, ident, last = parts[1], parts[2], parts[3]
    if last == OBJECT:
        return Key("object", resource, ident, None) if is_valid_resource(resource) else None
    if not last.isascii() or not last.isdigit() or (last != "0" and last[0] == "0"):
        return None
    kind = "marker" if resource == MARKER else "user"
    if kind == "user" and not is_valid_resource(resource):
        return None
    return Key(kind, None if kind == "marker" else resource, ident, int(last))


def user_keys(uid, epoch, resources):
    """Every key of ``uid`` at ``epoch``: one per resource name in ``resources``, and the marker."""
    return {answer_key(resource, uid, epoch) for resource in resources} | {marker_key(uid, epoch)}


def object_id(text):
    """An object id read from a key or a path, as compute() gets it: an int for a number's
    canonical text, else the text."""
    return int(text) if text.isascii() and text.isdigit() and str(int(text)) == text else text
