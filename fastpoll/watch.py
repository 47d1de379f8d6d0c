"""Model signals -> changes: the resources' ``watch`` and the users' own lifecycle.

- every model a resource watches gets one ``pre_save``, one ``post_save`` and one ``pre_delete``
  receiver, which ask each watching resource for the ids whose answers the instance is part of
  and record the change (:func:`fastpoll.changes.record`), written after the commit.  An update
  asks for the ids of the row as it was too (read once before the save): a row moved to another
  owner, thread or room rewrites the answers it leaves as well as those it joins;
- the user model: a new user gets a poll state and its answers; a deactivated or deleted user's
  keys are deleted (a deactivated user's token is refused by Django: fastpath must stop answering
  it too); a new password revokes the user's poll tokens; any other save of what a user shows
  rewrites the user's own answers;
- :class:`~fastpoll.models.UserState`: a new epoch (a revocation) deletes the old epoch's keys.

:func:`install` connects them, from ``FastpollConfig.ready()``, once every app's resources are
registered.
"""
from django.contrib.auth import get_user_model
from django.db.models.signals import post_save, pre_delete, pre_save

from . import auth, changes, keys, outbox, resources
from .models import UserState

#: User fields that no answer shows: a save of only these publishes nothing (a login sets last_login).
UNSHOWN_USER_FIELDS = frozenset({"last_login"})


def _all_user_keys(uid, epoch):
    return keys.user_keys(uid, epoch, resources.names(per="user"))


class _Watcher:
    """The receiver of one watched model: [(resource, ids_of_instance)]."""

    def __init__(self, model):
        self.model = model
        self.watching = []

    def saving(self, sender, instance, raw=False, using=None, **kwargs):
        # the row as the database has it, before this save changes it (an update only)
        if raw or instance._state.adding or instance.pk is None or not self.watching:
            return
        instance._fastpoll_before = self.model._base_manager.using(using).filter(pk=instance.pk).first()

    def saved(self, sender, instance, raw=False, using=None, **kwargs):
        before = instance.__dict__.pop("_fastpoll_before", None)
        if not raw:
            self.report(instance, using, before)

    def deleting(self, sender, instance, using=None, **kwargs):
        self.report(instance, using)

    def report(self, instance, using=None, before=None):
        """One change for the event where it can be (one outbox row): the users of the watching
        per-user resources that named the same users, with every object named; ``before``, the
        row as it was, adds the ids it named."""
        groups, objects = {}, set()          # (user ids, members) -> resource names; (name, object)
        for resource, ids_of in self.watching:
            named = [found for found in (ids_of(instance), None if before is None else ids_of(before))
                     if found is not None]
            if not named:
                continue
            if resource.per == "object":
                for found in named:
                    objects.update((resource.name, o) for o in changes._object_ids(found))
                continue
            users, members = set(), set()
            for found in named:
                more_users, more_members = changes.split_users(found)
                users |= more_users
                members |= more_members
            if users or members:
                groups.setdefault((frozenset(users), frozenset(members)), []).append(resource.name)
        if not groups and objects:
            changes.record(outbox.make((), objects=objects), using)
        for (users, members), names in groups.items():
            changes.record(outbox.make(names, users, objects, members), using)
            objects = ()


def _epoch(uid):
    return UserState.objects.filter(user_id=uid).values_list("epoch", flat=True).first()


# the user's changes are written after the commit of the user's database (``using``); its poll
# state is where the router writes fastpoll's tables (UserState's manager reads there too)
def _user_saved(sender, instance, created, raw=False, update_fields=None, using=None, **kwargs):
    if raw or (update_fields is not None and set(update_fields) <= UNSHOWN_USER_FIELDS):
        return
    if created:
        UserState.objects.get_or_create(user_id=instance.pk)
        changes.record(outbox.make(None, {instance.pk}), using)
    elif getattr(instance, "_password", None) is not None:
        # set_password() then save(): a new password ends every poll token of the user, as
        # Django's session auth hash ends the user's other sessions (Django clears _password
        # only after post_save)
        auth.revoke(instance)
    elif getattr(instance, "is_active", True) is False:
        epoch = _epoch(instance.pk)
        if epoch is not None:
            changes.record(outbox.make(None, dead_keys=_all_user_keys(instance.pk, epoch)), using)
    else:
        changes.record(outbox.make(None, {instance.pk}), using)


def _user_deleting(sender, instance, using=None, **kwargs):
    epoch = _epoch(instance.pk)
    if epoch is not None:
        changes.record(outbox.make(None, dead_keys=_all_user_keys(instance.pk, epoch)), using)


def _state_saving(sender, instance, raw=False, using=None, **kwargs):
    if raw or instance._state.adding:
        return
    instance._fastpoll_old_epoch = (UserState.objects.using(using).filter(pk=instance.pk)
                                    .values_list("epoch", flat=True).first())


def _state_saved(sender, instance, created, raw=False, using=None, **kwargs):
    if raw:
        return
    old = getattr(instance, "_fastpoll_old_epoch", None)
    dead = _all_user_keys(instance.pk, old) if old is not None and old != instance.epoch else ()
    changes.record(outbox.make(None, {instance.pk}, dead_keys=dead), using)


_watchers = {}                     # model -> _Watcher


def connect(resource):
    """Watch ``resource``'s models (replacing what a resource of the same name watched)."""
    disconnect(resource.name)
    for model, ids_of in resource.watch:
        watcher = _watchers.get(model)
        if watcher is None:
            watcher = _watchers[model] = _Watcher(model)
            pre_save.connect(watcher.saving, sender=model, weak=False,
                             dispatch_uid=("fastpoll.saving", model._meta.label))
            post_save.connect(watcher.saved, sender=model, weak=False,
                              dispatch_uid=("fastpoll.saved", model._meta.label))
            pre_delete.connect(watcher.deleting, sender=model, weak=False,
                               dispatch_uid=("fastpoll.deleting", model._meta.label))
        watcher.watching.append((resource, ids_of))


def disconnect(name):
    for watcher in _watchers.values():
        watcher.watching = [(r, f) for r, f in watcher.watching if r.name != name]


def install():
    """Connect the receivers (called once from AppConfig.ready())."""
    User = get_user_model()
    post_save.connect(_user_saved, sender=User, dispatch_uid="fastpoll.user_saved")
    pre_delete.connect(_user_deleting, sender=User, dispatch_uid="fastpoll.user_deleting")
    pre_save.connect(_state_saving, sender=UserState, dispatch_uid="fastpoll.state_saving")
    post_save.connect(_state_saved, sender=UserState, dispatch_uid="fastpoll.state_saved")
    for resource in resources.all_resources():
        connect(resource)
    resources.on_change(connect, disconnect)
