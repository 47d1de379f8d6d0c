"""Long-polls through the whole stack when something fails (issue 14, "Tests"; docs/contract.md
section 7, docs/web.md):

- fastpath killed (workers and supervisor, SIGKILL) while polls are held: every held client gets
  Django's immediate answer through nginx, carries on short-polling, and is held again once
  fastpath is back;
- thousands of long-polls with fastpath down: Django answers each at once and the API stays quick
  (no gunicorn worker waits on a long-poll);
- memcached flushed or restarted, or the user logged out, while held: fastpath's 404/503 sends
  the poll to Django, which answers 304 (nothing changed) or 401, never a stale 200.

The stack here is not supervised: a test kills and restarts services itself.
"""
import asyncio
import random
import socket
import statistics
import time

import pytest

from fastpath.options import OPTIONS
from tests.support.longpoll import Poller, etag_of, fetch, metric, metrics, polling, wait_held
from tests.support.stack import manage

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not any(opt.flag == "--max-wait" for opt in OPTIONS),
                       reason="fastpath does not hold polls yet (no --max-wait)"),
]

MAX_WAIT_S = 30         # far above every bound below: an answer that waited for it is a failure
REREAD_S = 5            # fastpath's default --reread-interval: a flush is seen within it
SLACK_S = 10            # "promptly", on a shared machine


@pytest.fixture(scope="module")
def lp_stack(tmp_path_factory):
    from tests.support.stack import longpoll_stack

    with longpoll_stack(tmp_path_factory, "lpfail", MAX_WAIT_S, supervise=False) as running:
        yield running


def _start(svc):
    """Start ``svc`` from the main thread: a child dies with the thread that started it
    (PR_SET_PDEATHSIG is per thread), so never from asyncio.to_thread's workers."""
    svc.start()
    svc.wait_ready()


@pytest.fixture
def stack(lp_stack):
    """The module's stack with every service running again after a test that stopped one, and
    the debts that test left (a memcached that must be flushed before it is trusted again) paid
    now, as the repair service would within its interval: not during the next test's holds."""
    memcached = {svc.name: svc.pid for svc in lp_stack.services if svc.name.startswith("memcached")}
    yield lp_stack
    for svc in lp_stack.services:
        if not svc.alive():
            _start(svc)
    if any(svc.pid != memcached[svc.name] for svc in lp_stack.services if svc.name in memcached):
        # every gunicorn worker still holds a connection to the memcached that died: the first
        # write on each fails, marks the server suspect, and the next publish's quick repair
        # flushes it (correct, and every held poll then gets Django's 304).  In production that
        # happens once per restart; here it would land in the next test's holds, so restart
        # gunicorn's workers now, and pay the debt before the next test begins.
        gunicorn = lp_stack.service("gunicorn")
        gunicorn.stop()
        _start(gunicorn)
    manage(lp_stack.config, "repaircache")


def _followers(stack, readers):
    writer = stack.signup("writer")
    tokens = []
    for _ in range(readers):
        _, token = stack.signup("reader")
        stack.follow(token, writer[0])
        tokens.append(token)
    return writer[1], tokens


def _fastpath_etag(stack, token, resource="getUnreadCount"):
    """The ETag of the answer once fastpath has it (a miss is filled by Django)."""
    deadline = time.monotonic() + SLACK_S
    while time.monotonic() < deadline:
        resp = stack.poll(resource, token)
        if resp.headers.get("X-Cache") == "HIT" and resp.headers.get("ETag"):
            return resp.headers["ETag"]
        time.sleep(0.1)
    raise AssertionError(f"no fastpath answer with an ETag: {resp.status_code} {dict(resp.headers)}")


def _pollers(stack, tokens, per_token, short_s=2.0):
    return [Poller(stack.config.http, token, wait=MAX_WAIT_S, short_s=short_s, etag=_fastpath_etag(stack, token))
            for token in tokens for _ in range(per_token)]


def _seen(pollers):
    """How many answers and errors each poller has had so far: a mark for _answers_after."""
    return [(len(p.answers), len(p.errors)) for p in pollers]


def _after(poller, mark):
    """The poller's first answer after ``mark``, else its last error (a str), else None."""
    answers, errors = mark
    if len(poller.answers) > answers:
        return poller.answers[answers]
    return poller.errors[-1] if len(poller.errors) > errors else None


async def _answers_after(pollers, marks, timeout, stack=None):
    """The first answer (or error) each poller got after its mark; raise if any has none within
    ``timeout``."""
    deadline = time.monotonic() + timeout
    while any(_after(p, m) is None for p, m in zip(pollers, marks)):
        if time.monotonic() > deadline:
            late = sum(_after(p, m) is None for p, m in zip(pollers, marks))
            raise AssertionError(f"{late} of {len(pollers)} clients got no answer within {timeout}s"
                                 + (f"; fastpath: {metrics(stack.config)}" if stack else ""))
        await asyncio.sleep(0.05)
    return [_after(p, m) for p, m in zip(pollers, marks)]


async def _post_wakes_every_held_poll(stack, pollers, writer, content):
    """``writer`` posts a plurk: every poller's held poll is answered by fastpath (a held 200, a
    cache hit); their answers."""
    mark = _seen(pollers)
    resp = await asyncio.to_thread(stack.api, "POST", "/api/plurks", writer, json={"content": content})
    assert resp.status_code == 201, resp.text
    answers = await _answers_after(pollers, mark, SLACK_S, stack)
    assert all(not isinstance(a, str) and a.status == 200 and a.cache == "HIT" and a.held
               for a in answers), answers
    return answers


def _django_answer(answer):
    return answer.cache == "MISS" and not answer.held and answer.status in (200, 204, 304)


def test_fastpath_killed_while_held_gives_djangos_answers_then_holds_again(stack):
    writer, tokens = _followers(stack, 3)
    pollers = _pollers(stack, tokens, 10)
    fastpath = stack.service("fastpath")

    async def scenario():
        async with polling(pollers):
            await wait_held(stack.config, len(pollers))
            mark = _seen(pollers)
            await asyncio.sleep(1.0)
            assert _seen(pollers) == mark, "a poll was answered instead of held"
            killed = time.monotonic()
            await asyncio.to_thread(fastpath.kill)           # its supervisor and workers, SIGKILL
            answers = await _answers_after(pollers, mark, SLACK_S)
            assert all(not isinstance(a, str) for a in answers), answers
            assert all(_django_answer(a) and a.status == 304 for a in answers), answers
            assert all(a.ended - killed < SLACK_S for a in answers)
            # ... and they carry on: the next poll, after the short-poll interval, is Django's too
            answers = await _answers_after(pollers, [(answers + 1, errors) for answers, errors in mark], SLACK_S)
            assert all(not isinstance(a, str) and _django_answer(a) for a in answers), answers
            assert all(a.ended - a.began < SLACK_S for a in answers), "Django held a long-poll"
            _start(fastpath)
            # back: within a few short-poll rounds every client is held by fastpath again
            await wait_held(stack.config, len(pollers), timeout=SLACK_S + 4 * 2.0)
            assert all(not p.errors for p in pollers), [p.errors for p in pollers if p.errors]
            answers = await _post_wakes_every_held_poll(stack, pollers, writer, "back")
            assert all(a.body == b'{"count":1}' and a.etag == etag_of(a.body) for a in answers), answers

    asyncio.run(asyncio.wait_for(scenario(), 120))
    # no poll was a 5xx (nginx fell back to Django at once when fastpath died)
    assert all(a.status < 500 for p in pollers for a in p.answers)


def test_fastpath_restarted_by_the_runner_hands_its_held_polls_over(stack):
    """The planned restart (ActivatedFastpath.restart, what `systemctl restart plurk-fastpath`
    does with its socket unit): the old fastpath answers every held poll 304 and drains; the
    re-polls wait in the socket the runner keeps and are held by the new fastpath.  Nothing
    reaches Django, nothing is refused.  The clients run on a thread of their own: restart()
    must run on the main thread, since a child dies with the thread that started it."""
    import threading

    writer, tokens = _followers(stack, 3)
    pollers = _pollers(stack, tokens, 10)
    fastpath = stack.service("fastpath")
    held_long_enough, restarted = threading.Event(), threading.Event()

    async def scenario():
        async with polling(pollers):
            await wait_held(stack.config, len(pollers))
            await asyncio.sleep(1.5)        # held long enough that the page re-polls at once (QUICK_S)
            mark = _seen(pollers)
            held_long_enough.set()
            while not restarted.is_set():
                await asyncio.sleep(0.01)
            answers = await _answers_after(pollers, mark, SLACK_S)
            assert all(not isinstance(a, str) and a.status == 304 and a.held and a.cache != "MISS"
                       for a in answers), answers
            # every client is held again, by the new fastpath, without an answer in between
            await wait_held(stack.config, len(pollers), timeout=SLACK_S)
            await _post_wakes_every_held_poll(stack, pollers, writer, "after")

    failure = []

    def clients():
        try:
            asyncio.run(asyncio.wait_for(scenario(), 120))
        except BaseException as exc:        # re-raised on the main thread
            failure.append(exc)
            held_long_enough.set()

    thread = threading.Thread(target=clients, name="clients")
    thread.start()
    try:
        assert held_long_enough.wait(60), "the clients were never held"
        if not failure:
            old_pid = fastpath.pid
            fastpath.restart()
            fastpath.wait_ready()
            assert fastpath.pid != old_pid
    finally:
        restarted.set()
        thread.join(150)
    if failure:
        raise failure[0]
    assert all(not p.errors for p in pollers), [p.errors for p in pollers if p.errors]
    assert not any(_django_answer(a) for p in pollers for a in p.answers), "a poll reached Django"


CLIENTS = 2000
SPREAD_S = 40.0         # their first polls spread over this, as pages opened over time would be
SHORT_S = 60.0          # the page's short-poll interval (fastpoll.js POLL_MS, 2 s) stretched so that 2,000
                        # clients ask Django ~50 times a second: a rate two shared cores answer


def test_thousands_of_long_polls_with_fastpath_down_keep_gunicorn_free(stack):
    writer, tokens = _followers(stack, 4)
    etags = {token: _fastpath_etag(stack, token) for token in tokens}
    stack.service("fastpath").stop()
    # pages that long-polled fastpath: each asks with the ETag it holds, so each would be held
    pollers = [Poller(stack.config.http, token, wait=MAX_WAIT_S, short_s=SHORT_S, etag=etags[token])
               for token in tokens for _ in range(CLIENTS // len(tokens))]
    api_seconds = []

    async def scenario():
        async with polling(pollers, first_delay=lambda: random.uniform(0, SPREAD_S)):
            began = time.monotonic()
            while (time.monotonic() - began < SPREAD_S or not all(p.answers for p in pollers)) \
                    and time.monotonic() - began < SPREAD_S + SLACK_S:
                await asyncio.sleep(1.5)
                answer = await fetch(stack.config.http, "/api/me", {"Authorization": f"Bearer {writer}"})
                assert answer.status == 200, answer
                api_seconds.append(answer.ended - answer.began)

    asyncio.run(asyncio.wait_for(scenario(), 120))
    answers = [a for p in pollers for a in p.answers]
    assert all(not p.errors for p in pollers), [p.errors for p in pollers if p.errors][:5]
    assert all(p.answers for p in pollers), "a client was never answered"
    assert len(answers) >= CLIENTS
    assert all(_django_answer(a) for a in answers), [a for a in answers if not _django_answer(a)][:5]
    # Django answered each at once, 304: nothing changed
    assert max(a.ended - a.began for a in answers) < SLACK_S
    assert all(a.status == 304 and a.etag == etags[p.token] for p in pollers for a in p.answers)
    assert statistics.median(api_seconds) < 1.0, api_seconds
    assert max(api_seconds) < 3.0, api_seconds


def _flush(stack):
    (host, port), = stack.local_memcached()
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(b"flush_all\r\n")
        assert sock.recv(64) == b"OK\r\n"


def _restart_memcached(stack):
    (host, port), = stack.local_memcached()
    svc = stack.service(f"memcached:{host}:{port}")
    svc.kill()
    _start(svc)


@pytest.mark.parametrize("fault", ["flush", "restart"])
def test_memcached_emptied_while_held_gives_djangos_answer_never_a_stale_200(stack, fault):
    _, tokens = _followers(stack, 2)
    pollers = _pollers(stack, tokens, 5)
    held_etags = [p.etag for p in pollers]

    async def scenario():
        async with polling(pollers):
            await wait_held(stack.config, len(pollers))
            mark, emptied = _seen(pollers), time.monotonic()
            (_flush if fault == "flush" else _restart_memcached)(stack)
            answers = await _answers_after(pollers, mark, REREAD_S + SLACK_S, stack)
            assert all(not isinstance(a, str) for a in answers), answers
            # 404 (or 503) from fastpath, so nginx asked Django: nothing changed, so a 304
            assert all(_django_answer(a) and a.status == 304 for a in answers), answers
            assert [a.etag for a in answers] == held_etags
            assert all(a.ended - emptied < REREAD_S + SLACK_S for a in answers)

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_logout_while_held_gives_401_and_the_others_stay_held(stack):
    _, tokens = _followers(stack, 2)
    pollers = _pollers(stack, tokens, 5)
    out, stays = pollers[:5], pollers[5:]
    logged_out = []

    async def scenario():
        async with polling(pollers):
            await wait_held(stack.config, len(pollers))
            mark, stays_mark = _seen(out), _seen(stays)
            logged_out.append(time.monotonic())
            resp = await asyncio.to_thread(stack.api, "POST", "/api/logout", tokens[0])
            assert resp.status_code in (200, 204), resp.text
            answers = await _answers_after(out, mark, SLACK_S, stack)
            assert all(not isinstance(a, str) and a.status == 401 and not a.held for a in answers), answers
            assert all(a.ended - logged_out[0] < SLACK_S for a in answers)
            ended = [(a.status, a.cache, a.held, a.etag, round(a.ended - logged_out[0], 3))
                     for p, (n, _) in zip(stays, stays_mark) for a in p.answers[n:]]
            assert _seen(stays) == stays_mark, (
                f"another user's hold was ended (status, cache, held, etag, ended after logout): {ended};"
                f" held with {[p.etag for p in stays]}; {[e for p in stays for e in p.errors]}")
            assert await asyncio.to_thread(metric, stack.config, "fastpath_held_polls") == len(stays)

    asyncio.run(asyncio.wait_for(scenario(), 120))
    # every answer since the logout (a poll sent before the test's first hold may have been a
    # miss that Django answered 304, the token still valid then: that one is not counted)
    late = [(a.status, a.cache, a.held, round(a.began - logged_out[0], 3)) for p in out for a in p.answers
            if a.ended > logged_out[0] and a.status != 401]
    assert not late, f"the revoked token's polls were answered otherwise (status, cache, held, began): {late}"

