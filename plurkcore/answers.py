"""Poll resources: database -> the exact response body of each user's answer.

A resource is a function ``compute(user_ids) -> {user_id: bytes}`` registered under a name (the
``/Poll/<name>`` path and the cache key's resource part).  The value is the 200 body, or ``b""`` for
"nothing new" (204).  Users that do not exist are left out of the result.  The two built-ins are
registered exactly as an integrating app registers its own::

    from plurkcore.answers import register

    @register("getMentions", affected_by={"plurk", "response"})
    def mentions(user_ids):
        ...

``affected_by`` names the change kinds (:data:`CHANGE_KINDS`) after which the publisher rewrites
the resource's answers; ``None`` (the default) means every kind.
"""
import contextlib
import dataclasses
import datetime
import json
import threading

from django.contrib.auth import get_user_model
from django.db import connection

from . import keys
from .models import Follow, Plurk, UserState

#: What the publisher reports: a plurk, a response, a follow/unfollow, a moved read cursor, a user
#: created or deleted.  A changed epoch (logout) always rewrites every resource.
CHANGE_KINDS = frozenset({"plurk", "response", "follow", "read", "user"})

MESSAGES_LIMIT = 50
_ROWS_AT_ONCE = 5000     # rows fetched per call when reading many (Django's per-row iterator costs ~1 us a row)


def dumps(obj):
    """The one JSON encoding of the contract (docs/contract.md, section 5)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def isoformat(value):
    """ISO 8601 in UTC with millisecond precision and a ``Z``: ``2026-01-02T03:04:05.678Z``."""
    return value.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + \
        f"{value.microsecond // 1000:03d}Z"


@dataclasses.dataclass(frozen=True)
class PollResource:
    name: str
    compute: object
    affected_by: frozenset = None

    def is_affected_by(self, kind):
        return kind == "epoch" or self.affected_by is None or kind in self.affected_by


_registry = {}


def register(name, affected_by=None):
    """Decorator: register ``compute(user_ids) -> {user_id: bytes}`` as poll resource ``name``."""
    if not keys.is_valid_resource(name):
        raise ValueError(f"invalid poll resource name {name!r}: 1-32 of A-Z a-z 0-9 _")
    if affected_by is not None:
        affected_by = frozenset(affected_by)
        unknown = affected_by - CHANGE_KINDS
        if unknown:
            raise ValueError(f"unknown change kinds {sorted(unknown)}; known: {sorted(CHANGE_KINDS)}")

    def decorator(compute):
        _registry[name] = PollResource(name, compute, affected_by)
        return compute

    return decorator


def unregister(name):
    _registry.pop(name, None)


def get_resource(name):
    return _registry.get(name)


def resources():
    return list(_registry.values())


def resource_names():
    return list(_registry)


# -- the built-ins ---------------------------------------------------------------------------
def id_filter(column, ids):
    """(sql, params) for "``column`` is one of ``ids``" with a single parameter: an array on
    PostgreSQL, a JSON list on SQLite (thousands of placeholders cost more to bind than the
    query takes to run).  Other backends get one placeholder per id."""
    ids = [int(i) for i in ids]
    if connection.vendor == "postgresql":
        # an array literal as text: psycopg adapts a list of ints in Python, ~1.3 ms per 1000 ids
        return f"{column} = ANY(%s::bigint[])", ["{" + ",".join(map(str, ids)) + "}"]
    if connection.vendor == "sqlite":
        return f"{column} IN (SELECT value FROM json_each(%s))", [json.dumps(ids)]
    return f"{column} IN ({', '.join(['%s'] * len(ids))})", ids


def _unread_sql(user_ids):
    """(sql, params) of the CTE ``unread`` of rows (uid, eid): every unread item of the users.

    Unread items of U: plurks by users U follows, and responses by anyone but U to plurks authored
    by U or by users U follows; all with an id above U's read cursor.

    The cost must follow the users' follows and plurks, never the size of the table.  Each branch
    is therefore written to be read from the users outwards (CROSS JOIN keeps SQLite's join order
    as written; PostgreSQL plans CROSS JOIN like any inner join), and on SQLite ``+p.parent_id``
    keeps it off the parent index for "is a plurk": otherwise it walked every plurk in the table
    above the cursor (13 s for 1,000 users who never read, at 50,000 plurks).  PostgreSQL gets the
    plain column: the ``+`` hides it from its statistics and made it 2.5x slower there.

    On PostgreSQL each step of a branch is a LATERAL subquery that cannot be flattened (``OFFSET
    0``): each user's follows, then each followee's entries above the cursor, by index.  Planned
    freely, the plurks' branch hashed every follower of every author with a plurk for each batch
    of users (20,000 rows per batch of 1,000 when an author with 10,000 followers posts: a fan-out
    quadratic in the followers), and on tables not yet analyzed the responses' branch hashed
    every response in the followees' threads (1,000,000 rows, 0.5 s, for 1,000 followers of an
    author with 1,000 answered plurks).

    Responses are found by their parent's author (``parent_author``, index ``(parent_author,
    id)``), a range scan above the cursor: read through the parent plurks, each branch walked every
    plurk the users and their followees ever wrote."""
    state = UserState._meta.db_table
    follow = Follow._meta.db_table
    entry = Plurk._meta.db_table
    where, params = id_filter("user_id", user_ids)
    active, active_params = active_clause(state)
    plus = "+" if connection.vendor == "sqlite" else ""
    if connection.vendor == "postgresql":
        def rows(source, table, alias, where):
            # a LATERAL subquery that cannot be flattened (OFFSET 0): read per row of source, by index
            return f"{source} CROSS JOIN LATERAL (SELECT {alias}.* FROM {table} {alias} WHERE {where} OFFSET 0) {alias}"
        follows = rows("s", follow, "f", "f.follower_id = s.user_id")
        # each followee's new plurks and new responses in its threads, one walk of the follows
        followed = f"""{follows} CROSS JOIN LATERAL (
                         SELECT e.id FROM {entry} e WHERE e.author_id = f.followee_id AND e.id > s.read_upto
                            AND e.parent_id IS NULL
                         UNION ALL
                         SELECT r.id FROM {entry} r WHERE r.parent_author_id = f.followee_id
                            AND r.id > s.read_upto AND r.author_id <> s.user_id) e"""
        own_threads = rows("s", entry, "r", "r.parent_author_id = s.user_id AND r.id > s.read_upto"
                                            " AND r.author_id <> s.user_id")
        branches = [f"SELECT s.user_id AS uid, e.id AS eid FROM {followed}",
                    f"SELECT s.user_id, r.id FROM {own_threads}"]
    else:
        branches = [f"""SELECT s.user_id AS uid, e.id AS eid
              FROM s CROSS JOIN {follow} f CROSS JOIN {entry} e
             WHERE f.follower_id = s.user_id AND e.author_id = f.followee_id
               AND e.id > s.read_upto AND {plus}e.parent_id IS NULL""",
                    f"""SELECT s.user_id, r.id
              FROM s CROSS JOIN {entry} r
             WHERE r.parent_author_id = s.user_id AND r.id > s.read_upto AND r.author_id <> s.user_id""",
                    f"""SELECT s.user_id, r.id
              FROM s CROSS JOIN {follow} f CROSS JOIN {entry} r
             WHERE f.follower_id = s.user_id AND r.parent_author_id = f.followee_id
               AND r.id > s.read_upto AND r.author_id <> s.user_id"""]
    union = "\n            UNION ALL\n            ".join(branches)
    return f"""
        WITH s AS (SELECT user_id, read_upto FROM {state} WHERE {where}{active}),
        unread AS (
            {union}
        )""", params + active_params


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
    """{uid: epoch} of the (active) users that exist, in one plain query per 1000 ids (the ORM's ``__in``
    costs milliseconds per thousand ids, which matters at fan-out sizes)."""
    user_ids = list(user_ids)
    result = {}
    table = UserState._meta.db_table
    active, active_params = active_clause(table)
    with connection.cursor() as cursor:
        for start in range(0, len(user_ids), 5000):
            where, params = id_filter("user_id", user_ids[start:start + 5000])
            cursor.execute(f"SELECT user_id, epoch FROM {table} WHERE {where}{active}", params + active_params)
            result.update(cursor.fetchall())
    return result


def unread_counts(user_ids):
    """{uid: number of unread items} for the users that exist (0 included)."""
    user_ids = list(user_ids)
    if not user_ids:
        return {}
    memo = getattr(_shared, "memo", None)
    if memo is not None:
        return {uid: count for uid, (count, _) in unread_messages(user_ids).items()}
    sql, params = _unread_sql(user_ids)
    # every user of s gets a row (0 included): which users exist is part of the same read
    with connection.cursor() as cursor:
        cursor.execute(sql + " SELECT s.user_id, COUNT(unread.uid) FROM s LEFT JOIN unread"
                             " ON unread.uid = s.user_id GROUP BY s.user_id", params)
        return dict(cursor.fetchall())


def unread_messages(user_ids, limit=MESSAGES_LIMIT):
    """{uid: (count, [item, ...] newest first, at most ``limit``)} for the users that exist."""
    user_ids = list(user_ids)
    if not user_ids:
        return {}
    memo = getattr(_shared, "memo", None)
    memo_key = (frozenset(user_ids), limit)
    if memo is not None and memo_key in memo:
        return memo[memo_key]
    counts, newest = _newest_unread(user_ids, limit)
    entries = {}
    wanted = set().union(*newest.values())
    if wanted:
        for row in Plurk.entries.filter(id__in=wanted).values_list(
                "id", "parent_id", "author__username", "content", "created"):
            eid, parent_id, author, content, created = row
            entries[eid] = {
                "id": eid,
                "plurk_id": parent_id or eid,
                "kind": "response" if parent_id else "plurk",
                "author": author,
                "content": content,
                "created": isoformat(created),
            }
    result = {}
    for uid, count in counts.items():
        items = [entries[eid] for eid in newest[uid] if eid in entries]
        result[uid] = (count if items else 0, items)
    if memo is not None:
        memo[memo_key] = result
    return result


def _newest_unread(user_ids, limit):
    """({uid: number of unread items}, {uid: ids of the newest ``limit`` of them, newest first})
    for the users that exist (0 and [] included)."""
    sql, params = _unread_sql(user_ids)
    counts, newest = {}, {}
    if connection.vendor == "sqlite":
        # Every unread row, the newest kept here: SQLite's window functions cost more than the
        # rest of the query (4.8 against 2.3 ms per 1,000 followers of a fan-out).  A user's
        # list is cut back to its newest ``limit`` whenever it doubles: memory stays bounded
        # however many rows come, at O(1) a row.
        with connection.cursor() as cursor:
            cursor.execute(sql + " SELECT uid, eid FROM unread UNION ALL SELECT user_id, NULL FROM s", params)
            while rows := cursor.fetchmany(_ROWS_AT_ONCE):
                for uid, eid in rows:
                    ids = newest.get(uid)
                    if ids is None:
                        ids = newest[uid] = []
                        counts[uid] = 0
                    if eid is not None:          # (uid, NULL): one per user of s, who exists
                        counts[uid] += 1
                        ids.append(eid)
                        if len(ids) > 2 * limit:
                            ids.sort(reverse=True)
                            del ids[limit:]
        for ids in newest.values():
            ids.sort(reverse=True)
            del ids[limit:]
        return counts, newest
    sql += """
        SELECT uid, eid, cnt FROM (
            SELECT uid, eid, ROW_NUMBER() OVER (PARTITION BY uid ORDER BY eid DESC) AS rn,
                   COUNT(*) OVER (PARTITION BY uid) AS cnt
              FROM unread) w
         WHERE rn <= %s
        UNION ALL
        SELECT user_id, NULL, 0 FROM s"""
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, limit])
        rows = cursor.fetchall()
    # the rows (uid, NULL, 0) say which users exist (one per user of s)
    for uid, eid, cnt in rows:
        if eid is None:
            counts.setdefault(uid, 0)
            newest.setdefault(uid, [])
        else:
            counts[uid] = cnt
            newest.setdefault(uid, []).append(eid)
    for ids in newest.values():
        ids.sort(reverse=True)
    return counts, {uid: newest[uid] for uid in counts}


_shared = threading.local()


@contextlib.contextmanager
def shared_reads():
    """Within this block the built-ins read the unread items of a set of users once for both
    resources (the publisher computes every resource of the same users right after another)."""
    outer = getattr(_shared, "memo", None)
    _shared.memo = {} if outer is None else outer
    try:
        yield
    finally:
        _shared.memo = outer


@register("getUnreadCount")
def get_unread_count(user_ids):
    bodies = {0: b""}
    result = {}
    for uid, n in unread_counts(user_ids).items():
        if n not in bodies:
            bodies[n] = dumps({"count": n})
        result[uid] = bodies[n]
    return result


@register("getMessages")
def get_messages(user_ids):
    # Followers of the same people often have the very same unread items: encode each once.
    bodies = {}
    result = {}
    for uid, (n, items) in unread_messages(user_ids).items():
        signature = (n, tuple(item["id"] for item in items))
        if signature not in bodies:
            bodies[signature] = dumps({"count": n, "items": items}) if n else b""
        result[uid] = bodies[signature]
    return result
