"""Print the markdown tables of the latest results (pasted into README by hand or by `make bench`)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import RESULTS_DIR, ROOT  # noqa: E402
from bench.throughput import RATIOS  # noqa: E402  (ratio label -> the two configurations it compares)


def _load(name):
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    return json.load(open(path)) if os.path.exists(path) else None


# Issue 13's goals on this 2-core machine: ratio name -> at least.  nginx+fastpath is held to the
# most any upstream reaches behind nginx on the same transport (a do-nothing nginx upstream); the
# stack's default transport (a unix socket) must also beat nginx's own memcached_pass.
GOALS = {"fastpath / memcached_pass": 2.0, "fastpath / return 200": 0.8,
         "nginx+fastpath / nginx+return-200 upstream": 0.9,
         "nginx+fastpath unix / nginx+return-200 upstream unix": 0.9,
         "nginx+fastpath unix / memcached_pass": 1.0}


def _ms(value):
    return "n/a" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _errors(point):
    return (point or {}).get("socket_errors", 0) + (point or {}).get("non_2xx", 0)


def _ratio(name, value):
    """Two decimals, or three when two would round a ratio just under its goal up onto it."""
    goal = GOALS.get(name)
    if goal is not None and value < goal and round(value, 2) >= goal:
        return f"{value:.3f}"
    return f"{value:.2f}"


def _goal_mark(name, value, doc=None, conns=None):
    goal = GOALS.get(name)
    if goal is None:
        return ""
    if doc is not None:
        # a configuration that answered errors did not do the work: its ratio proves nothing
        bad = [c for c in RATIOS.get(name, ()) if _errors(doc["configs"].get(c, {}).get(conns))]
        if bad:
            return f" (goal {goal:g}: not met, errors in {', '.join(bad)})"
    return f" (goal {goal:g}: {'met' if value >= goal else 'not met'})"


def main():
    out = []
    doc = _load("throughput")
    if doc:
        m = doc["machine"]
        out.append(f"Throughput ({m['date']}, {m['cpus']} CPUs {m['host_cpu']}, nginx {m['nginx']}, "
                   f"memcached {m['memcached']}, commit {m['commit']}; wrk -t1, keep-alive, "
                   f"{doc['users']} per-user keys, {doc['duration_s']} s per point, median of "
                   f"{doc.get('rounds_per_point', 1)} interleaved round(s); ratios paired within a round):\n")
        levels = [str(c) for c in doc["concurrency"]]
        out.append("| config | " + " | ".join(f"c={c} req/s (p50 / p99 ms)" for c in levels) + " |")
        out.append("|---|" + "---|" * len(levels))
        for name, pts in doc["configs"].items():
            cells = [f"{pts[c]['rps']:,.0f} ({_ms(pts[c]['p50_ms'])} / {_ms(pts[c]['p99_ms'])})"
                     + (f" **{_errors(pts[c]):,} errors**" if _errors(pts[c]) else "") if c in pts else ""
                     for c in levels]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("")
        for c, ratios in doc["ratios"].items():
            out.append(f"- c={c}: " + ", ".join(f"{k} **{_ratio(k, v)}**{_goal_mark(k, v, doc, c)}"
                                                for k, v in ratios.items() if v))
        if any(pts.get(c, {}).get("cpu_us_per_request") for pts in doc["configs"].values() for c in levels):
            out.append("")
            out.append("Where the CPU went: microseconds of CPU per request, servers (and wrk), and the "
                       "share of both CPUs left idle:\n")
            out.append("| config | " + " | ".join(f"c={c}" for c in levels) + " |")
            out.append("|---|" + "---|" * len(levels))
            for name, pts in doc["configs"].items():
                cells = []
                for c in levels:
                    cpu = pts.get(c, {}).get("cpu_us_per_request")
                    if not cpu:
                        cells.append("")
                        continue
                    servers = {k: v for k, v in cpu.items() if k != "wrk"}
                    cells.append(f"{sum(servers.values()):.1f} ("
                                 + " + ".join(f"{k} {v:.1f}" for k, v in servers.items())
                                 + f"; wrk {cpu.get('wrk', 0):.1f}; idle {pts[c]['idle_pct']:.0f}%)")
                out.append(f"| {name} | " + " | ".join(cells) + " |")
            out.append("")
        if doc.get("idle_connections"):
            ic = doc["idle_connections"]
            out.append(f"- {ic['connections']:,} idle keep-alive connections: fastpath worker RSS "
                       f"{ic['rss_before_kb']:,} KB -> {ic['rss_with_connections_kb']:,} KB, "
                       f"**{ic['bytes_per_connection']:,} bytes per connection** (goal < 2,048: "
                       f"{'met' if ic['bytes_per_connection'] < 2048 else 'not met'})"
                       + (f"; the worker's private memory (not shared with its parent) "
                          f"{ic['private_before_kb']:,} KB idle, {ic['private_with_connections_kb']:,} KB "
                          f"with the connections" if "private_before_kb" in ic else ""))
        out.append("")
    doc = _load("fanout")
    if doc:
        m = doc["machine"]
        out.append(f"Fan-out ({m['date']}, commit {m['commit']}), seconds from commit until every "
                   f"follower's entries are written:\n")
        out.append("| database | memcached servers | followers | cold | warm |")
        out.append("|---|---|---|---|---|")
        rows = {}
        for r in doc["runs"]:
            rows.setdefault((r["backend"], r["memcached_servers"], r["followers"]), {})[r["phase"]] = r["seconds"]
        for (b, s, f), ph in rows.items():
            out.append(f"| {b} | {s} | {f:,} | {ph.get('cold', '')} | {ph.get('warm', '')} |")
        out.append("")
    for name in ("load", "load-10k"):
        doc = _load(name)
        if doc:
            lat = doc["delivery_latency_s"]
            f = (lambda v: "n/a" if v is None else f"{v:.2f} s")
            m = doc.get("machine", {})
            out.append(f"Locust `{name}` ({m.get('date', '?')}, commit {m.get('commit', '?')}): "
                       f"{doc['users']} users, {doc['run_time_s']} s, {doc['requests']} requests, "
                       f"{doc['failures']} failures, {doc['plurks_posted']} plurks, {doc['deliveries_checked']} "
                       f"deliveries checked, **{doc['lost']} lost**, poll hit ratio "
                       f"**{'n/a' if doc['hit_ratio'] is None else format(doc['hit_ratio'], '.4f')}**, delivery latency p50 {f(lat['p50'])}, p95 {f(lat['p95'])}, "
                       f"max {f(lat['max'])}.\n")
    out += longpoll_rows(_load("longpoll"))
    text = "\n".join(out)
    print(text)
    if "--write-readme" in sys.argv:
        _write_readme(text)


def _kb(value):
    return f"{value / 1024:.1f} KB"


# the runs bench/longpoll.py makes besides its default one: name -> what makes them differ
LONGPOLL_EXTRA = {"longpoll-100k": "stretch: `--counts 100000 --fanout 0 --no-load`",
                  "longpoll-nchan-2k": "nchan with the stack's client_header_buffer_size 2k: "
                                       "`--counts 10000 --fanout 0 --no-load --nchan-header-buffer 2k`",
                  "longpoll-load-100": "`--load-only --load-users 100`"}


def longpoll_rows(doc):
    """Long-polling against nchan (bench/longpoll.py): held polls, fan-out, locust in both modes."""
    if not doc:
        return []
    extra = {name: d for name in LONGPOLL_EXTRA if (d := _load(name))}
    m = doc["machine"]
    out = [f"Long-polling against nchan ({m['date']}, commit {m['commit']}, `bench/longpoll.py`, "
           f"{doc['runtime_s']} s; the stack's nginx with {doc['workers']['nginx']} workers -> fastpath with "
           f"{doc['workers']['fastpath']} over its unix socket; nchan {doc['workers']['nginx']} workers; memory "
           f"growth per held request (PSS, RSS in brackets), CPU over {doc['quiet_window_s']:g} s with nothing "
           f"changing (100% = one core); a shared 2-core machine, compare within the run):\n",
           "| held | fastpath | nginx (stack) | nginx + fastpath | nchan | CPU quiet: fastpath + nginx / nchan |",
           "|---|---|---|---|---|---|"]
    points = [(count, point, "") for count, point in doc["held"].items()]
    points += [(count, point, f" ({LONGPOLL_EXTRA[name]}; {d['workers']['nginx']} nginx workers)")
               for name, d in extra.items() for count, point in d.get("held", {}).items()]
    for count, point, note in points:
        s, n = point["stack"], point["nchan"]
        cell = (lambda d: f"{_kb(d['pss_bytes'])} ({_kb(d['rss_bytes'])})")
        held = f"{int(count):,}{note}" + ("" if s["held"] == n["held"] == int(count) else
                                    f" (held {s['held']:,} / {n['held']:,})")
        out.append(f"| {held} | {cell(s['per_held']['fastpath'])} | {cell(s['per_held']['nginx'])} | "
                   f"**{cell(s['per_held']['nginx+fastpath'])}** | **{cell(n['per_held']['nchan nginx'])}** | "
                   f"{s['cpu_pct_quiet']['fastpath']:g}% + {s['cpu_pct_quiet']['nginx']:g}%"
                   + (f" (memcached {s['cpu_pct_quiet']['memcached']:g}%)" if "memcached" in s["cpu_pct_quiet"] else "")
                   + " / "
                   f"{n['cpu_pct_quiet']['nchan nginx']:g}% |")
    out.append("")
    fan = doc.get("fanout")
    if fan:
        s, n = fan["stack"], fan["nchan"]
        t = (lambda v: "n/a" if v is None else f"{v * 1000:.0f} ms")
        out.append(f"- fan-out: an author with {doc['fanout_followers']:,} held followers posts (POST /api/plurks): "
                   f"last follower answered after **{t(s['last_answer_s'])}** ({s['answered']:,} answered, "
                   f"{s['statuses']}); nchan, one publish to {doc['fanout_followers']:,} subscribers: "
                   f"**{t(n['last_answer_s'])}**" + (f"; ratio {fan['stack_over_nchan']:.2f}"
                                                      if fan.get("stack_over_nchan") else ""))
    for load in [doc.get("load")] + [d["load"] for d in extra.values() if d.get("load")]:
        if not load:
            continue
        for mode in ("long", "short"):
            r = load.get(mode, {})
            if "requests_per_s" not in r:
                out.append(f"- locust, {mode} polling: {r.get('error', 'no result')}")
                continue
            out.append(f"- locust, {mode} polling ({r['users']} users, {r['run_time_s']} s): "
                       f"{r['requests_per_s']:,} requests/s, {r['failures']} failures, **{r['lost']} lost** of "
                       f"{r['deliveries_checked']:,} deliveries, delivery latency p50 **{r['delivery_p50_ms']} ms**, "
                       f"p95 {r['delivery_p95_ms']} ms, p99 **{r['delivery_p99_ms_locust']} ms** (locust's "
                       f"histogram), max {r['delivery_max_ms']} ms")
        if load.get("requests_per_s_long_over_short"):
            out.append(f"- requests per second, long / short polling at equal users: "
                       f"**{load['requests_per_s_long_over_short']:.2f}**")
    goals = doc.get("goals") or {}
    if goals:
        out.append("- goals: " + "; ".join(f"{k}: {'met' if v else '**not met**'}" for k, v in goals.items()))
    out.append("")
    return out


START, END = "<!-- bench:start (bench/report.py --write-readme) -->", "<!-- bench:end -->"


def _write_readme(text):
    readme = os.path.join(ROOT, "README.md")
    with open(readme) as fh:
        doc = fh.read()
    if START not in doc or END not in doc:
        print("README.md has no bench markers; table not written", file=sys.stderr)
        return
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    with open(readme, "w") as fh:
        fh.write(head + START + "\n" + text.rstrip() + "\n" + END + tail)
    print(f"README.md table updated", file=sys.stderr)


if __name__ == "__main__":
    main()
