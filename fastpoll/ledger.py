"""The cache's debts, written down (docs/consistency.md, "The pieces"): the writer records here
what it could not do, and :mod:`fastpoll.repair` pays it.

- :func:`mark_suspect`: a write to this server failed, so it may hold stale entries
  (:class:`~fastpoll.models.SuspectServer`);
- :func:`mark_stale`: this key still conflicted after ``CAS_ATTEMPTS``
  (:class:`~fastpoll.models.StaleKey`).

Each new failure increments the row's ``generation``, so that the repair pass deletes a row only
when no failure happened after it read it.
"""
import logging

from django.db import IntegrityError, transaction
from django.db.models import F

from .models import StaleKey, SuspectServer

logger = logging.getLogger("fastpoll.repair")

#: Debts recorded since process start (for monitoring and tests); ``unrecorded``: debts that
#: could not be written down (the database failed too), so the writer keeps its outbox rows.
stats = {"suspect": 0, "stale": 0, "unrecorded": 0, "replayed": 0}


def mark_suspect(node):
    stats["suspect"] += 1
    try:
        if SuspectServer.objects.filter(server=node).update(generation=F("generation") + 1):
            return
        try:
            with transaction.atomic():
                SuspectServer.objects.create(server=node)
        except IntegrityError:
            SuspectServer.objects.filter(server=node).update(generation=F("generation") + 1)
    except Exception:
        stats["unrecorded"] += 1
        logger.exception("cannot record memcached %s as suspect", node)


def mark_stale(key_list, why="still conflicted after retries"):
    key_list = sorted(key_list)
    stats["stale"] += len(key_list)
    logger.warning("%d key(s) %s; left to the repair pass", len(key_list), why)
    try:
        StaleKey.objects.filter(key__in=key_list).update(generation=F("generation") + 1)
        existing = set(StaleKey.objects.filter(key__in=key_list).values_list("key", flat=True))
        StaleKey.objects.bulk_create([StaleKey(key=k) for k in key_list if k not in existing],
                                     ignore_conflicts=True)
    except Exception:
        stats["unrecorded"] += 1
        logger.exception("cannot record %d stale key(s)", len(key_list))


