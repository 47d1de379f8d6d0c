"""Collecting changes: what a transaction changed, handed to the writer once it commits.

:func:`changed` is called by the model-signal receivers (:mod:`plurkcore.receivers`) and by code
that changes the tables without signals (``QuerySet.update()``, ``bulk_create()``, raw SQL).

A transaction's changes live in one :class:`_Batch`, which is itself the transaction's
``on_commit`` callback: Django runs it once after the commit (one batch, one publish, however many
rows changed) and forgets it on rollback, so a rolled-back transaction's changes are dropped with
it instead of being written at this thread's next commit.  Changes queued inside a savepoint that
is rolled back while its transaction goes on stay in the batch: Django does not say which
savepoint a callback's work belonged to once the commit runs it.  That costs a rewrite (or a miss,
for a deleted key), never a wrong answer: the writer reads the database after the commit.

Each change is also written to the outbox (:class:`~plurkcore.models.PendingChange`) *in the
transaction that made it*, and the batch deletes those rows once the writer is done.  A process
killed between its commit and its stores leaves its rows behind, and the repair pass writes their
answers (:func:`plurkcore.repair.repair`): a commit's answers are written even when the process
that committed is not there to write them.  Outside a transaction the change is already
committed when :func:`changed` is called; the row then only narrows that window.

A batch that would rewrite the answers of more than ``FANOUT_IN_REQUEST`` followers is written by
the process's background writer (:mod:`plurkcore.background`), its outbox rows kept until then.
A write that takes longer than half of ``OUTBOX_GRACE`` renews its rows (:class:`_Lease`), so the
repair pass does not write a change again while its own writer is still at it.
"""
import json
import logging
import threading
import time

from django.db import connections, transaction
from django.db.models.functions import Now

from fastpoll import conf
from . import background, publish
from .models import PendingChange

logger = logging.getLogger("plurkcore.changes")

_current = threading.local()       # .batches: {database alias: the open transaction's _Batch}


class _Batch:
    """The changes of one transaction on one database, as (kind, users, followers_of, dead_keys)."""

    def __init__(self, alias):
        self.alias = alias
        self.items = []
        self.pending = []          # ids of this batch's outbox rows

    def add(self, item):
        self.items.append(item)
        row = PendingChange.objects.using(self.alias).create(change=encode(item))
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
        lease = _Lease(self.alias, self.pending)
        if publish.flush(self.items, alive=lease.renew):
            forget(self.alias, self.pending)

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


def changed(kind, users=(), followers_of=(), dead_keys=(), using=None):
    """After the current transaction commits, rewrite the answers of ``users`` and of every
    follower of ``followers_of`` for the resources affected by ``kind``, and delete ``dead_keys``
    (keys of a revoked epoch or a deleted user).  Outside a transaction: right away."""
    item = (kind, frozenset(users), frozenset(followers_of), frozenset(dead_keys))
    connection = transaction.get_connection(using)
    batches = _batches()
    batch = batches.get(connection.alias)
    if batch is not None and batch.is_pending(connection):
        batch.add(item)
        return
    batch = batches[connection.alias] = _Batch(connection.alias)
    batch.add(item)
    transaction.on_commit(batch, using=connection.alias)    # outside a transaction: runs now


def encode(item):
    kind, users, followers_of, dead_keys = item
    return json.dumps({"kind": kind, "users": sorted(users), "followers_of": sorted(followers_of),
                       "dead_keys": sorted(dead_keys)}, separators=(",", ":"))


def decode(text):
    """An outbox row's change as an item of :func:`publish.publish`'s batch."""
    change = json.loads(text)
    return (change["kind"], frozenset(change["users"]), frozenset(change["followers_of"]),
            frozenset(change["dead_keys"]))


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


def _batches():
    batches = getattr(_current, "batches", None)
    if batches is None:
        batches = _current.batches = {}
    return batches
