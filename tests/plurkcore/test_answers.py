"""plurkcore.answers against a brute-force reading of the unread rule, on random social graphs.

The rule (docs/contract.md): the unread items of U are the plurks of the users U follows and the
responses by anyone but U to plurks authored by U or by a user U follows, all with an id above
U's read cursor.  The SQL is written for its plan (answers._items_sql, answers._sources_sql); this pins what it means,
on SQLite and, with PLURK_TEST_POSTGRES=1, on PostgreSQL.
"""
import json
import random

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from plurkcore import answers
from plurkcore.models import Follow, Plurk, ReadCursor

from .helpers import sqlite_steps

pytestmark = pytest.mark.django_db


def _world(seed, users=24, entries=300):
    """Random users, follows, plurks, responses and read cursors (some never moved)."""
    rnd = random.Random(seed)
    User = get_user_model()
    people = User.objects.bulk_create([User(username=f"w{seed}u{i}", password="!") for i in range(users)])
    if not people[0].pk:
        people = list(User.objects.filter(username__startswith=f"w{seed}u").order_by("id"))
    uids = [u.pk for u in people]
    follows = {(a, b) for a in uids for b in uids if a != b and rnd.random() < 0.2}
    Follow.objects.bulk_create([Follow(follower_id=a, followee_id=b) for a, b in sorted(follows)])
    plurks, rows = [], []
    for _ in range(entries):
        author = rnd.choice(uids)
        parent = rnd.choice(plurks) if plurks and rnd.random() < 0.6 else None
        entry = Plurk.objects.create(author_id=author, parent_id=parent, content="x")
        rows.append((entry.pk, author, parent))
        if parent is None:
            plurks.append(entry.pk)
    ids = [pk for pk, _, _ in rows]
    cursors = {uid: rnd.choice([0, 0, rnd.choice(ids), max(ids)]) for uid in uids}
    for uid, upto in cursors.items():
        ReadCursor.objects.update_or_create(user_id=uid, defaults={"read_upto": upto})
    return uids, follows, rows, cursors


def _expected(uid, follows, rows, cursors):
    """The rule, read literally: the ids of U's unread items, newest first."""
    followed = {b for a, b in follows if a == uid}
    author_of = {pk: author for pk, author, parent in rows if parent is None}
    unread = []
    for pk, author, parent in rows:
        if pk <= cursors[uid]:
            continue
        if parent is None:
            if author in followed:
                unread.append(pk)
        elif author != uid and (author_of[parent] == uid or author_of[parent] in followed):
            unread.append(pk)
    return sorted(unread, reverse=True)


@pytest.mark.parametrize("plan", ["plain", "per source"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_unread_items_equal_the_rule_read_literally(seed, plan, monkeypatch):
    if plan == "per source":                  # every batch "has too many": read per source
        monkeypatch.setattr(answers, "_PLAIN_ROWS_PER_USER", 0)
    uids, follows, rows, cursors = _world(seed)
    counts = answers.unread_counts(uids)
    for limit in (3, 50):
        got = answers.unread_messages(uids, limit=limit)
        for uid in uids:
            want = _expected(uid, follows, rows, cursors)
            count, items = got[uid]
            assert count == len(want) == counts[uid], uid
            assert [item["id"] for item in items] == want[:limit], uid


def test_reading_unread_items_is_one_query_whatever_the_users_count():
    uids, _, _, _ = _world(4, users=30, entries=60)
    with CaptureQueriesContext(connection) as few:
        answers.unread_counts(uids[:3])
    with CaptureQueriesContext(connection) as many:
        answers.unread_counts(uids)
    assert len(many) == len(few)


@pytest.mark.skipif("connection.vendor != 'sqlite'", reason="counts SQLite's own instructions")
def test_reading_unread_items_does_not_grow_with_the_table():
    """A user who never read (cursor 0) costs what its follows and plurks cost, not what the whole
    table holds: SQLite once walked every plurk above the cursor (13 s for 1,000 such users at
    50,000 plurks)."""
    uids, _, _, _ = _world(5, users=20, entries=100)
    ReadCursor.objects.filter(user_id__in=uids).update(read_upto=0)
    before = sqlite_steps(lambda: answers.unread_messages(uids))
    stranger = get_user_model().objects.create(username="stranger", password="!")
    Plurk.objects.bulk_create([Plurk(author=stranger, content="y") for _ in range(5000)])
    parents = list(Plurk.objects.filter(author=stranger).values_list("id", flat=True)[:500])
    Plurk.objects.bulk_create([Plurk(author=stranger, parent_id=p, content="z") for p in parents])
    after = sqlite_steps(lambda: answers.unread_messages(uids))
    assert after <= before * 1.5 + 10, (before, after)


def _work(uids):
    """A deterministic cost of reading the users' unread items: SQLite's instructions (hundreds),
    PostgreSQL's buffer accesses (EXPLAIN ANALYZE of the query the publisher runs)."""
    if connection.vendor == "sqlite":
        return sqlite_steps(lambda: answers.unread_messages(uids))
    sql, params = answers._items_sql(uids, 10**6)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    top = plan[0]["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"]


def _author_and_followers(author, prefix, count):
    """A new user ``author`` and ``count`` new users (``prefix``0, 1, ...) who follow it."""
    User = get_user_model()
    author = User.objects.create(username=author, password="!")
    followers = User.objects.bulk_create([User(username=f"{prefix}{i}", password="!") for i in range(count)])
    if not followers[0].pk:
        followers = list(User.objects.filter(username__startswith=prefix).order_by("id"))
    ReadCursor.objects.bulk_create([ReadCursor(user=u) for u in followers])
    Follow.objects.bulk_create([Follow(follower=u, followee=author) for u in followers])
    return author, followers


def test_reading_unread_items_does_not_grow_with_the_authors_history():
    """Followers of an author who wrote (and got answers to) thousands of plurks, all read, cost
    what is new: responses were once found through their parent plurks, which walked the author's
    whole history for every follower (1,000 followers of an author with 1,000 answered plurks:
    18x slower on SQLite, 30x on PostgreSQL)."""
    author, followers = _author_and_followers("prolific", "reader", 20)
    uids = [u.pk for u in followers]
    Plurk.objects.create(author=author, content="new")
    assert sorted(answers.unread_counts(uids).values()) == [1] * 20
    before = _work(uids)
    old = Plurk.entries.bulk_create([Plurk(author=author, content="old") for _ in range(2000)])
    if not old[0].pk:
        old = list(Plurk.objects.filter(author=author, content="old"))
    # answered by the author and by a follower: threads of the author and of the follower's own
    Plurk.entries.bulk_create([Plurk(author=followers[i % 20], parent=p, content="re") for i, p in enumerate(old)])
    newest = Plurk.entries.order_by("-id").values_list("id", flat=True)[0]
    ReadCursor.objects.filter(user_id__in=uids).update(read_upto=newest)
    Plurk.objects.create(author=author, content="newer")
    assert sorted(answers.unread_counts(uids).values()) == [1] * 20
    after = _work(uids)
    assert after <= before * 1.5 + 10, (before, after)


def _rows_fetched(monkeypatch):
    """A list that gets the number of rows of every fetch from a Django cursor from now on."""
    from django.db.backends.utils import CursorWrapper

    fetched = []
    for name in ("fetchall", "fetchmany", "fetchone"):
        real = getattr(CursorWrapper, name, None) or (lambda self, *a, name=name: getattr(self.cursor, name)(*a))

        def counting(self, *args, real=real, name=name):
            rows = real(self, *args)
            fetched.append(1 if name == "fetchone" and rows is not None else len(rows or ()))
            return rows
        monkeypatch.setattr(CursorWrapper, name, counting, raising=False)
    return fetched


def test_a_followers_backlog_is_counted_in_the_database_and_only_its_newest_read(monkeypatch):
    """A follower who stays away accumulates unread items (the page marks read only what it
    showed).  A batch of users with many unread items is read per source (a followee's plurks,
    the responses in a followee's threads, in one's own): its count and the ids of its newest
    ``limit`` items in one row, so what is handed to Python is bounded by the followers' sources,
    not their backlogs; the plain plan gives up after a few rows per user.  Every unread row once
    came to Python (SQLite) or was ranked (PostgreSQL): 1,000 followers with 10,000 unread each
    took 12 s per fan-out."""
    author, followers = _author_and_followers("chatty", "away", 10)
    uids = [u.pk for u in followers]
    replier = get_user_model().objects.create(username="replier", password="!")
    plurks = Plurk.entries.bulk_create([Plurk(author=author, content="p") for _ in range(300)])
    if not plurks[0].pk:
        plurks = list(Plurk.objects.filter(author=author))
    # responses in the author's threads, and in a follower's own thread by the replier
    own = Plurk.objects.create(author=followers[0], content="mine")
    Plurk.entries.bulk_create([Plurk(author=replier, parent=p, content="r") for p in plurks[:200]] +
                              [Plurk(author=replier, parent=own, content="r") for _ in range(20)])
    limit = 5
    fetched = _rows_fetched(monkeypatch)
    got = answers.unread_messages(uids, limit=limit)
    plain = (answers._PLAIN_ROWS_PER_USER + 1) * len(uids)
    sources = 3                               # the author's plurks, the author's threads, one's own
    # the plain plan's rows until it gives up, a row per source, the entries shown
    assert sum(fetched) <= plain + 1 + len(uids) * sources + len(uids) * limit, sum(fetched)
    newest = sorted(Plurk.entries.exclude(author=followers[0]).exclude(parent=own).values_list("id", flat=True), reverse=True)
    assert got[uids[1]][0] == 500 and [i["id"] for i in got[uids[1]][1]] == newest[:limit]
    assert got[uids[0]][0] == 520
    for sql, params in (answers._items_sql(uids, plain + 1), answers._sources_sql(uids, limit)):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        assert len(rows) <= max(plain + 1, len(uids) * sources), len(rows)
    listed = [len(ids.split(",") if isinstance(ids, str) else ids) for _, _, *lists in rows for ids in lists if ids]
    assert sum(listed) <= len(uids) * sources * limit, sum(listed)


@pytest.mark.parametrize("plan", ["plain", "per source"])
@pytest.mark.parametrize("seed", [6, 7])
def test_answers_are_the_bytes_of_the_rule_read_literally(seed, plan, monkeypatch):
    """The exact bodies, inside a write round (the two resources share what they read, as the
    writer computes them) and outside one: users with the same unread items share their items
    and their body, which must change nothing in any user's bytes."""
    import fastpoll
    from fastpoll import resources

    if plan == "per source":
        monkeypatch.setattr(answers, "_PLAIN_ROWS_PER_USER", 0)
    uids, follows, rows, cursors = _world(seed, users=30)
    # followers with the very same unread items: one author, cursors at the same place
    author, followers = _author_and_followers(f"same{seed}", f"same{seed}r", 6)
    Plurk.objects.create(author=author, content="for all of you")
    uids += [u.pk for u in followers]
    entries = {p.pk: p for p in Plurk.entries.select_related("author")}

    def want(uid):
        if uid in cursors:
            ids = _expected(uid, follows, rows, cursors)
        else:
            ids = sorted((pk for pk, p in entries.items() if p.author_id == author.pk), reverse=True)
        items = [{"id": i, "plurk_id": entries[i].parent_id or i,
                  "kind": "response" if entries[i].parent_id else "plurk", "author": entries[i].author.username,
                  "content": entries[i].content, "created": answers.isoformat(entries[i].created)}
                 for i in ids[:answers.MESSAGES_LIMIT]]
        return (fastpoll.dumps({"count": len(ids)}) if ids else b"",
                fastpoll.dumps({"count": len(ids), "items": items}) if ids else b"")

    expected = {uid: want(uid) for uid in uids}
    with resources.computing():
        inside = (answers.get_unread_count(uids), answers.get_messages(uids))
    outside = (answers.get_unread_count(uids), answers.get_messages(uids))
    for counts, messages in (inside, outside):
        assert {uid: (counts[uid], messages[uid]) for uid in uids} == expected
