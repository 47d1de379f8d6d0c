"""Model-signal receivers: turn saves and deletes into :func:`~plurkcore.changes.changed` calls.

docs/consistency.md ("What is published") lists which change rewrites whose answers.
:func:`install` connects them; ``PlurkCoreConfig.ready()`` calls it once.
"""
from django.contrib.auth import get_user_model
from django.db.models.signals import post_delete, post_save, pre_delete, pre_save

from fastpoll import keys
from . import answers
from .changes import changed
from .models import Follow, Plurk, Response, UserState

#: User fields that no answer shows: a save of only these publishes nothing (a login sets
#: last_login; the login view publishes explicitly, api._logged_in).
_UNSHOWN_USER_FIELDS = frozenset({"last_login"})


def _user_keys(uid, epoch):
    return keys.user_keys(uid, epoch, answers.resource_names())


def _user_saved(sender, instance, created, raw=False, update_fields=None, **kwargs):
    if raw or (update_fields is not None and update_fields <= _UNSHOWN_USER_FIELDS):
        return
    if created:
        UserState.objects.get_or_create(user_id=instance.pk)
        changed("user", users={instance.pk})
    elif getattr(instance, "is_active", True) is False:
        # a deactivated user's token is refused by Django; fastpath must stop answering it too
        epoch = UserState.objects.filter(user_id=instance.pk).values_list("epoch", flat=True).first()
        if epoch is not None:
            changed("user", dead_keys=_user_keys(instance.pk, epoch))
    elif getattr(instance, "_plurk_renamed", False):
        # the name is part of the answers of everyone who sees this user's plurks and responses
        changed("user", **_user_audience(instance.pk))
    else:
        changed("user", users={instance.pk})


def _user_saving(sender, instance, raw=False, update_fields=None, **kwargs):
    field = sender.USERNAME_FIELD
    instance._plurk_renamed = False
    if raw or instance._state.adding or instance.pk is None:
        return
    if update_fields is not None and field not in update_fields:
        return                       # e.g. a login saving last_login: no extra query
    old = sender._default_manager.filter(pk=instance.pk).values_list(field, flat=True).first()
    instance._plurk_renamed = old is not None and old != getattr(instance, field)


def _user_audience(uid):
    """users= and followers_of= for a change to ``uid`` itself: its followers, and the authors
    (and their followers) of the plurks it responded to."""
    followers = set(Follow.objects.filter(followee_id=uid).values_list("follower_id", flat=True))
    authors = set(Plurk.entries.filter(author_id=uid, parent_author__isnull=False)
                  .values_list("parent_author_id", flat=True).distinct())
    authors.discard(uid)
    return {"users": followers | authors | {uid}, "followers_of": authors}


def _user_deleting(sender, instance, **kwargs):
    state = UserState.objects.filter(user_id=instance.pk).first()
    dead = _user_keys(instance.pk, state.epoch) if state else set()
    audience = _user_audience(instance.pk)
    audience["users"].discard(instance.pk)
    changed("user", dead_keys=dead, **audience)


def _audience(entry):
    """(kind, users, followers_of) whose answers an entry is part of."""
    if entry.parent_id is None:
        return "plurk", set(), {entry.author_id}
    parent_author = entry.parent_author_id          # kept by Plurk.save() and the migration
    if parent_author is None:
        parent_author = Plurk.entries.filter(pk=entry.parent_id).values_list("author_id", flat=True).first()
    if parent_author is None:
        return "response", set(), set()
    return "response", {parent_author}, {parent_author}


def _entry_saved(sender, instance, raw=False, **kwargs):
    if not raw:
        kind, users, followers_of = _audience(instance)
        changed(kind, users=users, followers_of=followers_of)


def _entry_deleting(sender, instance, **kwargs):
    kind, users, followers_of = _audience(instance)
    changed(kind, users=users, followers_of=followers_of)


def _follow_changed(sender, instance, raw=False, **kwargs):
    if not raw:
        changed("follow", users={instance.follower_id})


def _state_saving(sender, instance, raw=False, **kwargs):
    if raw or instance._state.adding:
        return
    old = UserState.objects.filter(pk=instance.pk).values_list("epoch", flat=True).first()
    instance._plurk_old_epoch = old


def _state_saved(sender, instance, created, raw=False, **kwargs):
    if raw:
        return
    old = getattr(instance, "_plurk_old_epoch", None)
    dead = _user_keys(instance.pk, old) if old is not None and old != instance.epoch else ()
    changed("epoch", users={instance.pk}, dead_keys=dead)


def install():
    """Connect the receivers (called once from AppConfig.ready())."""
    User = get_user_model()
    pre_save.connect(_user_saving, sender=User, dispatch_uid="plurkcore.user_saving")
    post_save.connect(_user_saved, sender=User, dispatch_uid="plurkcore.user_saved")
    pre_delete.connect(_user_deleting, sender=User, dispatch_uid="plurkcore.user_deleting")
    for model in (Plurk, Response):
        post_save.connect(_entry_saved, sender=model, dispatch_uid=("plurkcore.entry_saved", model.__name__))
        pre_delete.connect(_entry_deleting, sender=model,
                           dispatch_uid=("plurkcore.entry_deleting", model.__name__))
    post_save.connect(_follow_changed, sender=Follow, dispatch_uid="plurkcore.follow_saved")
    post_delete.connect(_follow_changed, sender=Follow, dispatch_uid="plurkcore.follow_deleted")
    pre_save.connect(_state_saving, sender=UserState, dispatch_uid="plurkcore.state_saving")
    post_save.connect(_state_saved, sender=UserState, dispatch_uid="plurkcore.state_saved")
