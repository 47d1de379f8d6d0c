"""The after-commit writer: keep every cached poll answer equal to what Django would answer.

:func:`flush` receives a committed transaction's changes (from :mod:`fastpoll.changes`) and
writes them batched: every user and resource the transaction affected is written once, per server,
pipelined (:func:`write_answers`).  :func:`delete_keys` retires keys; :func:`fill` is the poll
view's miss-fill.  Every key follows the write protocol of docs/consistency.md (see
:func:`_write_keys`).  A write that fails becomes a debt (:mod:`fastpoll.ledger`) that :mod:`fastpoll.repair` pays.  Once
memcached confirms, :func:`_after_store` sends :data:`fastpoll.signals.answers_stored`.

Nothing here raises into the request that committed: memcached problems are logged and counted.
"""
import logging
from itertools import repeat

from . import _testhooks, audiences, conf, db, keys, ledger, resources, signals
from .cache import CacheUnavailable, get_cache
from .models import UserState

logger = logging.getLogger("fastpoll.publish")

#: Counters since process start (for monitoring and tests); debts are in ``ledger.stats``.
stats = {"publishes": 0, "keys_written": 0, "conflicts": 0, "errors": 0}


def flush(batch, alive=None):
    """Write a committed transaction's changes (its on_commit callback; never raises).  True if
    the write ran to its end: every key is written or recorded as a debt of the repair pass.
    False leaves the batch's outbox rows for the repair pass to write again.  ``alive()`` is
    called between chunks (the batch's outbox rows say their writer is still at work)."""
    if not batch:
        return True
    unrecorded = ledger.stats["unrecorded"]
    try:
        publish(batch, alive)
        if ledger.stats["unrecorded"] != unrecorded:
            raise RuntimeError("a failed write could not be recorded as a debt")
    except Exception:
        stats["errors"] += 1
        logger.exception("publishing %d change(s) failed; the repair pass writes them again "
                         "(its outbox rows stay)", len(batch))
        return False
    return True


def is_large(batch):
    """True if writing ``batch`` would rewrite the answers of more than ``FANOUT_IN_REQUEST``
    users, and it revokes nothing (a revocation's deletes are never postponed): users named
    outright are counted, audiences with one count on their relation's index each."""
    limit = conf.get_config()["FANOUT_IN_REQUEST"]
    users, wanted = set(), {}
    for change in batch:
        if change.dead_keys:
            return False
        users |= change.users
        for name, i in change.audiences:
            wanted.setdefault(name, set()).add(i)
    if len(users) > limit:
        return True
    return bool(wanted) and audiences.exceeds(wanted, limit)


def publish(batch, alive=None):
    """Write the answers for a batch of :class:`fastpoll.outbox.Change`."""
    stats["publishes"] += 1
    wanted = {}
    for change in batch:
        for name, i in change.audiences:
            wanted.setdefault(name, set()).add(i)
    members, epochs = audiences.expand(wanted) if wanted else ({}, {})
    every = resources.all_resources()
    by_resource = {resource.name: set() for resource in every}
    dead = set()
    for change in batch:
        affected = set(change.users)
        for reference in change.audiences:
            affected |= members.get(reference, set())
        for resource in every:
            if resource.per == "user":
                if change.resources is None or resource.name in change.resources:
                    by_resource[resource.name] |= affected
        for name, obj in change.objects:
            if name in by_resource:
                by_resource[name].add(obj)
        dead |= change.dead_keys
    if dead:
        delete_keys(sorted(dead))
    write_answers({name: ids for name, ids in by_resource.items() if ids}, epochs, alive)


# -- writing --------------------------------------------------------------------------------
def write_answers(by_resource, epochs=None, alive=None):
    """Write ``{resource name: user ids}``; returns the keys that could not be written.
    ``epochs``: {uid: epoch} already read after the commit (the others are read per chunk).

    Users go in chunks of ``BATCH_SIZE`` (the first a quarter of it, so that the first answers
    leave early), pipelined so that memcached answers one chunk while the database and Python
    work on another: a chunk's ``gets`` go out before the chunk ahead of it is computed, and a
    chunk's store replies are read once the next chunk's gets went out.  Each key still follows
    the write protocol in order (:func:`_write_keys`)."""
    objects = {name: ids for name, ids in by_resource.items() if _per(name) == "object"}
    by_resource = {name: ids for name, ids in by_resource.items() if name not in objects}
    write = _Write(get_cache(), epochs)
    _write_chunks(write, by_resource, alive)
    _write_chunks(write, objects, alive)
    stats["keys_written"] += len(write.written)
    _retire_revoked(write.written, write.epochs)
    return write.failed


def _per(name):
    resource = resources.get(name)
    return resource.per if resource is not None else "user"


def sorted_ids(ids):
    """``ids`` in a fixed order (sorted; by their text when they are of several types)."""
    try:
        return sorted(ids)
    except TypeError:                 # ids of several types: any fixed order will do
        return sorted(ids, key=str)


def _write_chunks(write, by_resource, alive):
    """:func:`write_answers` for resources of one kind (users or objects)."""
    users = sorted_ids(set().union(*by_resource.values())) if by_resource else []
    size = conf.get_config()["BATCH_SIZE"]
    starts = [0] + list(range(max(1, size // 4), len(users), size))
    chunks = ({name: uids & chunk for name, uids in by_resource.items() if uids & chunk}
              for chunk in (set(users[a:b]) for a, b in zip(starts, starts[1:] + [len(users)])) if chunk)
    ahead = write.begin(next(chunks, None))
    behind = None
    while ahead is not None:
        if alive is not None:
            alive()
        current = ahead
        uniques = _read_uniques(current, write.failed)
        _fire("write.after_gets", current.todo, 0)
        ahead = write.begin(next(chunks, None))          # its gets, while this chunk is computed
        if behind is not None:
            write.finish(behind)                         # its stores, answered meanwhile
        values = _compute_round(current.todo, write.failed, current.wanted)
        _fire("write.after_read", current.todo, 0)
        _send_stores(write.cache, current, uniques, values, write.failed)
        behind = current
    if behind is not None:
        write.finish(behind)


def _fire(name, key_set, attempt):
    """``_testhooks.fire(name)`` with ``key_set`` sorted, sorted only when a test set the hook:
    a fan-out would sort its 20,000 keys a few times per chunk for nobody."""
    if name in _testhooks._hooks:
        _testhooks.fire(name, keys=sorted(key_set), attempt=attempt)


class _Chunk:
    """One chunk of a write: ``todo`` {key: (resource name, uid)} still to store, and its
    batches in flight, {node: (Pending, keys)}; ``wanted`` {resource name: ids} of its keys
    as built (None: read from ``todo``)."""

    __slots__ = ("todo", "node_of", "gets", "stores", "wanted")

    def __init__(self, todo, node_of, wanted=None):
        self.todo, self.node_of, self.wanted = todo, node_of, wanted
        self.gets, self.stores = {}, {}


class _Write:
    """The state of one :func:`write_answers`: what was written, what failed, the epochs read."""

    def __init__(self, cache, epochs=None):
        self.cache = cache
        self.written = {}
        self.failed = set()
        self.epochs = {}
        self.known = epochs or {}

    def begin(self, by_resource):
        """Step 1 sent for a chunk ({resource name: uids}): ``gets`` of every key, per server."""
        if by_resource is None:
            return None
        todo, wanted = {}, {}
        users = {name: ids for name, ids in by_resource.items() if _per(name) == "user"}
        for name, ids in by_resource.items():
            if name not in users:
                ids = list(ids)
                todo.update(zip([keys.object_key(name, obj) for obj in ids], zip(repeat(name), ids)))
                wanted[name] = ids
        uids = set().union(*users.values()) if users else set()
        known = self.known
        epochs = {uid: known[uid] for uid in uids if uid in known}
        if len(epochs) < len(uids):
            epochs.update(db.epochs(uids - epochs.keys()))
        self.epochs.update(epochs)
        every = len(epochs) == len(uids)          # no user gone: no test per id
        for name, uids in users.items():
            # the keys of keys.answer_key, from a checked prefix and the ids and epochs the
            # database gave (no check per key): one comprehension, pairs zipped in C
            prefix = keys.key_prefix(name)
            ids = list(uids) if every else [uid for uid in uids if uid in epochs]
            todo.update(zip([f"{prefix}{uid}:{epochs[uid]:d}" for uid in ids], zip(repeat(name), ids)))
            wanted[name] = ids
        chunk = _Chunk(todo, self.cache.nodes_for(todo), wanted)
        _send_gets(self.cache, chunk, self.failed)
        return chunk

    def finish(self, chunk):
        """Step 3's replies; then step 4: the keys that conflicted go round again, one step at
        a time (:func:`_write_keys`)."""
        stored = _read_stores(chunk, self.failed)
        self.written.update(stored)
        _after_store(stored, ())
        _fire("write.after_store", self.written, 0)
        if chunk.todo:
            self.written.update(_write_keys(self.cache, chunk.todo, chunk.node_of, self.failed, first_attempt=1))


def _write_keys(cache, todo, node_of, failed, first_attempt=0):
    """Write ``todo`` {key: (resource name, uid)} with the write protocol of
    docs/consistency.md, one step at a time for every key; returns {key: (name, uid)} stored and
    adds to ``failed`` the keys that could not be.  For every key:

    1. ``gets`` the key's cas unique, or learn it is absent (:func:`_send_gets`, :func:`_read_uniques`);
    2. read the database and compute the answer (:func:`_compute_round`);
    3. ``cas`` with the unique from step 1, or ``add`` if the key was absent (:func:`_send_stores`, :func:`_read_stores`);
    4. on ``EXISTS`` / ``NOT_FOUND`` / ``NOT_STORED`` go back to 1 (up to ``CAS_ATTEMPTS``, then
       ``StaleKey``).

    :func:`write_answers` runs the first attempt of each chunk pipelined, then this for the keys
    that conflicted.  What was stored goes to :func:`_after_store`."""
    written = {}
    for attempt in range(first_attempt, conf.get_config()["CAS_ATTEMPTS"]):
        if not todo:
            break
        chunk = _Chunk(todo, node_of)
        _send_gets(cache, chunk, failed)
        uniques = _read_uniques(chunk, failed)
        _fire("write.after_gets", todo, attempt)
        values = _compute_round(todo, failed)
        _fire("write.after_read", todo, attempt)
        _send_stores(cache, chunk, uniques, values, failed)
        stored = _read_stores(chunk, failed)
        todo = chunk.todo
        written.update(stored)
        _after_store(stored, ())
        _fire("write.after_store", written, attempt)
    if todo:
        ledger.mark_stale(todo)
        failed.update(todo)
    return written


def _server_failed(node, todo, failed, key_list):
    """A server that failed is suspect (it may hold stale answers until the repair pass flushes
    it), and its keys are given up in this write: out of ``todo``, into ``failed``."""
    ledger.mark_suspect(node)
    _drop(todo, failed, key_list)


def _drop(todo, failed, key_list):
    """Give up on ``key_list`` in this write: out of ``todo``, into ``failed``."""
    for key in key_list:
        todo.pop(key, None)
    failed.update(key_list)


def _send_gets(cache, chunk, failed):
    """Step 1 sent: ``mg`` of every key of ``chunk``, per server."""
    for node, node_keys in cache.group(chunk.todo, chunk.node_of).items():
        try:
            chunk.gets[node] = (cache.request_uniques(node, node_keys), node_keys)
        except CacheUnavailable:
            _server_failed(node, chunk.todo, failed, node_keys)


def _read_uniques(chunk, failed):
    """Step 1's replies: {key: cas unique} of the keys present."""
    found = {}
    for node, (pending, node_keys) in chunk.gets.items():
        try:
            found.update(pending.result())
        except CacheUnavailable:
            _server_failed(node, chunk.todo, failed, node_keys)
    chunk.gets = {}
    return found


def _compute_round(todo, failed, wanted=None):
    """Step 2, after step 1: {resource name: {uid: body}} read from the database, for
    ``wanted`` {resource name: ids} (those of ``todo`` when None; a chunk's first round passes
    the ids its keys were built from).  A resource that raises has its keys marked stale (the
    others are still written)."""
    if wanted is None:
        wanted = {}
        for name, uid in todo.values():
            wanted.setdefault(name, set()).add(uid)
    values = {}
    with resources.computing():
        for name, uids in wanted.items():
            try:
                values[name] = resources.get(name).answers(sorted_ids(uids))
            except resources.ResourceError as exc:
                logger.error("%s; its %d key(s) are left to the repair pass", exc, len(uids))
                broken = [key for key, (n, _) in todo.items() if n == name]
                ledger.mark_stale(broken, why="its resource failed")
                _drop(todo, failed, broken)
            except Exception:
                logger.exception("computing poll resource %s failed", name)
                broken = [key for key, (n, _) in todo.items() if n == name]
                ledger.mark_stale(broken, why="its resource failed")
                _drop(todo, failed, broken)
    return values


def _store_ops(todo, node_of, values):
    """{node: ([key, ...], [value, ...])} of the keys to store: nothing for a user who is gone
    (its keys were queued for deletion)."""
    ops = {}
    last = node_keys = node_values = None
    for key, (name, uid) in todo.items():
        value = values[name].get(uid)
        if value is None:
            continue
        node = node_of[key]
        if node is not last:                 # one server: once per chunk
            last = node
            node_keys, node_values = ops.get(node) or ops.setdefault(node, ([], []))
        node_keys.append(key)
        node_values.append(value)
    return ops


def _send_stores(cache, chunk, uniques, values, failed):
    """Step 3 sent: ``cas`` with the unique read in step 1 of every key computed, ``add`` where
    the key was absent."""
    ttl = conf.get_config()["CACHE_TTL"]
    for node, (node_keys, node_values) in _store_ops(chunk.todo, chunk.node_of, values).items():
        try:
            chunk.stores[node] = (cache.request_cas_or_add(node, node_keys, node_values, uniques, ttl), node_keys)
        except CacheUnavailable:
            _server_failed(node, chunk.todo, failed, node_keys)


def _read_stores(chunk, failed):
    """Step 3's replies: returns {key: (name, uid)} stored, and leaves in ``chunk.todo`` only the
    keys that conflicted (step 4 sends them back to step 1).  A key with no store (its user is
    gone) leaves too."""
    stored, retry = {}, {}
    todo = chunk.todo
    for node, (pending, node_keys) in chunk.stores.items():
        try:
            replies = pending.result()
        except CacheUnavailable:
            _server_failed(node, todo, failed, node_keys)
            continue
        if replies.count(b"STORED") == len(replies):       # the usual case: every store took
            stored.update(zip(node_keys, map(todo.__getitem__, node_keys)))
            continue
        for key, reply in zip(node_keys, replies):
            (stored if reply == b"STORED" else retry)[key] = todo[key]
    chunk.stores = {}
    chunk.todo = retry
    stats["conflicts"] += len(retry)
    return stored


def _retire_revoked(written, epochs):
    """A key written for an epoch that was revoked meanwhile must not outlive the revocation:
    re-read the epochs after the stores and delete what they moved past."""
    if not written:
        return
    now = db.epochs(epochs)
    if now == epochs:                 # the usual case: none moved (one comparison in C)
        return
    moved = {uid for uid, epoch in epochs.items() if now.get(uid) != epoch}
    if moved:
        delete_keys([key for key, (name, uid) in written.items() if uid in moved and _per(name) == "user"])


def _after_store(stored, deleted):
    """The step after memcached confirmed: ``stored`` keys now hold new answers, ``deleted`` keys
    are gone.  Long-polling's notification belongs here (:data:`signals.answers_stored`)."""
    if stored or deleted:
        signals.answers_stored.send_robust(sender=None, keys=frozenset(stored),
                                           deleted=frozenset(deleted))


def delete_keys(key_list):
    """Delete ``key_list``; a server that fails is marked suspect (its keys may survive there)."""
    cache = get_cache()
    deleted = []
    for node, node_keys in cache.group(key_list).items():
        try:
            cache.delete_many(node, node_keys)
        except CacheUnavailable:
            ledger.mark_suspect(node)
        else:
            deleted.extend(node_keys)
    _after_store((), deleted)


def fill(key, value, uid=None, epoch=None):
    """The poll view's miss-fill: ``add`` (never overwrites a writer's value), then make sure the
    epoch it was computed for (a user's key or marker) is still current.  Returns True if stored."""
    cache = get_cache()
    node = cache.node_for(key)
    try:
        stored = cache.add(key, value, conf.get_config()["CACHE_TTL"])
    except CacheUnavailable as exc:
        if exc.attempted:          # the add may still land when the server wakes up
            ledger.mark_suspect(node)
        return False
    if stored:
        _after_store((key,), ())
        if uid is not None and not UserState.objects.filter(user_id=uid, epoch=epoch).exists():
            delete_keys([key])
    return stored
