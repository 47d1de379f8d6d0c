"""SQL helpers for compute functions and for fastpoll's writer: ids as one parameter, "the user
is active", and the users' epochs, each one plain query (the ORM's ``__in`` and its per-row
objects cost milliseconds per thousand ids, which matters at fan-out sizes)."""
import json

from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, connections, router

from .models import UserState

__all__ = ["id_filter", "active_clause", "epochs", "user_ids_from_db", "state_db"]


def state_db():
    """The database of the users' poll states (:class:`~fastpoll.models.UserState`): the router's
    ``db_for_write``, for reads too.  An epoch is read to decide which keys to write and which to
    retire, so it must be the committed one: a replica that lags behind a revocation would have
    the revoked epoch's answers written again."""
    return router.db_for_write(UserState)


def id_filter(column, ids, field=None, using=None):
    """(sql, params) for "``column`` is one of the user ids ``ids``" with a single parameter: an
    array on PostgreSQL, a JSON list on SQLite (thousands of placeholders cost more to bind than
    the query takes to run).  Other backends get one placeholder per id.  Ids of any primary key
    type (integers, UUIDs) are sent as the database stores them: the values of ``field`` (the
    user model's primary key when None).  ``using``: the alias of the database the query runs
    on (the default database when None)."""
    connection = connections[using or DEFAULT_DB_ALIAS]
    ids = list(ids)
    integers = {*map(type, ids)} <= {int}                 # no bool, no str (one pass in C)
    if not integers:
        ids = [_db_value(i, field, connection) for i in ids]
    if connection.vendor == "postgresql":
        if integers:
            # an array literal as text: psycopg adapts a list of ints in Python, ~1.3 ms per 1000 ids
            return f"{column} = ANY(%s::bigint[])", ["{" + ",".join(map(str, ids)) + "}"]
        return f"{column} = ANY(%s)", [ids]
    if connection.vendor == "sqlite":
        return f"{column} IN (SELECT value FROM json_each(%s))", [json.dumps(ids)]
    return f"{column} IN ({', '.join(['%s'] * len(ids))})", ids


def _db_value(value, field, connection):
    field = get_user_model()._meta.pk if field is None else field
    return field.get_db_prep_value(field.to_python(value), connection)


def user_ids_from_db(values):
    """The user ids read by raw SQL as Python values of the primary key (a UUID that SQLite
    keeps as hex text becomes a UUID); integers are returned as they are."""
    if integer_user_ids():
        return values
    field = get_user_model()._meta.pk
    return [field.to_python(v) for v in values]


def integer_user_ids():
    """True if the user model's primary key is an integer: ids read by raw SQL are then the
    Python values as they are."""
    return get_user_model()._meta.pk.get_internal_type() in INTEGER_FIELDS


INTEGER_FIELDS = frozenset({"AutoField", "BigAutoField", "SmallAutoField", "IntegerField",
                             "BigIntegerField", "SmallIntegerField", "PositiveIntegerField",
                             "PositiveBigIntegerField", "PositiveSmallIntegerField"})


def active_clause(table):
    """(sql, params) of " AND the user of ``table``.user_id is active" when the user model has a
    concrete ``is_active`` (Django's auth refuses inactive users: their answers are not cached),
    else ("", [])."""
    User = get_user_model()
    if not any(f.name == "is_active" and f.concrete for f in User._meta.get_fields()):
        return "", []
    users = User._meta.db_table
    column = User._meta.get_field("is_active").column
    pk = User._meta.pk.column
    # a correlated scalar subquery: one primary-key lookup per row on both backends.  SQLite
    # turns "user_id IN (SELECT ...)" into a scan of the whole user table on every call (16 ms
    # at 35,000 users); PostgreSQL turns EXISTS into a hash join that reads every user (2-3 ms
    # per 1,000 ids at 10,000 users, three times per fan-out chunk); neither flattens this form.
    return f" AND (SELECT u.{column} FROM {users} u WHERE u.{pk} = {table}.user_id) = %s", [True]


def epochs(user_ids):
    """{uid: epoch} of the (active) users that exist, in one plain query per 5000 ids (the ORM's ``__in``
    costs milliseconds per thousand ids, which matters at fan-out sizes), on :func:`state_db`."""
    user_ids = list(user_ids)
    result = {}
    table = UserState._meta.db_table
    active, active_params = active_clause(table)
    using = state_db()
    integers = integer_user_ids()
    with connections[using].cursor() as cursor:
        for start in range(0, len(user_ids), 5000):
            where, params = id_filter("user_id", user_ids[start:start + 5000], using=using)
            cursor.execute(f"SELECT user_id, epoch FROM {table} WHERE {where}{active}", params + active_params)
            rows = cursor.fetchall()
            if integers:
                result.update(rows)               # (uid, epoch) pairs as they are
            else:
                result.update(zip(user_ids_from_db([uid for uid, _ in rows]), (epoch for _, epoch in rows)))
    return result
