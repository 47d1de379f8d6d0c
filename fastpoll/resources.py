"""Poll resources: a name, a ``compute`` function and what it is computed for.

A resource is ``compute(ids) -> {id: bytes}``: for ``per="user"`` the ids are user primary keys,
for ``per="object"`` the ids of the objects (a thread, a room) whose answer many users read.  The
value is the 200 body, or ``b""`` for "nothing new" (204); ids that do not exist are left out.
``watch`` maps a model to a function of one instance that returns the ids whose answers a save
or delete of that instance changes (:mod:`fastpoll.watch` connects the signals).
"""
import contextlib
import dataclasses
import threading
from collections.abc import Mapping

from . import keys

PER = ("user", "object")


class ResourceError(TypeError):
    """A resource's ``compute`` gave something other than ``{id: bytes}``: a programming error,
    reported in one line naming the resource (the other resources' answers are still written)."""


@dataclasses.dataclass(frozen=True)
class Resource:
    name: str
    compute: object
    per: str = "user"
    watch: tuple = ()              # ((model, ids_of_instance), ...)

    def answers(self, ids):
        """``compute(ids)``, checked: a dict of bytes (a bytearray or memoryview is copied to
        bytes); anything else raises :class:`ResourceError`."""
        found = self.compute(ids)
        if not isinstance(found, dict):
            raise ResourceError(f"poll resource {self.name!r}: compute() returned {type(found).__name__}; "
                                f"return {{id: bytes}} (fastpoll.dumps(obj) makes JSON bytes)")
        for ident, body in found.items():
            if type(body) is bytes:
                continue
            if isinstance(body, (bytearray, memoryview)):
                found[ident] = bytes(body)
                continue
            raise ResourceError(f"poll resource {self.name!r}: compute() gave {type(body).__name__} for id "
                                f"{ident!r}; give bytes (fastpoll.dumps(obj) makes JSON bytes, b\"\" is "
                                f"nothing new)")
        if found and ids and found.keys().isdisjoint(ids):
            ident = next(iter(found))
            raise ResourceError(f"poll resource {self.name!r}: compute() answered none of the ids it was asked "
                                f"for (e.g. {ident!r} for {ids[0]!r}); key the result by the ids it receives")
        return found


_registry = {}
_listeners = []                    # (on_add, on_remove): fastpoll.watch, once the apps are ready


def on_change(on_add, on_remove):
    """Call ``on_add(resource)`` for each resource added and ``on_remove(name)`` for each one
    removed from now on."""
    _listeners.append((on_add, on_remove))


def add(resource):
    if not keys.is_valid_resource(resource.name):
        raise ValueError(f"invalid poll resource name {resource.name!r}: 1-32 of A-Z a-z 0-9 _")
    if resource.per not in PER:
        raise ValueError(f"per must be 'user' or 'object', got {resource.per!r}")
    known = _registry.get(resource.name)
    if known is not None and _origin(known.compute) != _origin(resource.compute):
        raise ValueError(f"poll resource {resource.name!r} is registered twice: by {_origin(known.compute)} "
                         f"and {_origin(resource.compute)}; give one of them another name")
    _registry[resource.name] = resource
    for on_add, _ in _listeners:
        on_add(resource)
    return resource


def _origin(function):
    """Where ``function`` is defined: the same function imported again (an autoreload, a module
    imported under two names) is the same resource; another function is a clash."""
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"


def unregister(name):
    _registry.pop(name, None)
    for _, on_remove in _listeners:
        on_remove(name)


def get(name):
    return _registry.get(name)


def all_resources(per=None):
    return [r for r in _registry.values() if per is None or r.per == per]


def names(per=None):
    return [r.name for r in all_resources(per)]


def resource(name, *, per="user", watch=None):
    """Decorator: register ``compute(ids) -> {id: bytes}`` as the poll resource ``name``.

    ``per``: "user" (one answer per user, ``<PATH_PREFIX><name>``) or "object" (one per object,
    read by every user holding a capability for it, ``<PATH_PREFIX><name>/<object id>``).
    ``watch``: {model: ids_of_instance}; after a save or delete of an instance commits, the answers
    of ``ids_of_instance(instance)`` are rewritten (user ids, or object ids for ``per="object"``;
    an audience's members, ``followers(author_id)``, count as user ids; None: nothing).
    """
    if not keys.is_valid_resource(name):
        raise ValueError(f"invalid poll resource name {name!r}: 1-32 of A-Z a-z 0-9 _")
    if per not in PER:
        raise ValueError(f"per must be 'user' or 'object', got {per!r}")
    if watch is not None and not isinstance(watch, Mapping):
        first = next(iter(watch), None) if keys.is_many(watch) else watch
        got = f"the class {watch.__name__}" if isinstance(watch, type) else f"a {type(watch).__name__}"
        raise _watch_error(name, first, got)
    watched = tuple((watch or {}).items())
    for model, function in watched:
        if not (isinstance(model, type) and hasattr(model, "_meta")):
            raise _watch_error(name, model, f"the key {model!r}, not a model class")
        if not callable(function):
            raise _watch_error(name, model, f"{{{model.__name__}: {function!r}}}, whose value is not callable")

    def decorator(compute):
        add(Resource(name, compute, per, watched))
        return compute

    return decorator


def _watch_error(name, model, got):
    """The one TypeError of a ``watch`` that is not {model class: function of an instance}, its
    example named after ``model`` (a class, or "app.Model" text) where it can be."""
    if isinstance(model, type) or hasattr(model, "_meta"):              # a class, or an instance of one
        model = (model if isinstance(model, type) else type(model)).__name__
    elif isinstance(model, str) and model.rpartition(".")[2].isidentifier():
        model = model.rpartition(".")[2]
    else:
        model = "Model"
    return TypeError(f"resource {name!r}: watch maps a model class to a function of an instance: "
                     f"{{{model}: lambda {model[0].lower()}: [...]}}, got {got}")


_round = threading.local()


@contextlib.contextmanager
def computing():
    """The writer computes the resources of the same ids right after one another inside this
    block: :func:`memo` is one dict for all of them, so that they can share what they read."""
    outer = getattr(_round, "memo", None)
    _round.memo = {} if outer is None else outer
    try:
        yield
    finally:
        _round.memo = outer


def memo():
    """The current write round's dict (see :func:`computing`), or None outside one."""
    return getattr(_round, "memo", None)
