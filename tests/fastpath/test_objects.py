"""Per-object polls (docs/contract.md, section 8): GET /Poll/<resource>/<object>?cap=<capability>
with the user's token, served from the object's key only while the user's epoch marker is there."""
import time

import pytest
import requests
from pymemcache.client.base import Client

import fastpath._server  # noqa: F401  (a build that does not import fails here, never skips)
from fastpoll import tokens
from tests.fastpath.conftest import SECRET, token
from tests.fastpath.test_longpoll import Notifier, Poll, etag, held, metric

UUID = "3f2a9c1e-7b4d-4e8a-9c0f-5d6e7f8a9b0c"


def cap(resource, obj, uid, ttl=3600, key=SECRET):
    return tokens.sign_capability(key, resource, obj, uid, int(time.time()) + ttl)


def object_key(resource, obj, prefix="p1"):
    return f"{prefix}:{resource}:{obj}:o"


def marker_key(uid, epoch=0, prefix="p1"):
    return f"{prefix}:@:{uid}:{epoch}"


def ask(fp, path, uid, epoch=0, tag=None, wait=None):
    """One raw poll of path (after /Poll/) as uid: (status, headers, body)."""
    poll = Poll(fp, uid, tag, wait, resource=path, epoch=epoch)
    try:
        return poll.answer()
    finally:
        poll.close()


@pytest.fixture
def cache(memcached):
    client = Client(memcached.spec, default_noreply=False)
    yield client
    client.close()


@pytest.fixture
def fp(fastpath_factory, memcached, tmp_path):
    return fastpath_factory([memcached], extra=("--object-resources", "thread,room", "--reread-interval", "60",
                                                "--timeout-ms", "2000", "--notify-dir", str(tmp_path / "notify")))


@pytest.mark.parametrize("uid, obj", [(42, "t-1"), (UUID, UUID), ("u" * 64, "o" * 64)])
def test_object_hit_with_marker(fp, cache, uid, obj):
    cache.set(marker_key(uid), b"")
    cache.set(object_key("thread", obj), b'{"thread":1}')
    status, headers, body = ask(fp, f"thread/{obj}?cap={cap('thread', obj, uid)}", uid)
    assert (status, body, headers["x-cache"]) == (200, b'{"thread":1}', "HIT")
    assert headers["etag"] == etag(b'{"thread":1}')
    # many users read the same key, each with its own capability and marker
    cache.set(marker_key(7, 3), b"")
    status, _, body = ask(fp, f"thread/{obj}?x=1&cap={cap('thread', obj, 7)}&y", 7, epoch=3)
    assert (status, body) == (200, b'{"thread":1}')


def test_empty_object_value_is_204(fp, cache):
    cache.set(marker_key(42), b"")
    cache.set(object_key("room", "r1"), b"")
    assert ask(fp, f"room/r1?cap={cap('room', 'r1', 42)}", 42)[0] == 204


@pytest.mark.parametrize("marker", [None, b"x"], ids=["missing", "not empty"])
def test_no_marker_is_django_s(fp, cache, marker):
    """The marker is how a revoked epoch reaches object polls: without it, 404 MISS."""
    if marker is not None:
        cache.set(marker_key(42), marker)
    cache.set(object_key("thread", "t-1"), b'{"thread":1}')
    status, headers, body = ask(fp, f"thread/t-1?cap={cap('thread', 't-1', 42)}", 42)
    assert (status, headers["x-cache"]) == (404, "MISS") and b"thread" not in body
    # the marker of another epoch is not this token's
    cache.set(marker_key(42, 1), b"")
    assert ask(fp, f"thread/t-1?cap={cap('thread', 't-1', 42)}", 42)[0] == 404


def test_missing_object_is_django_s(fp, cache):
    cache.set(marker_key(42), b"")
    status, headers, _ = ask(fp, f"thread/t-1?cap={cap('thread', 't-1', 42)}", 42)
    assert (status, headers["x-cache"]) == (404, "MISS")


@pytest.mark.parametrize("query, why", [
    ("", "no capability"),
    ("?cap=", "empty capability"),
    ("?cap={other_obj}", "another object's capability"),
    ("?cap={other_res}", "another resource's capability"),
    ("?cap={other_uid}", "another user's capability"),
    ("?cap={expired}", "expired"),
    ("?cap={forged}", "forged"),
    ("?cap={good}&cap={good}", "repeated"),
    ("?cap={good}%20", "percent-encoded: Django decodes it"),
    ("?cap={token}", "a token is no capability"),
])
def test_capability_refused_is_django_s_never_another_objects_data(fp, cache, query, why):
    cache.set(marker_key(42), b"")
    cache.set(object_key("thread", "t-1"), b'{"thread":1}')
    cache.set(object_key("thread", "t-2"), b'{"thread":2}')
    cache.set(object_key("room", "t-1"), b'{"room":1}')
    query = query.format(good=cap("thread", "t-1", 42), other_obj=cap("thread", "t-2", 42),
                         other_res=cap("room", "t-1", 42), other_uid=cap("thread", "t-1", 43),
                         expired=cap("thread", "t-1", 42, ttl=-1), forged=cap("thread", "t-1", 42, key=b"k" * 64),
                         token=token(42))
    status, headers, body = ask(fp, f"thread/t-1{query}", 42)
    assert (status, headers["x-cache"]) == (404, "MISS"), why
    assert b"thread" not in body and b"room" not in body


def test_paths_that_name_no_object_poll(fp, cache):
    cache.set(marker_key(42), b"")
    cache.set(object_key("getMessages", "t-1"), b'{"user resource":1}')
    cache.set(object_key("thread", "a:b"), b'{"bad":1}')
    for path in [f"getMessages/t-1?cap={cap('getMessages', 't-1', 42)}",    # a user resource
                 f"thread?cap={cap('thread', 't-1', 42)}",                 # no object
                 f"thread/?cap={cap('thread', 't-1', 42)}",
                 f"thread/t-1/x?cap={cap('thread', 't-1', 42)}",
                 f"thread/a:b?cap={cap('thread', 't-1', 42)}",
                 f"thread/{'o' * 65}?cap={cap('thread', 't-1', 42)}"]:
        status, headers, _ = ask(fp, path, 42)
        assert (status, headers["x-cache"]) == (404, "MISS"), path


def test_bad_token_is_401_as_for_user_polls(fp, cache):
    cache.set(object_key("thread", "t-1"), b'{"thread":1}')
    resp = requests.get(f"{fp.url}/Poll/thread/t-1?cap={cap('thread', 't-1', 42)}", timeout=5,
                        headers={"Authorization": f"Bearer {tokens.sign(b'k' * 64, 42, 0, 2**40)}"})
    assert resp.status_code == 401 and resp.json() == {"error": "bad signature"}


def test_if_none_match_is_304(fp, cache):
    cache.set(marker_key(42), b"")
    cache.set(object_key("thread", "t-1"), b'{"thread":1}')
    status, headers, _ = ask(fp, f"thread/t-1?cap={cap('thread', 't-1', 42)}", 42, tag=etag(b'{"thread":1}'))
    assert (status, headers["etag"], headers["x-cache"]) == (304, etag(b'{"thread":1}'), "HIT")


def test_held_object_poll_is_woken_by_the_object_key_notice(fp, cache, tmp_path):
    notifier = Notifier(tmp_path / "notify")
    cache.set(marker_key(42), b"")
    cache.set(marker_key(43), b"")
    cache.set(object_key("thread", "t-1"), b'{"n":1}')
    polls = [Poll(fp, uid, etag(b'{"n":1}'), 50, resource=f"thread/t-1?cap={cap('thread', 't-1', uid)}")
             for uid in (42, 43)]
    held(fp, 2)                      # two polls (each waits on the object and its marker: one hold)
    cache.set(object_key("thread", "t-1"), b'{"n":2}')
    notifier.send([object_key("thread", "t-1")])
    for poll in polls:
        status, headers, body = poll.answer()
        assert (status, body, headers["preference-applied"]) == (200, b'{"n":2}', "wait=50")
        poll.close()
    held(fp, 0)


def test_revoked_epoch_ends_a_held_object_poll(fp, cache, tmp_path):
    """Django deletes the marker when it revokes the epoch (and notices it): the hold ends in a
    404 MISS at once, and the object's later answers never reach that token."""
    notifier = Notifier(tmp_path / "notify")
    cache.set(marker_key(42), b"")
    cache.set(object_key("thread", "t-1"), b'{"n":1}')
    poll = Poll(fp, 42, etag(b'{"n":1}'), 50, resource=f"thread/t-1?cap={cap('thread', 't-1', 42)}")
    held(fp, 1)
    assert metric(fp, "fastpath_holds_total") == 1
    cache.delete(marker_key(42))
    notifier.send([marker_key(42)])
    status, headers, body = poll.answer()
    assert (status, headers["x-cache"]) == (404, "MISS")
    poll.close()
    held(fp, 0)
    cache.set(object_key("thread", "t-1"), b'{"n":2}')
    assert ask(fp, f"thread/t-1?cap={cap('thread', 't-1', 42)}", 42)[0] == 404


def test_held_object_poll_times_out_with_304(fastpath_factory, memcached, cache):
    fp = fastpath_factory([memcached], extra=("--object-resources", "thread", "--max-wait", "1"))
    cache.set(marker_key(42), b"")
    cache.set(object_key("thread", "t-1"), b'{"n":1}')
    status, headers, _ = ask(fp, f"thread/t-1?cap={cap('thread', 't-1', 42)}", 42, tag=etag(b'{"n":1}'), wait=5)
    assert (status, headers["etag"], headers["preference-applied"]) == (304, etag(b'{"n":1}'), "wait=1")
    assert metric(fp, "fastpath_held_polls") == 0


def test_custom_names_for_object_polls(fastpath_factory, memcached, cache):
    fp = fastpath_factory([memcached], extra=("--object-resources", "thread", "--key-prefix", "fp-2",
                                              "--path-prefix", "/api/poll/"))
    cache.set(marker_key(42, prefix="fp-2"), b"")
    cache.set(object_key("thread", "t-1", prefix="fp-2"), b'{"custom":1}')
    resp = requests.get(f"{fp.url}/api/poll/thread/t-1?cap={cap('thread', 't-1', 42)}", timeout=5,
                        headers={"Authorization": f"Bearer {token(42)}"})
    assert resp.status_code == 200 and resp.content == b'{"custom":1}'


def test_object_resources_alone_serve_without_per_user_ones(fastpath_factory, memcached, cache):
    """--resources has no default: a fastpath of --object-resources alone serves its objects and
    leaves every per-user poll to Django (404 MISS)."""
    fp = fastpath_factory([memcached], extra=("--object-resources", "thread"), resources=None)
    assert "--resources" not in fp.argv
    cache.set(marker_key(42), b"")
    cache.set(object_key("thread", "t-1"), b'{"thread":1}')
    cache.set("p1:getMessages:42:0", b'{"mine":1}')
    status, headers, body = ask(fp, f"thread/t-1?cap={cap('thread', 't-1', 42)}", 42)
    assert (status, body, headers["x-cache"]) == (200, b'{"thread":1}', "HIT")
    status, headers, body = ask(fp, "getMessages", 42)
    assert (status, headers["x-cache"]) == (404, "MISS") and b"mine" not in body
