"""Cache keys of poll answers: ``p1:<resource>:<uid>:<epoch>`` (docs/contract.md, section 3)."""
import re

KEY_VERSION = "p1"
RESOURCE_RE = re.compile(r"\A[A-Za-z0-9_]{1,32}\Z")


def is_valid_resource(name):
    return isinstance(name, str) and RESOURCE_RE.match(name) is not None


def answer_key(resource, uid, epoch):
    """The memcached key that holds ``resource``'s answer for ``uid`` at ``epoch``."""
    if not is_valid_resource(resource):
        raise ValueError(f"invalid poll resource name {resource!r}")
    return f"{KEY_VERSION}:{resource}:{int(uid)}:{int(epoch)}"
