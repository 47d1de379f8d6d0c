"""What Plurk reports beyond its resources' ``watch`` (plurkcore.answers): a reader's cursor
row for every new user, and a renamed or deleted user, whose name is part of the answers of
everyone who sees its plurks and responses.  Each through fastpoll's public API.

:func:`install` connects them; ``PlurkCoreConfig.ready()`` calls it once.
"""
from django.contrib.auth import get_user_model
from django.db.models.signals import post_save, pre_delete, pre_save

import fastpoll

from .answers import RESOURCES, followers
from .models import Follow, Plurk, ReadCursor


def _user_saving(sender, instance, raw=False, update_fields=None, **kwargs):
    field = sender.USERNAME_FIELD
    instance._plurk_renamed = False
    if raw or instance._state.adding or instance.pk is None:
        return
    if update_fields is not None and field not in update_fields:
        return                       # e.g. a login saving last_login: no extra query
    old = sender._default_manager.filter(pk=instance.pk).values_list(field, flat=True).first()
    instance._plurk_renamed = old is not None and old != getattr(instance, field)


def _user_saved(sender, instance, created, raw=False, **kwargs):
    if raw:
        return
    if created:
        ReadCursor.objects.get_or_create(user_id=instance.pk)
    elif getattr(instance, "_plurk_renamed", False):
        fastpoll.touch(RESOURCES, users=_user_audience(instance.pk))


def _responded_to(uid):
    """The authors of the plurks ``uid`` responded to (not itself)."""
    authors = set(Plurk.entries.filter(author_id=uid, parent_author__isnull=False)
                  .values_list("parent_author_id", flat=True).distinct())
    authors.discard(uid)
    return authors


def _user_audience(uid):
    """Who sees ``uid``'s name: itself, its followers, and the authors (and their followers) of
    the plurks it responded to."""
    authors = _responded_to(uid)
    return [uid, followers(uid), *authors, *(followers(a) for a in authors)]


def _user_deleting(sender, instance, **kwargs):
    # its follows go with it: its followers are named now, not as an audience read after the commit
    authors = _responded_to(instance.pk)
    named = set(Follow.objects.filter(followee_id=instance.pk).values_list("follower_id", flat=True)) | authors
    fastpoll.touch(RESOURCES, users=[*named, *(followers(a) for a in authors)])


def install():
    """Connect the receivers (called once from AppConfig.ready())."""
    User = get_user_model()
    pre_save.connect(_user_saving, sender=User, dispatch_uid="plurkcore.user_saving")
    post_save.connect(_user_saved, sender=User, dispatch_uid="plurkcore.user_saved")
    pre_delete.connect(_user_deleting, sender=User, dispatch_uid="plurkcore.user_deleting")
