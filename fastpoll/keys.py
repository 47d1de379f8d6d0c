"""Cache keys of poll answers: ``p1:<resource>:<uid>:<epoch>`` (docs/contract.md, section 3)."""
import re

KEY_VERSION = "p1"
RESOURCE_RE = re.compile(r"\A[A-Za-z0-9_]{1,32}\Z")


def is_valid_resource(name):
    return isinstance(name, str) and RESOURCE_RE.match(name) is not None


#: resource names already checked (a fan-out builds tens of thousands of keys of two names)
_checked = set()


def answer_key(resource, uid, epoch):
    """The memcached key that holds ``resource``'s answer for ``uid`` at ``epoch``."""
    if type(resource) is not str or resource not in _checked:
        if not is_valid_resource(resource):
            raise ValueError(f"invalid poll resource name {resource!r}")
        if type(resource) is str and len(_checked) < 1024:
            _checked.add(resource)
    return f"{KEY_VERSION}:{resource}:{int(uid)}:{int(epoch)}"


def key_prefix(resource):
    """``p1:<resource>:``, checked: a fan-out builds the keys of thousands of users from it,
    ``"%s%d:%d" % (prefix, uid, epoch)`` (``%d`` takes what :func:`answer_key`'s ``int()`` takes
    but a str, which it refuses)."""
    return answer_key(resource, 0, 0)[:-3]


def parse_key(key):
    """The inverse of :func:`answer_key`: ``(resource, uid, epoch)``, or None for anything else."""
    parts = key.split(":")
    if len(parts) != 4 or parts[0] != KEY_VERSION or not is_valid_resource(parts[1]):
        return None
    try:
        parsed = parts[1], int(parts[2]), int(parts[3])
    except ValueError:
        return None
    return parsed if answer_key(*parsed) == key else None     # "+1", " 1", "01": not ours


def user_keys(uid, epoch, resources):
    """Every key of ``uid`` at ``epoch``, one per resource name in ``resources``."""
    return {answer_key(resource, uid, epoch) for resource in resources}
