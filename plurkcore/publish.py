"""After-commit cache writes: keep every cached poll answer equal to what Django would answer.

Changes are queued by model-signal receivers (and by the API for queryset updates) with
:func:`changed`, and written by :func:`flush` from ``transaction.on_commit``, batched: every user and
resource a transaction affected is written once, per server, pipelined.

The write protocol (docs/consistency.md) for each key is ``gets`` -> read the database -> ``cas`` (or
``add`` when the key was absent), retried on conflict.  A store only succeeds if nobody stored the
key since our ``gets``, and our ``gets`` came before our database read, so the last successful
writer of a key always read the database after every earlier commit.  Poll fills use ``add``.  A
write that fails marks the server suspect (:class:`~plurkcore.models.SuspectServer`): the repair
pass (:func:`repair`) flushes it once it answers again, before its entries can be trusted.  Keys that
still conflict after ``CAS_ATTEMPTS`` become :class:`~plurkcore.models.StaleKey` rows for the
repair pass.  ``CACHE_TTL`` is the last safety net.

Nothing here raises into the request that committed: memcached problems are logged and counted.
"""
import logging
import threading

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.signals import post_delete, post_save, pre_delete, pre_save

from . import answers, conf, keys
from .cache import CacheUnavailable, get_cache
from .models import Follow, Plurk, Response, StaleKey, SuspectServer, UserState

logger = logging.getLogger("plurkcore.publish")

#: Counters since process start (for monitoring and tests).
stats = {"publishes": 0, "keys_written": 0, "conflicts": 0, "stale": 0, "suspect": 0, "errors": 0}

# -- test hooks: deterministic interleavings without sleeps ---------------------------------
_hooks = {}


def set_hook(name, func):
    """Call ``func(**context)`` at the named point ("write.after_gets", "write.after_read",
    "write.after_store", "fill.after_read", "repair.before_flush"); ``None`` removes it."""
    if func is None:
        _hooks.pop(name, None)
    else:
        _hooks[name] = func


def _hook(name, **context):
    func = _hooks.get(name)
    if func is not None:
        func(**context)


# -- queueing -------------------------------------------------------------------------------
_state = threading.local()


def changed(kind, users=(), followers_of=(), dead_keys=(), using=None):
    """After the current transaction commits, rewrite the answers of ``users`` and of every
    follower of ``followers_of`` for the resources affected by ``kind``, and delete ``dead_keys``
    (keys of a revoked epoch or a deleted user).  Outside a transaction: right away."""
    pending = getattr(_state, "pending", None)
    if pending is None:
        pending = _state.pending = []
    pending.append((kind, frozenset(users), frozenset(followers_of), frozenset(dead_keys)))
    transaction.on_commit(flush, using=using)


def flush():
    """Write everything queued in this thread (an on_commit callback; never raises)."""
    batch = getattr(_state, "pending", None)
    if not batch:
        return
    _state.pending = []
    try:
        publish(batch)
    except Exception:
        stats["errors"] += 1
        logger.exception("publishing %d change(s) failed; the cache may be stale until CACHE_TTL "
                         "or `manage.py checkcache --fix`", len(batch))


def publish(batch):
    """Write the answers for a batch of (kind, users, followers_of, dead_keys)."""
    stats["publishes"] += 1
    repair(quick=True)
    authors = set()
    for _, _, followers_of, _ in batch:
        authors |= followers_of
    followers = followers_by_author(authors)
    by_resource = {resource.name: set() for resource in answers.resources()}
    dead = set()
    for kind, users, followers_of, dead_keys in batch:
        affected = set(users)
        for author in followers_of:
            affected |= followers.get(author, set())
        for resource in answers.resources():
            if resource.is_affected_by(kind):
                by_resource[resource.name] |= affected
        dead |= dead_keys
    if dead:
        delete_keys(sorted(dead))
    write_answers(by_resource)


def followers_by_author(authors):
    result = {}
    authors = list(authors)
    size = conf.get_config()["BATCH_SIZE"]
    for start in range(0, len(authors), size):
        rows = Follow.objects.filter(followee_id__in=authors[start:start + size]).values_list(
            "followee_id", "follower_id")
        for followee, follower in rows.iterator(chunk_size=5000):
            result.setdefault(followee, set()).add(follower)
    return result


# -- writing --------------------------------------------------------------------------------
def write_answers(by_resource):
    """Write ``{resource name: user ids}``; returns the keys that could not be written."""
    users = sorted(set().union(*by_resource.values())) if by_resource else []
    size = conf.get_config()["BATCH_SIZE"]
    failed = set()
    for start in range(0, len(users), size):
        chunk = set(users[start:start + size])
        failed |= _write_chunk({name: uids & chunk for name, uids in by_resource.items() if uids & chunk})
    return failed


def _write_chunk(by_resource):
    config = conf.get_config()
    cache = get_cache()
    uids = set().union(*by_resource.values())
    epochs = answers.epochs(uids)
    todo = {}
    for name, resource_uids in by_resource.items():
        for uid in resource_uids:
            if uid in epochs:
                todo[keys.answer_key(name, uid, epochs[uid])] = (name, uid)
    node_of = {key: cache.node_for(key) for key in todo}
    written = {}
    failed = set()
    for attempt in range(config["CAS_ATTEMPTS"]):
        if not todo:
            break
        current = {}
        for node, node_keys in cache.group(todo, node_of).items():
            try:
                current.update(cache.cas_uniques(node, node_keys))
            except CacheUnavailable:
                mark_suspect(node)
                failed.update(node_keys)
                for key in node_keys:
                    del todo[key]
        _hook("write.after_gets", keys=sorted(todo), attempt=attempt)
        wanted = {}
        for name, uid in todo.values():
            wanted.setdefault(name, set()).add(uid)
        values = {}
        with answers.shared_reads():
            for name, resource_uids in wanted.items():
                try:
                    values[name] = answers.get_resource(name).compute(sorted(resource_uids))
                except Exception:
                    # one broken resource must not keep the others stale
                    logger.exception("computing poll resource %s failed", name)
                    broken = [key for key, (n, _) in todo.items() if n == name]
                    mark_stale(broken)
                    failed.update(broken)
                    for key in broken:
                        del todo[key]
        _hook("write.after_read", keys=sorted(todo), attempt=attempt)
        ops = {}
        for key, (name, uid) in todo.items():
            value = values[name].get(uid)
            if value is None:          # the user is gone: its keys were queued for deletion
                continue
            op = (b"cas", key, value, current[key]) if key in current else (b"add", key, value, None)
            ops.setdefault(node_of[key], []).append(op)
        retry = {}
        for node, node_ops in ops.items():
            try:
                replies = cache.store_many(node, node_ops, config["CACHE_TTL"])
            except CacheUnavailable:
                mark_suspect(node)
                failed.update(key for _, key, _, _ in node_ops)
                continue
            for key, reply in replies.items():
                if reply == b"STORED":
                    written[key] = todo[key]
                else:
                    retry[key] = todo[key]
        stats["conflicts"] += len(retry)
        todo = retry
        _hook("write.after_store", keys=sorted(written), attempt=attempt)
    if todo:
        mark_stale(todo)
        failed.update(todo)
    stats["keys_written"] += len(written)
    if written:
        # A key written for an epoch that was revoked meanwhile must not outlive the revocation.
        now = answers.epochs({uid for _, uid in written.values()})
        revoked = [key for key, (_, uid) in written.items() if now.get(uid) != epochs[uid]]
        if revoked:
            delete_keys(revoked)
    return failed


def delete_keys(key_list):
    cache = get_cache()
    for node, node_keys in cache.group(key_list).items():
        try:
            cache.delete_many(node, node_keys)
        except CacheUnavailable:
            mark_suspect(node)


def fill(key, value, uid, epoch):
    """The poll view's miss-fill: ``add`` (never overwrites a writer's value), then make sure the
    epoch it was computed for is still current.  Returns True if stored."""
    cache = get_cache()
    node = cache.node_for(key)
    try:
        stored = cache.add(key, value, conf.get_config()["CACHE_TTL"])
    except CacheUnavailable as exc:
        if exc.attempted:          # the add may still land when the server wakes up
            mark_suspect(node)
        return False
    if stored and not UserState.objects.filter(user_id=uid, epoch=epoch).exists():
        delete_keys([key])
    return stored


# -- the debts: suspect servers and stale keys ------------------------------------------------
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
        logger.exception("cannot record memcached %s as suspect", node)


def mark_stale(key_list):
    key_list = sorted(key_list)
    stats["stale"] += len(key_list)
    logger.warning("%d key(s) still conflicted after retries; left to the repair pass", len(key_list))
    try:
        StaleKey.objects.filter(key__in=key_list).update(generation=F("generation") + 1)
        existing = set(StaleKey.objects.filter(key__in=key_list).values_list("key", flat=True))
        StaleKey.objects.bulk_create([StaleKey(key=k) for k in key_list if k not in existing],
                                     ignore_conflicts=True)
    except Exception:
        logger.exception("cannot record %d stale key(s)", len(key_list))


def parse_key(key):
    """(resource, uid, epoch) of an answer key, or None."""
    parts = key.split(":")
    if len(parts) != 4 or parts[0] != keys.KEY_VERSION:
        return None
    try:
        return parts[1], int(parts[2]), int(parts[3])
    except ValueError:
        return None


def repair(quick=False):
    """Pay the debts: flush every suspect server that answers again, then rewrite stale keys.

    ``quick`` (at the start of a publish) skips servers this process saw failing moments ago, so a
    dead server costs no extra timeout per write.  Returns a report dict."""
    report = {"flushed": [], "unreachable": [], "rewritten": 0, "still_stale": 0}
    if quick and not (SuspectServer.objects.exists() or StaleKey.objects.exists()):
        return report
    cache = get_cache()
    for node, generation in list(SuspectServer.objects.values_list("server", "generation")):
        if node not in cache.client.clients:
            SuspectServer.objects.filter(server=node).delete()   # no longer configured
            continue
        if quick and cache.is_down(node):
            report["unreachable"].append(node)
            continue
        _hook("repair.before_flush", node=node)
        try:
            cache.flush(node)
        except CacheUnavailable:
            report["unreachable"].append(node)
            continue
        logger.info("memcached %s answers again: flushed its entries before trusting it", node)
        SuspectServer.objects.filter(server=node, generation=generation).delete()
        report["flushed"].append(node)
    stale = list(StaleKey.objects.values_list("key", "generation")[:10000])
    if stale:
        parsed = {key: parse_key(key) for key, _ in stale}
        uids = {p[1] for p in parsed.values() if p}
        epochs = dict(UserState.objects.filter(user_id__in=uids).values_list("user_id", "epoch"))
        by_resource, dead = {}, []
        for key, p in parsed.items():
            if p and answers.get_resource(p[0]) and epochs.get(p[1]) == p[2]:
                by_resource.setdefault(p[0], set()).add(p[1])
            else:
                dead.append(key)
        if dead:
            delete_keys(dead)
        failed = write_answers(by_resource)
        for key, generation in stale:
            if key not in failed:
                StaleKey.objects.filter(key=key, generation=generation).delete()
        report["rewritten"] = len(stale) - len(failed)
        report["still_stale"] = len(failed)
    return report


# -- model signal receivers --------------------------------------------------------------------
def user_keys(uid, epoch):
    """Every resource's key of ``uid`` at ``epoch``."""
    return {keys.answer_key(resource.name, uid, epoch) for resource in answers.resources()}


def _user_saved(sender, instance, created, raw=False, **kwargs):
    if raw:
        return
    if created:
        UserState.objects.get_or_create(user_id=instance.pk)
        changed("user", users={instance.pk})
    elif getattr(instance, "is_active", True) is False:
        # a deactivated user's token is refused by Django; fastpath must stop answering it too
        epoch = UserState.objects.filter(user_id=instance.pk).values_list("epoch", flat=True).first()
        if epoch is not None:
            changed("user", dead_keys=user_keys(instance.pk, epoch))
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
    authors = set(Plurk.entries.filter(responses__author_id=uid).values_list("author_id", flat=True))
    authors.discard(uid)
    return {"users": followers | authors | {uid}, "followers_of": authors}


def _user_deleting(sender, instance, **kwargs):
    state = UserState.objects.filter(user_id=instance.pk).first()
    dead = user_keys(instance.pk, state.epoch) if state else set()
    audience = _user_audience(instance.pk)
    audience["users"].discard(instance.pk)
    changed("user", dead_keys=dead, **audience)


def _audience(entry):
    """(kind, users, followers_of) whose answers an entry is part of."""
    if entry.parent_id is None:
        return "plurk", set(), {entry.author_id}
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
    dead = user_keys(instance.pk, old) if old is not None and old != instance.epoch else ()
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
