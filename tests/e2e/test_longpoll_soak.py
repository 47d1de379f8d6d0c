"""A long-poll soak through the whole stack (issue 14, "Tests"): 300 clients long-poll through nginx,
each by the page's rule (tests/support/longpoll.Poller), while random changes are committed
through the API (plurks, responses, follows, unfollows, mark-read).  The oracle: once the changes
stop, every client's last ETag equals the ETag of the answer Django computes from the database
(its poll view on its own port, which always reads the database) -- no wake lost, no stale answer
kept, whatever the interleaving of stores, notices and holds.
"""
import asyncio
import random
import time

import pytest
import requests

from fastpath.options import OPTIONS
from tests.support.longpoll import Poller, etag_of, metrics, polling

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not any(opt.flag == "--max-wait" for opt in OPTIONS),
                       reason="fastpath does not hold polls yet (no --max-wait)"),
]

USERS = 20
CLIENTS_PER_USER = 15           # 300 clients
RESOURCES = ("getUnreadCount", "getMessages")
MAX_WAIT_S = 12                 # holds also end in 304s and are renewed during the soak
SOAK_S = 30
WRITERS = 3                     # concurrent API clients making changes
REREAD_S = 5                    # fastpath's default --reread-interval
SLACK_S = 10


@pytest.fixture(scope="module")
def soak_stack(tmp_path_factory):
    from tests.support.stack import longpoll_stack

    with longpoll_stack(tmp_path_factory, "lpsoak", MAX_WAIT_S) as running:
        yield running


class World:
    """The users and what the changers know of them (plurk ids), with every API answer checked."""

    def __init__(self, stack, rng):
        self.stack, self.rng = stack, rng
        self.users = [stack.signup("soak") for _ in range(USERS)]
        self.plurks = []
        self.changes = 0

    def _api(self, method, path, token, ok, **kwargs):
        resp = self.stack.api(method, path, token, **kwargs)
        assert resp.status_code in ok, f"{method} {path}: {resp.status_code} {resp.text}"
        self.changes += 1
        return resp

    def follow(self, follower, target):
        self._api("POST", "/api/follow", follower[1], (200, 201), json={"username": target[0]})

    def change(self):
        rng = self.rng
        user, other = rng.sample(self.users, 2)
        action = rng.choice(("plurk", "plurk", "respond", "follow", "unfollow", "read"))
        if action == "plurk" or (action == "respond" and not self.plurks):
            resp = self._api("POST", "/api/plurks", user[1], (201,), json={"content": f"soak {rng.random()}"})
            self.plurks.append(resp.json()["id"])
        elif action == "respond":
            self._api("POST", f"/api/plurks/{rng.choice(self.plurks)}/responses", user[1], (201,),
                      json={"content": f"re {rng.random()}"})
        elif action == "follow":
            self.follow(user, other)
        elif action == "unfollow":
            self._api("DELETE", f"/api/follow/{other[0]}", user[1], (200, 204, 404))
        else:
            upto = rng.choice(self.plurks) if self.plurks and rng.random() < 0.7 else 2**40
            self._api("POST", "/api/markRead", user[1], (200,), json={"upto": upto})


def _django_etag(stack, token, resource):
    """The ETag of the answer Django computes from the database, asked on its own port."""
    resp = requests.get(f"{stack.django_url}/Poll/{resource}", headers={"Authorization": f"Bearer {token}"},
                        timeout=10)
    assert resp.status_code in (200, 204), resp.text
    assert resp.headers["ETag"] == etag_of(resp.content)
    return resp.headers["ETag"]


def _fastpath_etag(stack, token, resource):
    """What fastpath answers now without waiting (memcached's bytes), for failure messages."""
    resp = requests.get(f"{stack.fastpath_url}/Poll/{resource}", headers={"Authorization": f"Bearer {token}"},
                        timeout=10)
    return resp.status_code, resp.headers.get("ETag")


def _explain(stack, poller, want):
    return (poller.resource, poller.etag, want, _fastpath_etag(stack, poller.token, poller.resource),
            poller.answers[-3:])


def _stale(stack, pollers):
    """The pollers whose last ETag is not the one Django computes now."""
    oracle = {}
    stale = []
    for p in pollers:
        key = (p.token, p.resource)
        if key not in oracle:
            oracle[key] = _django_etag(stack, *key)
        if p.etag != oracle[key]:
            stale.append((p, oracle[key]))
    return stale


def test_after_a_soak_of_random_changes_every_client_holds_djangos_etag(soak_stack):
    stack = soak_stack
    rng = random.Random()
    world = World(stack, rng)
    for user in world.users:                    # a start: everyone follows a few others
        for other in rng.sample([u for u in world.users if u is not user], 4):
            world.follow(user, other)
    pollers = [Poller(stack.config.http, token, resource=RESOURCES[i % len(RESOURCES)], wait=MAX_WAIT_S)
               for _, token in world.users for i in range(CLIENTS_PER_USER)]

    async def changer(stop):
        while not stop.is_set():
            await asyncio.to_thread(world.change)
            await asyncio.sleep(rng.uniform(0, 0.2))

    async def scenario():
        # the changers stop after SOAK_S; the pollers only once the oracle is done (stopping both
        # together left a client whose last poll ended just before the last change never asking
        # again: stale in the test, not in fastpath)
        stop = asyncio.Event()
        async with polling(pollers, first_delay=lambda: rng.uniform(0, 2)):
            try:
                await asyncio.sleep(3)              # every client has its first answer and is held
                changers = [asyncio.create_task(changer(stop)) for _ in range(WRITERS)]
                await asyncio.sleep(SOAK_S)
            finally:
                stop.set()
            await asyncio.gather(*changers)         # the last change is committed
            # quiescence: every held client is woken (notice, or re-read) and holds again
            deadline = time.monotonic() + REREAD_S + SLACK_S
            while (stale := await asyncio.to_thread(_stale, stack, pollers)) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            return stale

    stale = asyncio.run(asyncio.wait_for(scenario(), SOAK_S + 120))
    assert world.changes > 3 * SOAK_S, f"only {world.changes} changes were made"
    assert not stale, (f"{len(stale)} of {len(pollers)} clients hold a stale ETag; fastpath: "
                       f"{metrics(stack.config)}; (resource, client's ETag, Django's, fastpath's now, "
                       f"last answers): {[_explain(stack, p, want) for p, want in stale[:3]]}")
    assert all(not p.errors for p in pollers), [p.errors for p in pollers if p.errors][:5]
    answers = [a for p in pollers for a in p.answers]
    assert all(a.status in (200, 204, 304) for a in answers), [a for a in answers if a.status >= 300 and
                                                                a.status != 304][:5]
    # the holds were fastpath's: most answers were held ones, and every 200/204 carried its body's ETag
    assert sum(a.held for a in answers) > len(answers) // 2
    assert all(a.etag == etag_of(a.body) for a in answers if a.status in (200, 204))
