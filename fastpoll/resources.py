"""Poll resources: a name, a ``compute`` function and what it is computed for.

A resource is ``compute(ids) -> {id: bytes}``: for ``per="user"`` the ids are user primary keys,
for ``per="object"`` the ids of the objects (a thread, a room) whose answer many users read.  The
value is the 200 body, or ``b""`` for "nothing new" (204); ids that do not exist are left out.
``watch`` maps a model to a function of one instance that returns the ids whose answers a save
or delete of that instance changes (:mod:`fastpoll.watch` connects the signals).
"""
import dataclasses

from . import keys

PER = ("user", "object")


@dataclasses.dataclass(frozen=True)
class Resource:
    name: str
    compute: object
    per: str = "user"
    watch: tuple = ()              # ((model, ids_of_instance), ...)
    affected_by: frozenset = None  # change kinds of the old interface (None: every kind)

    def is_affected_by(self, kind):
        return kind == "epoch" or self.affected_by is None or kind in self.affected_by


_registry = {}


def add(resource):
    if not keys.is_valid_resource(resource.name):
        raise ValueError(f"invalid poll resource name {resource.name!r}: 1-32 of A-Z a-z 0-9 _")
    if resource.per not in PER:
        raise ValueError(f"per must be 'user' or 'object', got {resource.per!r}")
    _registry[resource.name] = resource
    return resource


def unregister(name):
    _registry.pop(name, None)


def get(name):
    return _registry.get(name)


def all_resources(per=None):
    return [r for r in _registry.values() if per is None or r.per == per]


def names(per=None):
    return [r.name for r in all_resources(per)]
