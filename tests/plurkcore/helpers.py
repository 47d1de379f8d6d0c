"""Helpers for plurkcore's tests: direct looks at memcached and the database's truth."""
import contextlib
import time
from fastpoll import resources as fastpoll_resources

from django.db import connection
from pymemcache.client.base import Client

from fastpoll import keys
from plurkcore import answers
from fastpoll.cache import BytesSerde, get_cache, parse_server
from fastpoll.models import UserState


def server_client(spec, timeout=2):
    return Client(parse_server(spec), serde=BytesSerde(), connect_timeout=timeout, timeout=timeout,
                  default_noreply=False)


def key_of(resource, uid):
    return keys.answer_key(resource, uid, UserState.objects.get(user_id=uid).epoch)


def cached(resource, uid, servers, epoch=None):
    """The value of ``uid``'s key (at its current epoch, or ``epoch``), read from the server that
    fastpath would ask (None: miss)."""
    key = key_of(resource, uid) if epoch is None else keys.answer_key(resource, uid, epoch)
    node = get_cache().node_for(key)
    spec = next(s.spec for s in servers if s.spec == node or f"{s.host}:{s.port}" == node)
    client = server_client(spec)
    try:
        return client.get(key)
    finally:
        client.close()


def truth(resource, uid):
    return fastpoll_resources.get(resource).compute([uid]).get(uid)


def assert_consistent(uids, servers, resources=("getUnreadCount", "getMessages"), require=False):
    """Every cached answer of ``uids`` equals the database's (a miss is fine unless ``require``)."""
    for uid in uids:
        for resource in resources:
            value = cached(resource, uid, servers)
            if value is None and not require:
                continue
            assert value == truth(resource, uid), (resource, uid, value, truth(resource, uid))


@contextlib.contextmanager
def elapsed_below(seconds):
    start = time.monotonic()
    yield
    took = time.monotonic() - start
    assert took < seconds, f"took {took:.3f}s, limit {seconds}s"


def sqlite_steps(func):
    """SQLite virtual-machine instructions (in hundreds) that ``func`` runs: a deterministic cost."""
    steps = [0]

    def tick():
        steps[0] += 1
        return 0
    connection.ensure_connection()
    connection.connection.set_progress_handler(tick, 100)
    try:
        func()
    finally:
        connection.connection.set_progress_handler(None, 100)
    return steps[0]
