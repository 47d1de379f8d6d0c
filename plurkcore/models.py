"""The authoritative store.  Users are ``django.contrib.auth`` users.

Plurks and responses live in one table (:class:`Plurk`, ``parent`` NULL for a plurk) so that they
share one id sequence: a read cursor (:attr:`UserState.read_upto`) compares ids across both.
:class:`Response` is a proxy over the same table.
"""
from django.conf import settings
from django.db import connections, models, router, transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

MAX_CONTENT_LENGTH = 360
#: pg_advisory_xact_lock key that orders new entries' ids with their commits (Plurk.save)
ENTRY_ORDER_LOCK = 0x706C75726B          # "plurk"


class Follow(models.Model):
    follower = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="following_set")
    followee = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="follower_set")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["follower", "followee"], name="plurkcore_follow_unique"),
            models.CheckConstraint(condition=~Q(follower=models.F("followee")),
                                   name="plurkcore_follow_not_self"),
        ]
        indexes = [models.Index(fields=["followee", "follower"], name="plurkcore_follow_followee")]

    def __str__(self):
        return f"{self.follower_id} follows {self.followee_id}"


class PlurkQuerySet(models.QuerySet):
    def plurks(self):
        return self.filter(parent__isnull=True)

    def responses(self):
        return self.filter(parent__isnull=False)

    def bulk_create(self, objs, *args, **kwargs):
        """As Django's, with each response's ``parent_author`` filled in (``save()`` is skipped):
        one query for the parents not already loaded."""
        objs = list(objs)
        missing = {o.parent_id for o in objs if o.parent_id is not None and not Plurk.parent.is_cached(o)}
        authors = dict(Plurk.entries.filter(pk__in=missing).values_list("pk", "author_id")) if missing else {}
        for o in objs:
            if o.parent_id is not None:
                o.parent_author_id = o.parent.author_id if Plurk.parent.is_cached(o) else authors.get(o.parent_id)
            else:
                o.parent_author_id = None
        return super().bulk_create(objs, *args, **kwargs)


class PlurkManager(models.Manager.from_queryset(PlurkQuerySet)):
    """Top-level plurks only (``parent`` is NULL)."""

    def get_queryset(self):
        return super().get_queryset().filter(parent__isnull=True)


class ResponseManager(models.Manager.from_queryset(PlurkQuerySet)):
    def get_queryset(self):
        return super().get_queryset().filter(parent__isnull=False)


class Plurk(models.Model):
    """A plurk (``parent`` is NULL) or a response to one; both share the id sequence."""

    # No index of their own: (author, parent, id) and (parent, id) below serve lookups by either
    # column, and a second index on author alone drew PostgreSQL's planner, before the table's
    # first ANALYZE, to walk an author's every plurk to find the few above a read cursor.
    author = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="plurks", db_index=False)
    parent = models.ForeignKey("self", models.CASCADE, null=True, blank=True, related_name="responses",
                               db_index=False)
    content = models.CharField(max_length=MAX_CONTENT_LENGTH)
    created = models.DateTimeField(default=timezone.now, db_index=True)
    # The parent's author, kept on each response (NULL on a plurk) so that "new responses in the
    # threads of these users" is an index range scan: read through the parent, it walked every
    # plurk the users ever wrote (an author with 1,000 old plurks made a 1,000-follower fan-out
    # 18x slower on SQLite, 30x on PostgreSQL).  Set by save() and bulk_create().
    parent_author = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, null=True, blank=True,
                                      editable=False, related_name="+", db_index=False)

    objects = PlurkManager()
    entries = models.Manager.from_queryset(PlurkQuerySet)()  # plurks and responses

    class Meta:
        # Related managers (``plurk.responses``), dumpdata and cascades see every entry;
        # ``Plurk.objects`` is the top-level plurks only.
        default_manager_name = "entries"
        base_manager_name = "entries"
        indexes = [
            # The unread counts are index-only range counts (answers.py): an author's plurks
            # above a cursor (parent IS NULL), and the responses in an author's threads above a
            # cursor by anyone but the reader.  The first also serves every lookup by author (a
            # second one on (author, id) drew PostgreSQL to it, reading the table for each row).
            models.Index(fields=["author", "parent", "id"], name="plurkcore_entry_author"),
            models.Index(fields=["parent", "id"], name="plurkcore_entry_parent"),
            models.Index(fields=["parent_author", "id", "author"], name="plurkcore_entry_thread"),
        ]

    def save(self, *args, **kwargs):
        """A new entry takes its id and commits in one order: the read cursor depends on it.

        A follower marks read "everything up to id N"; if an entry with a smaller id could
        commit after N was seen, it would count as read before anyone saw it.  PostgreSQL hands
        out sequence values before commit, so new entries take a transaction-level advisory lock
        first (held until the transaction commits).  SQLite serialises writers already.
        ``bulk_create`` bypasses this: use it only where nobody polls yet."""
        update_fields = kwargs.get("update_fields")
        if update_fields is None or {"parent", "parent_id"} & set(update_fields):
            # only when this save writes the parent: an edit of the content alone costs no lookup
            self.parent_author_id = self.parent.author_id if self.parent_id is not None else None
            if update_fields is not None:
                kwargs["update_fields"] = {*update_fields, "parent_author"}
        if self.pk is not None or not self._state.adding:
            return super().save(*args, **kwargs)
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        with transaction.atomic(using=using):
            if connections[using].vendor == "postgresql":
                with connections[using].cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ENTRY_ORDER_LOCK])
            return super().save(*args, **kwargs)

    def __str__(self):
        kind = "response" if self.parent_id else "plurk"
        return f"{kind} {self.pk} by {self.author_id}: {self.content[:40]}"

    @property
    def is_response(self):
        return self.parent_id is not None


class Response(Plurk):
    objects = ResponseManager()

    class Meta:
        proxy = True
        default_manager_name = "objects"


class ReadCursor(models.Model):
    """A user's read cursor: every entry with an id up to ``read_upto`` counts as read."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, models.CASCADE, primary_key=True,
                                related_name="plurk_cursor")
    read_upto = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = "read cursor"

    def __str__(self):
        return f"{self.user_id} has read up to {self.read_upto}"
