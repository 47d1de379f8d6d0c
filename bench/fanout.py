"""Fan-out benchmark: one plurk by a user with N followers; time from the commit until every
follower's poll answers (getUnreadCount and getMessages) are written to memcached.

    .venv/bin/python bench/fanout.py [--followers 1000,10000] [--servers 1,3] [--backends sqlite,postgresql]
                                     [--rounds 3] [--history 0,1000] [--backlog 1000]

Each backend runs in a child process (Django settings are per process) against a fresh database
(a temporary SQLite file; a throwaway PostgreSQL cluster from tests/support/postgres.py) and fresh
memcached servers.  "cold": the followers' keys are absent (add); "warm": they hold an answer
already (gets + cas), the steady state of users who poll.  Each count runs ``--rounds`` times, a
new author with new followers each, and the median round is reported (one run moved by +-30%
here).  ``--history``: the author wrote that many older plurks, each answered, which the followers
have read: the cost must follow what is new, not the author's past.  ``--backlog``: each follower
also follows another author, whose that many plurks it has not read (a follower who stays away;
run without a history): the count is exact, so it is counted in the database over an index, and
only each source's newest 50 are read.  The child freezes what Django loaded before it measures,
as gunicorn's workers do (plurksite/wsgi.py).  Results: bench/results/fanout.json.
Goal: 10,000 followers in under one second.
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import progress, write_result  # noqa: E402


def child(args):
    """Runs inside a configured environment (PLURK_* set by the parent)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "plurksite.settings"
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection, transaction

    from fastpoll import publish
    from fastpoll.cache import get_cache
    from fastpoll.models import UserState
    from plurkcore.models import Follow, Plurk, ReadCursor

    call_command("migrate", verbosity=0)
    # time the writer itself, in the committing thread, whatever the fan-out's size (above
    # FANOUT_IN_REQUEST the request would hand it to the background writer and answer at once)
    set_fanout_in_request(ALWAYS_IN_REQUEST)
    gc.collect()
    gc.freeze()                      # as plurksite/wsgi.py does in gunicorn's workers
    User = get_user_model()
    results = []
    pasts = [(int(h), 0) for h in str(args.history).split(",")] + \
        [(0, int(b)) for b in str(args.backlog).split(",") if b and int(b)]
    for (h, b), n, r in [(p, int(x), r) for p in pasts for x in args.followers.split(",") for r in range(args.rounds)]:
        tag = f"h{h}b{b}n{n}r{r}t{int(time.time() * 1000)}"
        author = User.objects.create_user(f"{tag}author", password=None)
        followers = User.objects.bulk_create([User(username=f"{tag}f{i}", password="!") for i in range(n)],
                                             batch_size=2000)
        if not followers[0].pk:          # backends without RETURNING on bulk_create
            followers = list(User.objects.filter(username__startswith=f"{tag}f"))
        history_upto = make_history(author, followers, h)
        ReadCursor.objects.bulk_create([ReadCursor(user=u, read_upto=history_upto) for u in followers],
                                       batch_size=2000)
        UserState.objects.bulk_create([UserState(user=u) for u in followers], batch_size=2000)
        Follow.objects.bulk_create([Follow(follower=u, followee=author) for u in followers], batch_size=2000)
        make_backlog(User.objects.create_user(f"{tag}distant", password=None), followers, b)
        if not b:
            plain = (author, followers)           # the hand-off below is timed without a backlog
        cache = get_cache()
        for phase in ("cold", "warm"):
            marks = {}
            with transaction.atomic():
                transaction.on_commit(lambda: marks.setdefault("commit", time.perf_counter()))
                Plurk.objects.create(author=author, content=f"{phase} plurk to {n} followers")
            done = time.perf_counter()
            seconds = done - marks["commit"]
            expected = b'{"count":%d}' % (b + (1 if phase == "cold" else 2))
            want = count_keys(followers)
            got = cached(cache, want)
            ok = sum(1 for k in want if got.get(k) == expected)
            results.append({"followers": n, "history": h, "backlog": b, "round": r, "phase": phase,
                            "seconds": round(seconds, 4),
                            "keys_written": 2 * n, "verified_followers": ok,
                            "keys_per_second": round(2 * n / seconds)})
            progress(f"{connection.vendor} servers={args.server_count} n={n} history={h} backlog={b} {phase}: "
                     f"{seconds * 1000:.0f} ms, "
                     f"{ok}/{n} verified")
    handed = handed_off(*plain, 3)
    progress(f"{connection.vendor} servers={args.server_count} n={len(followers)} handed to the background writer: "
             f"request {handed['request_ms']:.1f} ms, every follower written after {handed['written_ms']:.0f} ms")
    writes = small_writes(followers[:WRITES])
    progress(f"{connection.vendor} servers={args.server_count} {WRITES} one-user writes: "
             f"{writes['ms_per_write']:.2f} ms each, {writes['ms_per_write_without_outbox']:.2f} ms without the outbox")
    print(json.dumps({"vendor": connection.vendor, "results": results, "writes": writes, "handed_off": handed,
                      "publish_stats": publish.stats}))


#: a FANOUT_IN_REQUEST no fan-out here reaches: the writer runs in the committing thread
ALWAYS_IN_REQUEST = 10**9


def set_fanout_in_request(limit):
    from django.conf import settings

    from fastpoll import conf

    settings.FASTPOLL = dict(settings.FASTPOLL, FANOUT_IN_REQUEST=limit)
    conf.reset()


def count_keys(followers):
    """The followers' getUnreadCount keys (epoch 0: the bench never revokes)."""
    from fastpoll import keys

    return [keys.answer_key("getUnreadCount", u.pk, 0) for u in followers]


def cached(cache, key_list):
    """{key: value} of the keys present, read from the server each maps to."""
    found = {}
    for node, node_keys in cache.group(key_list).items():
        found.update(cache.get_many(node, node_keys))
    return found


def handed_off(author, followers, rounds):
    """A post whose fan-out is above ``FANOUT_IN_REQUEST`` (set to half the followers here): ms
    the committing transaction takes (the poster's wait) and ms until the background writer has
    written every follower; medians of ``rounds`` posts by the last round's author."""
    import statistics

    from django.db import transaction

    from fastpoll import background
    from fastpoll.cache import get_cache
    from fastpoll.models import PendingChange
    from plurkcore.models import Plurk

    set_fanout_in_request(max(1, len(followers) // 2))
    cache = get_cache()
    request_ms, written_ms, verified = [], [], []
    try:
        for r in range(rounds):
            before = cached(cache, count_keys(followers))
            start = time.perf_counter()
            with transaction.atomic():
                Plurk.objects.create(author=author, content=f"handed off {r}")
            request_ms.append((time.perf_counter() - start) * 1000)
            background.wait()
            written_ms.append((time.perf_counter() - start) * 1000)
            after = cached(cache, list(before))
            verified.append(sum(1 for k, v in after.items() if v != before[k]))
        assert not PendingChange.objects.exists(), "the background writer left its outbox rows"
    finally:
        set_fanout_in_request(ALWAYS_IN_REQUEST)
    return {"followers": len(followers), "fanout_in_request": max(1, len(followers) // 2), "rounds": rounds,
            "request_ms": round(statistics.median(request_ms), 2), "written_ms": round(statistics.median(written_ms), 1),
            "changed_followers": min(verified)}


def make_history(author, followers, count):
    """``count`` older plurks by ``author``, each with one response by a follower, all read by the
    followers (the id returned is their read cursor): an author with a past.  A fan-out's cost
    must follow what is new, not how much the author wrote before."""
    from plurkcore.models import Plurk

    if not count:
        return 0
    plurks = Plurk.entries.bulk_create([Plurk(author=author, content=f"old {i}") for i in range(count)],
                                       batch_size=2000)
    if not plurks[0].pk:
        plurks = list(Plurk.entries.filter(author=author).order_by("id"))
    responses = Plurk.entries.bulk_create(
        [Plurk(author=followers[i % len(followers)], parent=p, content="re") for i, p in enumerate(plurks)],
        batch_size=2000)
    last = responses[-1].pk or Plurk.entries.order_by("-id").values_list("id", flat=True)[0]
    return last


def make_backlog(distant, followers, count):
    """``count`` plurks by ``distant``, whom every follower follows and none has read: followers
    who stay away (the page marks read only what it showed).  A fan-out's cost must follow a
    follower's sources, not how much it left unread."""
    from plurkcore.models import Follow, Plurk

    if not count:
        return
    Follow.objects.bulk_create([Follow(follower=u, followee=distant) for u in followers], batch_size=2000)
    Plurk.entries.bulk_create([Plurk(author=distant, content=f"unread {i}") for i in range(count)], batch_size=2000)


#: one-user transactions timed by :func:`small_writes`
WRITES = 300


def small_writes(users, rounds=3):
    """The outbox's cost where it weighs most, on the smallest write: a transaction that moves one
    user's read cursor, committed, and its writer's two keys written.  Timed with the outbox (its
    row inserted in the transaction, deleted after the stores) and without it (the bench swaps
    the batch's outbox steps for nothing), in interleaved rounds; medians of the rounds."""
    import statistics

    from django.db import transaction
    from django.db.models import F

    import fastpoll
    from fastpoll import changes, outbox
    from fastpoll.models import PendingChange
    from plurkcore.models import ReadCursor

    def timed(chunk):
        start = time.perf_counter()
        for user in chunk:
            with transaction.atomic():
                ReadCursor.objects.filter(user=user).update(read_upto=F("read_upto") + 1)
                fastpoll.touch(None, users=[user.pk])
        return (time.perf_counter() - start) * 1000 / len(chunk)

    real_add, real_forget = changes._Batch.add, outbox.forget
    with_ms, without_ms = [], []
    size = max(1, len(users) // rounds)
    for r in range(rounds):
        chunk = users[r * size:(r + 1) * size]
        with_ms.append(timed(chunk))
        changes._Batch.add, outbox.forget = (lambda self, item: self.items.append(item)), (lambda *a: None)
        try:
            without_ms.append(timed(chunk))
        finally:
            changes._Batch.add, outbox.forget = real_add, real_forget
    assert not PendingChange.objects.exists()
    w, wo = statistics.median(with_ms), statistics.median(without_ms)
    return {"transactions": 2 * size * rounds, "rounds": rounds, "ms_per_write": round(w, 3),
            "ms_per_write_without_outbox": round(wo, 3), "outbox_ms_per_write": round(w - wo, 3),
            "ratio": round(w / wo, 3)}


def run_backend(backend, servers, followers, rounds, history="0", backlog=""):
    from tests.support.servers import memcached_servers

    # room for every round's answers: with a backlog each getMessages answer holds 50 items (~10 KB),
    # and an eviction would count as a follower not written
    with tempfile.TemporaryDirectory(prefix="plurk-fanout-") as tmp, memcached_servers(servers, memory_mb=2048) as mcs:
        env = dict(os.environ, PLURK_MEMCACHED=",".join(m.spec for m in mcs),
                   PLURK_SECRET_FILE=os.path.join(tmp, "secret.key"), PLURK_VAR_DIR=tmp,
                   PLURK_MEMCACHED_TIMEOUT_MS="1000")
        cluster = None
        if backend == "sqlite":
            env["PLURK_DATABASE_URL"] = f"sqlite:///{tmp}/fanout.sqlite3"
        else:
            from tests.support.postgres import PostgresCluster

            cluster = PostgresCluster().start()
            env["PLURK_DATABASE_URL"] = cluster.create_database("fanout")
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--followers", followers,
                                   "--server-count", str(servers), "--rounds", str(rounds), "--history", str(history),
                                   "--backlog", str(backlog)],
                                  env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=1800)
        finally:
            if cluster is not None:
                cluster.stop()
        if proc.returncode != 0:
            raise SystemExit(f"fanout child for {backend} failed (exit {proc.returncode})")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def _medians(results):
    """One row per (followers, history, backlog, phase): the median round's, with every round's seconds."""
    groups = {}
    for row in results:
        groups.setdefault((row["followers"], row.get("history", 0), row.get("backlog", 0), row["phase"]), []).append(row)
    out = []
    for rows in groups.values():
        rows.sort(key=lambda row: row["seconds"])
        median = dict(rows[len(rows) // 2], rounds_s=[row["seconds"] for row in rows])
        median.pop("round", None)
        out.append(median)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--followers", default="1000,10000")
    parser.add_argument("--servers", default="1,3", help="memcached server counts to try")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--rounds", type=int, default=3,
                        help="fresh author and followers per round; the median round is reported")
    parser.add_argument("--history", default="0,1000",
                        help="older plurks (each answered) by the author, read by the followers: a "
                             "comma-separated list, each a run of its own")
    parser.add_argument("--backlog", default="1000",
                        help="plurks by another followee that every follower left unread: a comma-separated "
                             "list, each a run of its own (without a history; 0 or empty: none)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--server-count", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    runs, writes, handed = [], [], []
    for backend in args.backends.split(","):
        for servers in [int(s) for s in args.servers.split(",")]:
            progress(f"{backend}, {servers} memcached server(s), followers {args.followers}")
            out = run_backend(backend, servers, args.followers, args.rounds, args.history, args.backlog)
            for row in _medians(out["results"]):
                runs.append({"backend": backend, "memcached_servers": servers, **row})
            writes.append({"backend": backend, "memcached_servers": servers, **out["writes"]})
            handed.append({"backend": backend, "memcached_servers": servers, **out["handed_off"]})
    # with and without a history; a backlog is reported beside it (its count grows with it)
    goal = [r for r in runs if r["followers"] == 10000 and not r.get("backlog")]
    path = write_result("fanout", {
        "what": "one plurk fanned out: seconds from commit until every follower's getUnreadCount and "
                "getMessages entries are written (cold: keys absent, add; warm: keys present, gets+cas); "
                "history: older plurks by the author, each answered, all read by the followers; "
                "backlog: plurks by another followee, unread by every follower",
        "goal": "10,000 followers < 1 s",
        "goal_met": bool(goal) and all(r["seconds"] < 1.0 for r in goal),
        "runs": runs,
        "writes_what": f"{WRITES} one-user transactions (read cursor + its two keys), ms each, with "
                       "plurkcore's outbox and without it (interleaved rounds, medians)",
        "writes": writes,
        "handed_off_what": "posts whose fan-out is above FANOUT_IN_REQUEST (half the last round's followers "
                           "here): ms the committing transaction takes, ms until the background writer wrote "
                           "every follower (medians of 3)",
        "handed_off": handed,
    })
    for r in runs:
        print(f"{r['backend']:>10} servers={r['memcached_servers']} followers={r['followers']:>6} "
              f"history={r.get('history', 0):>5} backlog={r.get('backlog', 0):>5} "
              f"{r['phase']:>4}: {r['seconds'] * 1000:7.1f} ms  ({r['verified_followers']} verified)")
    for w in writes:
        print(f"{w['backend']:>10} servers={w['memcached_servers']} one-user writes: {w['ms_per_write']:.2f} ms, "
              f"{w['ms_per_write_without_outbox']:.2f} ms without the outbox ({w['ratio']:.2f}x)")
    for h in handed:
        print(f"{h['backend']:>10} servers={h['memcached_servers']} {h['followers']} followers handed to the "
              f"background writer: request {h['request_ms']} ms, all written after {h['written_ms']} ms")
    print(path)


if __name__ == "__main__":
    main()
