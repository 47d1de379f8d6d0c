"""Collecting changes: what a transaction changed, handed to the writer once it commits.

:func:`touch` is the public way in (``fastpoll.touch``): the resources' watched models report
through it (:mod:`fastpoll.watch`), and so does code that changes tables without signals
(``QuerySet.update()``, ``bulk_create()``, raw SQL).

A transaction's changes live in one :class:`_Batch`, which is itself the transaction's
``on_commit`` callback: Django runs it once after the commit (one batch, one publish, however many
rows changed) and forgets it on rollback, so a rolled-back transaction's changes are dropped with
it instead of being written at this thread's next commit.  Changes queued inside a savepoint that
is rolled back while its transaction goes on stay in the batch: Django does not say which
savepoint a callback's work belonged to once the commit runs it.  That costs a rewrite (or a miss,
for a deleted key), never a wrong answer: the writer reads the database after the commit.

Each change is also written to the outbox (:class:`~fastpoll.models.PendingChange`) *in the
transaction that made it*, and the batch deletes those rows once the writer is done.  A process
killed between its commit and its stores leaves its rows behind, and the repair pass writes their
answers (:func:`fastpoll.repair.repair`): a commit's answers are written even when the process
that committed is not there to write them.  Outside a transaction the change is already
committed when :func:`changed` is called; the row then only narrows that window.

A batch that would rewrite the answers of more than ``FANOUT_IN_REQUEST`` followers is written by
the process's background writer (:mod:`fastpoll.background`), its outbox rows kept until then.
A write that takes longer than half of ``OUTBOX_GRACE`` renews its rows (:class:`_Lease`), so the
repair pass does not write a change again while its own writer is still at it.
"""
import logging
import threading
import time

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import router, transaction
from django.db.models.functions import Now

from . import audiences, background, conf, db, keys, outbox, publish, repair, resources
from .models import PendingChange

logger = logging.getLogger("fastpoll.changes")

_current = threading.local()       # .batches: {database alias: the open transaction's _Batch}


class _Batch:
    """The changes of one transaction on one database (:class:`fastpoll.outbox.Change`); ``alias``
    is the database of its outbox rows (:func:`outbox_db`), the transaction's when the router
    puts fastpoll's tables there."""

    def __init__(self, alias):
        self.alias = alias
        self.items = []
        self.pending = []          # ids of this batch's outbox rows

    def add(self, item):
        self.items.append(item)
        row = PendingChange.objects.using(self.alias).create(change=outbox.encode(item))
        self.pending.append(row.pk)

    def __call__(self):
        try:
            large = publish.is_large(self.items)
        except Exception:
            # never raise into the request that committed; written here, flush() reports any error
            logger.exception("cannot size a change's fan-out; writing it in the request")
            large = False
        if large:
            background.submit(self.write)          # the request answers now; the rows stay meanwhile
        else:
            self.write()

    def write(self):
        try:
            repair.repair(quick=True)
        except Exception:
            # old debts stay recorded for the next pass or the repair service; this change's
            # answers are written regardless (as when another thread's pass is running)
            logger.exception("the quick repair pass failed; writing this change's answers anyway")
        lease = _Lease(self.alias, self.pending)
        if publish.flush(self.items, alive=lease.renew):
            outbox.forget(self.alias, self.pending)

    def is_pending(self, connection):
        # Django drops a rolled-back transaction's callbacks from this list (and the list is
        # emptied before a commit runs them): if we are not in it, our transaction is over.
        return any(func is self for _, func, _ in connection.run_on_commit)


class _Lease:
    """A long write keeps its outbox rows young: the repair pass takes a row older than
    ``OUTBOX_GRACE`` for an abandoned change and writes it again, which for a fan-out of hundreds
    of thousands of followers (seconds) would be the same work twice, at once.  Between chunks the
    writer moves its rows' ``created`` to now (the database's clock), at most every half grace;
    a writer that dies stops doing so, and its rows age into the repair pass as before."""

    def __init__(self, alias, pks):
        self.alias, self.pks = alias, pks
        self.renewed = time.monotonic()

    def renew(self):
        if time.monotonic() - self.renewed < conf.get_config()["OUTBOX_GRACE"] / 2:
            return
        self.renewed = time.monotonic()
        try:
            PendingChange.objects.using(self.alias).filter(pk__in=self.pks).update(created=Now())
        except Exception:
            # a missed renewal costs at most a second write of the same answers
            logger.exception("cannot renew %d outbox row(s)", len(self.pks))


def outbox_db():
    """The database of the outbox rows: where the router writes :class:`PendingChange`."""
    return router.db_for_write(PendingChange)


def record(change, using=None):
    """After the current transaction on ``using`` (the database that made the change; None: the
    default) commits, write ``change`` (an outbox Change).  Outside a transaction: right away.

    Its outbox row goes to :func:`outbox_db`: in the same transaction when that is ``using``;
    else it is committed at once, so a rollback of ``using`` leaves a row behind, which the
    repair pass replays once (a rewrite of answers that did not change)."""
    connection = transaction.get_connection(using)
    batches = _batches()
    batch = batches.get(connection.alias)
    if batch is not None and batch.is_pending(connection):
        batch.add(change)
        return
    batch = batches[connection.alias] = _Batch(outbox_db())
    batch.add(change)
    transaction.on_commit(batch, using=connection.alias)    # outside a transaction: runs now


def touch(name_or_names, *, users=None, objects=None, using=None):
    """After the current transaction commits, rewrite the answers of ``name_or_names`` (a
    resource name, several, or None for every per-user resource) for ``users`` (user ids, users,
    or an audience's members such as ``followers(author_id)``) and, for per-object resources,
    ``objects`` (object ids).  Through the outbox: a crash after the commit does not lose it; a
    large set is written by the process's background writer.  What signals miss (``update()``,
    ``bulk_create()``, raw SQL) is reported this way.  Naming neither ``users`` nor ``objects``
    is an error (an empty set of either is not: nothing to do), and so is a named resource
    whose kind's argument is missing (``objects=`` for a per-object one, ``users=`` for a
    per-user one): each name is touched, or the call fails."""
    if users is None and objects is None:
        raise TypeError("touch() needs users= (ids, users or an audience's members) or objects= (for a "
                        "per-object resource): whose answers changed?")
    names = _names(name_or_names)
    for name in names or ():
        _check_argument(name, users, objects)
    user_ids, members = split_users(users)
    object_refs = set()
    for name in (names if names is not None else ()):
        if objects and resources.get(name).per == "object":
            object_refs.update((name, obj) for obj in _object_ids(objects))
    if objects and not object_refs:
        raise ValueError("objects= needs the name of a per-object resource")
    user_names = None if names is None else [n for n in names if resources.get(n).per == "user"]
    if (user_ids or members) and user_names == []:
        raise ValueError("users= needs the name of a per-user resource")
    if not (user_ids or members or object_refs):
        return
    record(outbox.make(user_names, user_ids, object_refs, members), using)


def _check_argument(name, users, objects):
    """Each named resource is touched through its kind's argument: a per-object name without
    ``objects=`` (or a per-user one without ``users=``) would be dropped without a word."""
    if resources.get(name).per == "object":
        if objects is None:
            raise ValueError(f"touch(): {name!r} is a per-object resource: it needs objects= (the ids of "
                             f"the objects whose answers changed)")
    elif users is None:
        raise ValueError(f"touch(): {name!r} is a per-user resource: it needs users= (user ids, users or "
                         f"an audience's members)")


def _names(name_or_names):
    if name_or_names is None:
        return None
    if not isinstance(name_or_names, str) and not keys.is_many(name_or_names):
        raise TypeError(f"touch() takes a resource name, several, or None; got {name_or_names!r}")
    names = [name_or_names] if isinstance(name_or_names, str) else list(name_or_names)
    for name in names:
        if resources.get(name) is None:
            raise ValueError(f"unknown poll resource {name!r}; registered: {', '.join(sorted(resources.names()))}")
    return names


def split_users(users):
    """(user ids, audience references) of what ``users=`` may hold: ids, user instances, an
    audience's members, or an iterable mixing them; ids of the user model's primary key type."""
    if users is None:
        return set(), set()
    if isinstance(users, audiences.Members) or not keys.is_many(users):
        users = [users]
    if isinstance(users, dict):
        raise TypeError("users= takes user ids, users or an audience's members, not a dict")
    User = get_user_model()
    field = User._meta.pk
    integers = field.get_internal_type() in db.INTEGER_FIELDS     # an int is already one: no per-id call
    ids, members = set(), set()
    for item in users:
        if isinstance(item, audiences.Members):
            members.update((item.audience, i) for i in item.ids)
        elif isinstance(item, type) or (hasattr(item, "_meta") and not isinstance(item, User)):
            raise TypeError(f"users= takes user ids, users or an audience's members, got {item!r}")
        elif hasattr(item, "_meta"):
            ids.add(item.pk)
        elif integers and type(item) is int:
            ids.add(item)
        elif item is not None:
            try:
                ids.add(field.to_python(item))
            except (ValidationError, TypeError, ValueError):
                raise ValueError(f"users= got {item!r}, which is not a primary key of "
                                 f"{User._meta.label}") from None
    return ids, members


def _object_ids(objects):
    if not keys.is_many(objects):
        objects = [objects]
    found = set()
    for obj in objects:
        value = obj.pk if hasattr(obj, "_meta") else obj
        keys.id_text(value)          # ValueError now, not in the writer after the commit
        found.add(value if type(value) is int else str(value))
    return found


def _batches():
    batches = getattr(_current, "batches", None)
    if batches is None:
        batches = _current.batches = {}
    return batches
