"""Paying the cache's debts (:mod:`fastpoll.ledger` writes them down; docs/consistency.md).

:func:`repair`: flush every suspect server that answers again, rewrite stale keys, then write the
answers of outbox rows older than ``OUTBOX_GRACE`` (their writer died or failed).  A row is
deleted only if it is the row the pass read (same id: another pass may have paid it and a new
failure made it anew, generation 1 again) with its generation unchanged, so a failure recorded
during the pass is never lost, even with several passes at once (every Django process, a
repaircache per cluster host).
"""
import datetime
import logging
import threading

from django.contrib.auth import get_user_model
from django.db import DatabaseError, router, transaction
from django.db.models.functions import Now

from . import _testhooks, conf, keys, outbox, resources
from .cache import CacheUnavailable, get_cache
from .ledger import stats
from .models import PendingChange, StaleKey, SuspectServer, UserState
from .publish import delete_keys, flush, write_answers

logger = logging.getLogger("fastpoll.repair")

__all__ = ["repair", "stats"]


#: Held by the thread of this process that runs a quick pass (see :func:`repair`); a thread
#: turned away sets ``_quick_wanted`` first, and the holder runs once more for it.
_quick_pass = threading.Lock()
_quick_wanted = False
#: Passes one quick call runs at most (its own, and one for the threads turned away meanwhile):
#: a publisher is never kept paying for others under a steady stream of them.
QUICK_PASSES = 2


def repair(quick=False):
    """Pay the debts: flush every suspect server that answers again, rewrite stale keys, then
    (except when ``quick``) write the answers of the outbox's abandoned changes.

    ``quick`` (at the start of a publish) skips servers this process saw failing moments ago, so a
    dead server costs no extra timeout per write, and leaves the outbox to the repair service.
    A quick pass is skipped while another thread of this process runs one ("busy" in the
    report), and that thread runs once more when it is done, so a debt recorded after it read
    the tables is still paid by this process's next pass: the threads of a busy gunicorn worker,
    each publishing, would otherwise all rewrite the same stale keys at once, conflict with one
    another on exactly those keys, and record them stale again (under `make load`, 40% of
    gunicorn's time and delivery p99 in seconds).  Returns a report dict."""
    report = {"flushed": [], "unreachable": [], "rewritten": 0, "still_stale": 0, "replayed": 0, "busy": False}
    if not quick:
        _flush_suspects(False, report)
        _rewrite_stale(report)
        _replay_pending(report)
        return report
    if not (SuspectServer.objects.exists() or StaleKey.objects.exists()):
        return report
    _quick(report)
    return report


def _quick(report):
    global _quick_wanted
    _quick_wanted = True             # before trying: a pass running now sees it and runs again
    for _ in range(QUICK_PASSES):
        if not _quick_wanted:
            return
        if not _quick_pass.acquire(blocking=False):
            report["busy"] = True
            return
        try:
            _quick_wanted = False    # this pass reads the tables after every request so far
            _flush_suspects(True, report)
            _rewrite_stale(report)
        finally:
            _quick_pass.release()


def _flush_suspects(quick, report):
    cache = get_cache()
    for pk, node, generation in list(SuspectServer.objects.values_list("pk", "server", "generation")):
        if node not in cache.client.clients:
            SuspectServer.objects.filter(pk=pk).delete()   # no longer configured
            continue
        if quick and cache.is_down(node):
            report["unreachable"].append(node)
            continue
        _testhooks.fire("repair.before_flush", node=node)
        try:
            cache.flush(node)
        except CacheUnavailable:
            report["unreachable"].append(node)
            continue
        logger.info("memcached %s answers again: flushed its entries before trusting it", node)
        SuspectServer.objects.filter(pk=pk, generation=generation).delete()
        report["flushed"].append(node)


def _rewrite_stale(report):
    stale = list(StaleKey.objects.values_list("key", "pk", "generation")[:10000])
    if not stale:
        return
    _testhooks.fire("repair.before_rewrite", keys=[key for key, _, _ in stale])
    parsed = {key: keys.parse_key(key) for key, _, _ in stale}
    to_pk = get_user_model()._meta.pk.to_python
    uids = {}
    for p in parsed.values():
        if p and p.kind == "user" and p.id not in uids:
            try:
                uids[p.id] = to_pk(p.id)
            except Exception:          # not an id of this user model (ValidationError, ValueError)
                continue
    epochs = {keys.id_text(uid): epoch for uid, epoch in
              UserState.objects.filter(user_id__in=uids.values()).values_list("user_id", "epoch")}
    by_resource, dead = {}, []
    for key, p in parsed.items():
        resource = resources.get(p.resource) if p else None
        if resource is not None and p.kind == "object" and resource.per == "object":
            by_resource.setdefault(p.resource, set()).add(keys.object_id(p.id))
        elif resource is not None and p.kind == "user" and resource.per == "user" and epochs.get(p.id) == p.epoch:
            by_resource.setdefault(p.resource, set()).add(uids[p.id])
        else:
            dead.append(key)
    if dead:
        delete_keys(dead)
    failed = write_answers(by_resource)
    _forget_paid([(pk, generation) for key, pk, generation in stale if key not in failed])
    report["rewritten"] = len(stale) - len(failed)
    report["still_stale"] = len(failed)


def _forget_paid(rows):
    """Delete the stale-key rows ``[(pk, generation)]`` that were paid, each only if its
    generation is still the one read (a failure recorded meanwhile keeps it): one statement per
    generation and 500 rows, in one transaction.  A statement per row was a write transaction
    each, which on SQLite queued every other writer behind it."""
    by_generation = {}
    for pk, generation in rows:
        by_generation.setdefault(generation, []).append(pk)
    if not by_generation:
        return
    try:
        with transaction.atomic(using=router.db_for_write(StaleKey)):
            for generation, pks in by_generation.items():
                for start in range(0, len(pks), 500):
                    StaleKey.objects.filter(generation=generation, pk__in=pks[start:start + 500]).delete()
    except DatabaseError:
        # e.g. a deadlock with mark_stale's update on PostgreSQL: rows left behind only cost
        # their keys one more rewrite at the next pass
        logger.warning("could not forget %d paid stale key(s); the next pass rewrites them again",
                       len(rows), exc_info=True)


def _replay_pending(report, limit=1000):
    """Write the answers of outbox rows older than ``OUTBOX_GRACE`` seconds (by the database's
    clock), then delete them.  Their writer died between its commit and its stores, or failed;
    if it is only slow, writing twice is harmless (every write reads the database afresh)."""
    grace = datetime.timedelta(seconds=conf.get_config()["OUTBOX_GRACE"])
    rows = list(PendingChange.objects.filter(created__lt=Now() - grace)
                .order_by("pk").values_list("pk", "change")[:limit])
    if not rows:
        return
    batch, unreadable = [], []
    for pk, text in rows:
        try:
            batch.append((pk, outbox.decode(text)))
        except Exception:
            logger.error("outbox row %s is unreadable, dropped: %.200r", pk, text)
            unreadable.append(pk)
    logger.warning("writing the answers of %d change(s) whose writer did not finish", len(rows))
    written = unreadable[:]
    if flush([change for _, change in batch]):
        written += [pk for pk, _ in batch]
    elif len(batch) > 1:
        # one row that cannot be written must not hold the others back: each on its own; the
        # failing ones stay (logged by flush) for the next pass and an operator
        written += [pk for pk, change in batch if flush([change])]
    outbox.forget(router.db_for_write(PendingChange), written)
    stats["replayed"] += len(written)
    report["replayed"] = len(written)

