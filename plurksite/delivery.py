"""The delivery rule, shared by the locustfile (locustfiles/plurkers.py), the drills (one process's own view) and bench/load.py (the
merged records of every locust process, the authority for a ``--processes`` run).

A records dict is what one locust process wrote (locustfiles/plurkers.py)::

    {"pid", "runner": "local"|"worker", "worker_index", "users",
     "accounts": [username, ...],            # the account of every user this process ran
     "logins": N,                            # how many of them logged in with a password
     "posts": [[author, plurk_id, started, committed, created], ...],   # created: the server's
     "follows": [[follower, followee, followed_at], ...],   # 0.0: made in bulk before the run
     "polls": {username: start of its last complete poll},
     "seen": [[username, plurk_id, first_seen, arrived, handled], ...],  # see below
     "cache": {"HIT": n, "MISS": n}, "truncated": n,
     "behind": n}                            # getMessages behind its count: fetched again

Times are Unix times of this machine's clock: ``started`` (before the POST) and ``committed`` (its
201 read) are the author's, ``created`` the plurk's own timestamp from that 201 (the server's clock,
millisecond precision, rounded down), ``first_seen`` the follower's.  A delivery's latency is
``first_seen - created``: one measure from one clock that locust and the stack share when they run
on one machine.  A negative one means the clocks disagree; it is kept as it is in the percentiles
and counted (``clock_disagreements``), never clamped to 0 -- the author's 201 often arrives *after*
the followers' streams delivered the plurk, so measuring from ``committed`` hid those deliveries
as 0 ms.

``arrived`` and ``handled`` split a first sight: when the kernel received the answer that announced
it (a stream's event: SO_TIMESTAMPNS; None for polls) and when the user's greenlet handled that
answer (then it fetched the messages, ``first_seen``).  ``stages`` gives their percentiles:
``stack`` created -> arrived (commit, writer, memcached, notice, fastpath, the socket), ``client``
arrived -> handled (locust's own scheduling: nothing the stack does), ``fetch`` handled -> first
seen (getMessages).  Deliveries recorded without them, or first seen in messages fetched for an
answer handled before the plurk was created, are left out of ``stages`` only.

Importing this module must stay cheap and free of Django and locust (both sides import it).
"""


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def judge(records):
    """Apply the delivery rule to the records of one or several processes.

    Every plurk must reach every follower that followed before the post began and completed a poll
    after it was committed; one that never did is *lost*.  Accounts must be distinct across
    processes: an account run by two processes (``shared_accounts``) would count its follows and
    deliveries twice and make one process's poll vouch for another's, so it fails the run too.
    """
    posts, follows, seen, polls = [], [], {}, {}
    cache = {"HIT": 0, "MISS": 0}
    truncated = behind = 0
    owner, shared = {}, set()
    users = logins = 0
    for index, rec in enumerate(records):
        for name in rec.get("accounts", []):
            if owner.setdefault(name, index) != index:
                shared.add(name)
        users += rec.get("users", 0)
        logins += rec.get("logins", 0)
        posts += rec["posts"]
        follows += rec["follows"]
        for user, item_id, t, *at in rec["seen"]:
            key = (user, item_id)
            if key not in seen or t < seen[key][0]:
                seen[key] = (t, *(at + [None, None])[:2])
        for user, t in rec["polls"].items():
            polls[user] = max(t, polls.get(user, 0))
        for k in cache:
            cache[k] += rec["cache"][k]
        truncated += rec["truncated"]
        behind += rec.get("behind", 0)
    followers = {}
    for follower, followee, t in follows:
        followers.setdefault(followee, []).append((follower, t))
    latencies, lost, checked, untimed, disagree = [], [], 0, 0, []
    stages = {"stack": [], "client": [], "fetch": []}
    early = 0
    for author, plurk_id, started, committed, *rest in posts:
        created = rest[0] if rest else None
        for follower, followed_at in followers.get(author, []):
            if followed_at >= started:
                continue                     # followed after the post began: not owed it
            first, arrived, handled = seen.get((follower, plurk_id), (None, None, None))
            if first is not None:
                checked += 1
                if created is None:          # a record without the server's time: not timed
                    untimed += 1
                    continue
                latencies.append(first - created)
                if handled is not None and handled >= created:
                    stages["fetch"].append(first - handled)
                    if arrived is not None:
                        stages["stack"].append(arrived - created)
                        stages["client"].append(handled - arrived)
                elif handled is not None:
                    early += 1               # shown by a fetch that an earlier answer announced
                if first < created:
                    disagree.append([author, plurk_id, follower, round(first - created, 6)])
            elif polls.get(follower, 0) > committed:
                lost.append([author, plurk_id, follower])
                checked += 1
    total = cache["HIT"] + cache["MISS"]
    return {
        "plurks_posted": len(posts),
        "deliveries_checked": checked,
        "lost": len(lost),
        "lost_examples": lost[:10],
        "delivery_latency_s": {"p50": percentile(latencies, 50), "p95": percentile(latencies, 95),
                               "p99": percentile(latencies, 99),
                               "max": max(latencies) if latencies else None},
        "latency_from": "created",
        "stages_s": {name: {"deliveries": len(v), "p50": percentile(v, 50), "p99": percentile(v, 99)}
                     for name, v in stages.items()},
        # first seen in messages fetched for an answer that came before the plurk was created
        # (another plurk's event; a fetch again while the messages were behind): no stages
        "stages_announced_before": early,
        "untimed_deliveries": untimed,
        # seen before the server created it: the two clocks disagree (kept in the percentiles)
        "clock_disagreements": len(disagree),
        "clock_disagreement_examples": disagree[:10],
        "poll_responses": total,
        "hit_ratio": cache["HIT"] / total if total else None,
        "truncated_polls": truncated,
        # getMessages answers behind the count that announced them (asked again, not lost)
        "messages_behind_count": behind,
        "accounts_run": users,
        "distinct_accounts": len(owner),
        "shared_accounts": len(shared),
        "shared_examples": sorted(shared)[:10],
        "password_logins": logins,
    }


def summary(verdict):
    """One line for a person: what was posted, checked, lost, how fast, and the poll hit ratio."""
    lat = verdict["delivery_latency_s"]
    fmt = (lambda v: "n/a" if v is None else f"{v * 1000:.0f} ms")
    ratio = verdict["hit_ratio"]
    line = (f"{verdict['plurks_posted']} plurks, {verdict['deliveries_checked']} deliveries checked, "
            f"LOST {verdict['lost']}, delivery latency (created -> first seen) p50 {fmt(lat['p50'])} p95 {fmt(lat['p95'])} "
            f"p99 {fmt(lat['p99'])} max {fmt(lat['max'])}, poll hit ratio {'n/a' if ratio is None else format(ratio, '.4f')} "
            f"({verdict['poll_responses']} poll responses)")
    parts = [f"{name} p50 {fmt(st['p50'])} p99 {fmt(st['p99'])}"
             for name, st in verdict.get("stages_s", {}).items() if st["deliveries"]]
    if parts:
        line += "; stages: " + ", ".join(parts)
    if verdict["lost"]:
        line += f"; lost (author, plurk, follower) e.g. {verdict['lost_examples'][:3]}"
    if verdict.get("clock_disagreements"):
        line += (f"; {verdict['clock_disagreements']} deliveries seen before their plurk's created: "
                 f"the clocks disagree, e.g. {verdict['clock_disagreement_examples'][:3]}")
    if verdict.get("untimed_deliveries"):
        line += f"; {verdict['untimed_deliveries']} deliveries of posts recorded without created (not timed)"
    if verdict["shared_accounts"]:
        line += f"; {verdict['shared_accounts']} accounts run by more than one process, e.g. {verdict['shared_examples'][:3]}"
    return line
