"""Collecting changes: what a transaction changed, handed to the writer once it commits.

:func:`changed` is called by the model-signal receivers (:mod:`plurkcore.receivers`) and by code
that changes the tables without signals (``QuerySet.update()``, ``bulk_create()``, raw SQL).
"""
import threading

from django.db import transaction

from . import publish

_state = threading.local()


def changed(kind, users=(), followers_of=(), dead_keys=(), using=None):
    """After the current transaction commits, rewrite the answers of ``users`` and of every
    follower of ``followers_of`` for the resources affected by ``kind``, and delete ``dead_keys``
    (keys of a revoked epoch or a deleted user).  Outside a transaction: right away."""
    pending = getattr(_state, "pending", None)
    if pending is None:
        pending = _state.pending = []
    pending.append((kind, frozenset(users), frozenset(followers_of), frozenset(dead_keys)))
    transaction.on_commit(_committed, using=using)


def _committed():
    batch = getattr(_state, "pending", None)
    _state.pending = []
    publish.flush(batch)
