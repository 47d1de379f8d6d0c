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
"""
import threading

from django.db import transaction

from . import publish

_current = threading.local()       # .batches: {database alias: the open transaction's _Batch}


class _Batch:
    """The changes of one transaction on one database, as (kind, users, followers_of, dead_keys)."""

    def __init__(self):
        self.items = []

    def __call__(self):
        publish.flush(self.items)

    def is_pending(self, connection):
        # Django drops a rolled-back transaction's callbacks from this list (and the list is
        # emptied before a commit runs them): if we are not in it, our transaction is over.
        return any(func is self for _, func, _ in connection.run_on_commit)


def changed(kind, users=(), followers_of=(), dead_keys=(), using=None):
    """After the current transaction commits, rewrite the answers of ``users`` and of every
    follower of ``followers_of`` for the resources affected by ``kind``, and delete ``dead_keys``
    (keys of a revoked epoch or a deleted user).  Outside a transaction: right away."""
    item = (kind, frozenset(users), frozenset(followers_of), frozenset(dead_keys))
    connection = transaction.get_connection(using)
    batches = _batches()
    batch = batches.get(connection.alias)
    if batch is not None and batch.is_pending(connection):
        batch.items.append(item)
        return
    batch = batches[connection.alias] = _Batch()
    batch.items.append(item)
    transaction.on_commit(batch, using=connection.alias)    # outside a transaction: runs now


def _batches():
    batches = getattr(_current, "batches", None)
    if batches is None:
        batches = _current.batches = {}
    return batches
