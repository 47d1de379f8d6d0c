"""fastpoll's tables, and only these: each user's poll state, the outbox and the cache's debts.

The debts (docs/consistency.md, "The pieces"): a memcached server a write failed on
(:class:`SuspectServer`), a key that still conflicted after its retries (:class:`StaleKey`), and a
committed change whose answers may not be written yet (:class:`PendingChange`, the outbox).
"""
from django.conf import settings
from django.db import models, router
from django.db.models.functions import Now
from django.utils import timezone


class WhereWrittenManager(models.Manager):
    """Reads where the router writes (``db_for_write``), never from a replica: these tables say
    what the cache may hold (an epoch read behind a revocation would let a revoked token in and
    have its epoch's answers written again; a debt read late would be paid late)."""

    def get_queryset(self):
        return super().get_queryset().using(router.db_for_write(self.model))


class UserState(models.Model):
    """A user's poll state: the token epoch, bumped to revoke every token the user holds (the
    epoch is part of every token and of every key of the user's answers)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, models.CASCADE, primary_key=True,
                                related_name="fastpoll_state")
    epoch = models.BigIntegerField(default=0)

    objects = WhereWrittenManager()

    class Meta:
        verbose_name = "poll state"

    def __str__(self):
        return f"poll state of {self.user_id}: epoch {self.epoch}"


class SuspectServer(models.Model):
    """A memcached server a write to failed: it may hold stale answers until it is flushed.

    ``generation`` grows with every new failure, so the repair pass removes the row only when no
    failure happened after the flush it did (see docs/consistency.md)."""

    server = models.CharField(max_length=300, unique=True)
    generation = models.BigIntegerField(default=1)
    since = models.DateTimeField(default=timezone.now)

    objects = WhereWrittenManager()

    def __str__(self):
        return self.server


class StaleKey(models.Model):
    """A cache key that could not be rewritten (contention); the repair pass rewrites it."""

    key = models.CharField(max_length=250, unique=True)
    generation = models.BigIntegerField(default=1)
    since = models.DateTimeField(default=timezone.now)

    objects = WhereWrittenManager()

    def __str__(self):
        return self.key


class PendingChange(models.Model):
    """One change a transaction made, whose answers may not be written yet (the outbox).

    :func:`fastpoll.changes.changed` inserts it in the transaction that made the change, and the
    writer deletes it once the answers are written: a row that is still here some seconds after
    its commit belongs to a process that died in between (a killed web host), and the repair
    pass writes its answers (:func:`fastpoll.repair.repair`).  ``created`` is the database's
    clock, so hosts with different clocks agree on a row's age."""

    change = models.TextField()            # JSON (fastpoll.outbox)
    created = models.DateTimeField(db_default=Now())

    objects = WhereWrittenManager()

    def __str__(self):
        return f"pending change {self.pk}: {self.change[:60]}"
