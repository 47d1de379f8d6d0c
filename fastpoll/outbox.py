"""The outbox's rows (:class:`~fastpoll.models.PendingChange`): one change as JSON, and deleting
the rows whose answers are written.

A change is a :class:`Change`: the resources it affects (None: every per-user resource), the users
whose answers they are, the objects (as ``(resource, object id)``), the audiences (``(audience
name, id)``: e.g. the followers of an author, expanded by the writer after the commit, so that a
row stays small however many followers there are) and the keys to delete.
"""
import collections
import json
import logging

from django.contrib.auth import get_user_model
from django.db import connections

from . import audiences
from .models import PendingChange

logger = logging.getLogger("fastpoll.changes")

Change = collections.namedtuple("Change", "resources users objects audiences dead_keys")


def make(resources=None, users=(), objects=(), audiences=(), dead_keys=()):
    return Change(None if resources is None else frozenset(resources), frozenset(users),
                  frozenset(objects), frozenset(audiences), frozenset(dead_keys))


def _plain(value):
    """A user or object id as JSON holds it: an int stays one, anything else (a UUID) is text."""
    return value if type(value) is int else str(value)


def encode(change):
    return json.dumps({
        "resources": None if change.resources is None else sorted(change.resources),
        "users": sorted((_plain(u) for u in change.users), key=str),
        "objects": sorted(([name, _plain(obj)] for name, obj in change.objects), key=str),
        "audiences": sorted(([name, _plain(i)] for name, i in change.audiences), key=str),
        "dead_keys": sorted(change.dead_keys),
    }, separators=(",", ":"))


def decode(text):
    """An outbox row's change.  User ids and audience ids come back as the values of their
    fields (JSON gives a UUID back as its text), as the change had them before :func:`encode`;
    an audience that is not registered (any more) keeps its ids as JSON had them."""
    data = json.loads(text)
    to_pk = get_user_model()._meta.pk.to_python          # a UUID comes back as its text
    return make(data["resources"], [u if type(u) is int else to_pk(u) for u in data["users"]], [tuple(o) for o in data["objects"]],
                [_audience_reference(name, i) for name, i in data["audiences"]], data["dead_keys"])


def _audience_reference(name, value):
    found = audiences.get(name)
    return (name, value if found is None else found.key(value))


def forget(alias, pks):
    """Delete outbox rows whose answers are written.  Failing only leaves them to be written
    again by the repair pass (the write is idempotent), so it never raises."""
    if not pks:
        return
    connection = connections[alias]
    table = connection.ops.quote_name(PendingChange._meta.db_table)
    column = connection.ops.quote_name(PendingChange._meta.pk.column)
    try:
        # one statement, its own transaction: QuerySet.delete() would add BEGIN and COMMIT
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {table} WHERE {column} IN ({', '.join(['%s'] * len(pks))})", list(pks))
    except Exception:
        logger.exception("cannot delete %d written outbox row(s); the repair pass will rewrite "
                         "their answers", len(pks))
