"""Audiences: the users a change reaches through a relation table, such as an author's followers.

``audience(name, model, by=..., member=...)`` names the rows of ``model`` whose ``by`` column is
some id, and whose ``member`` column is a user that sees the change: ``followers(author_id)`` is
every ``member`` of the rows with ``by = author_id``.  A change names its audience, not its
members (the outbox row stays small, and the writer reads the members after the commit with
their epochs, in one query per ``BATCH_SIZE`` ids).
"""
import dataclasses

from django.core.exceptions import ValidationError
from django.db import connections, router

from . import conf, db
from .models import UserState

_registry = {}


@dataclasses.dataclass(frozen=True)
class Members:
    """The members of ``audience`` for the ids ``ids`` (what a watch function or touch() passes)."""
    audience: str
    ids: frozenset


@dataclasses.dataclass(frozen=True)
class Audience:
    name: str
    model: object
    by: str
    member: str

    def __call__(self, *ids):
        return Members(self.name, frozenset(self.key(i) for i in ids))

    @property
    def key_field(self):
        """The field whose values the ids are: ``by``'s (the target's, for a foreign key)."""
        field = self.model._meta.get_field(self.by)
        return getattr(field, "target_field", field)

    def key(self, value):
        """``value`` (an id, its text as JSON or a URL gives it, or an instance) as the Python
        value of :attr:`key_field`: the members the writer reads are keyed by it."""
        if hasattr(value, "_meta"):
            value = value.pk
        field = self.key_field
        if type(value) is int and field.get_internal_type() in db.INTEGER_FIELDS:
            return value
        try:
            return field.to_python(value)
        except (ValidationError, TypeError, ValueError):
            raise ValueError(f"audience {self.name!r} got {value!r}, which is not a value of "
                             f"{self.model._meta.label}.{self.by}") from None

    def keys_from_db(self, values):
        """``by`` values read by raw SQL as the ids a change names (a UUID SQLite keeps as text)."""
        field = self.key_field
        if field.get_internal_type() in db.INTEGER_FIELDS:
            return values
        return [field.to_python(v) for v in values]

    def columns(self):
        meta = self.model._meta
        return meta.db_table, meta.get_field(self.by).column, meta.get_field(self.member).column


def audience(name, model, *, by, member):
    """Register and return the audience ``name``; calling it with ids gives their members."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"an audience needs a name, got {name!r}")
    for field in (by, member):
        model._meta.get_field(field)          # FieldDoesNotExist names the model and the field
    found = _registry[name] = Audience(name, model, by, member)
    return found


def get(name):
    return _registry.get(name)


def expand(wanted):
    """``wanted`` {audience name: ids} -> ({(name, id): {member, ...}}, {member: epoch}) for the
    active members that have a poll state.

    The relation is read where the router reads its model (``db_for_read``), joined with the
    poll states in one query per ``BATCH_SIZE`` ids when they share that database; else the
    members' epochs are read on their own database (:func:`fastpoll.db.epochs`)."""
    members, epochs = {}, {}
    size = conf.get_config()["BATCH_SIZE"]
    state_db = db.state_db()
    for name, ids in wanted.items():
        found = _registry.get(name)
        if found is None:
            raise LookupError(f"unknown audience {name!r}: register it with fastpoll.audience()")
        using = router.db_for_read(found.model)
        ids = list(ids)
        for start in range(0, len(ids), size):
            chunk = ids[start:start + size]
            if using == state_db:
                rows = _members_with_epochs(found, chunk, using)
            else:
                pairs = _members(found, chunk, using)
                known = db.epochs({user for _, user in pairs})
                rows = [(key, user, known[user]) for key, user in pairs if user in known]
            if len(chunk) == 1 and rows:          # one author's followers: no test per row
                key = rows[0][0]
                found_members = [user for _, user, _ in rows]
                members.setdefault((name, key), set()).update(found_members)
                epochs.update(zip(found_members, [epoch for _, _, epoch in rows]))
                continue
            for key, user, epoch in rows:
                members.setdefault((name, key), set()).add(user)
                epochs[user] = epoch
    return members, epochs


def _members_with_epochs(found, ids, using):
    """[(id, member, epoch)] of the active members of ``ids`` with a poll state, in one query."""
    table, by, member = found.columns()
    where, params = db.id_filter(f"f.{by}", ids, field=found.key_field, using=using)
    active, active_params = db.active_clause("s")
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT f.{by}, f.{member}, s.epoch FROM {table} f "
                       f"JOIN {UserState._meta.db_table} s ON s.user_id = f.{member} WHERE {where}{active}",
                       params + active_params)
        rows = cursor.fetchall()
    if found.key_field.get_internal_type() in db.INTEGER_FIELDS and db.integer_user_ids():
        return rows                   # the values as they are: no conversion per row
    return list(zip(found.keys_from_db([r[0] for r in rows]), db.user_ids_from_db([r[1] for r in rows]),
                    (r[2] for r in rows)))


def _members(found, ids, using):
    """[(id, member)] of ``ids``, read from the relation alone (the poll states are elsewhere)."""
    table, by, member = found.columns()
    where, params = db.id_filter(f"f.{by}", ids, field=found.key_field, using=using)
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT f.{by}, f.{member} FROM {table} f WHERE {where}", params)
        rows = cursor.fetchall()
    return list(zip(found.keys_from_db([r[0] for r in rows]), db.user_ids_from_db([r[1] for r in rows])))


def exceeds(wanted, limit):
    """True if one of the audiences ``wanted`` {name: ids} has more than ``limit`` members (one
    count on the relation's index each, stopping at ``limit + 1``)."""
    for name, ids in wanted.items():
        found = _registry.get(name)
        if found is not None and found.model._default_manager.filter(
                **{f"{found.by}__in": list(ids)}).values("pk")[limit:limit + 1].exists():
            return True
    return False
