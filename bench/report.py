"""The Markdown of the latest results in bench/results/.

Prints every table.  With ``--write-readme`` (``make bench`` passes it) it also writes them into
docs/benchmarks.md, between its ``bench:start``/``bench:end`` markers, and the README's one headline
table (the best ratio against each peer, :func:`headline`) between the README's markers.  The
history of the runs, and what each figure means, is prose in docs/benchmarks.md.
"""
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


def tables():
    """Every table of the latest results, as Markdown."""
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
    for name, lines in (("atr", _atr_lines), ("connbench", _connbench_lines)):
        if (doc := _load(name)):
            out += lines(doc)
    doc = _load("fanout")
    if doc:
        m = doc["machine"]
        out.append(f"Fan-out ({m['date']}, commit {m['commit']}), seconds from commit until every "
                   f"follower's entries are written:\n")
        out.append("| database | memcached servers | followers | author's older plurks (answered, read) "
                   "| each follower's unread backlog | cold | warm |")
        out.append("|---|---|---|---|---|---|---|")
        rows = {}
        for r in doc["runs"]:
            key = (r["backend"], r["memcached_servers"], r["followers"], r.get("history", 0), r.get("backlog", 0))
            rows.setdefault(key, {})[r["phase"]] = r["seconds"]
        for (b, s, f, h, u), ph in rows.items():
            out.append(f"| {b} | {s} | {f:,} | {h:,} | {u:,} | {ph.get('cold', '')} | {ph.get('warm', '')} |")
        out.append("")
        if doc.get("handed_off"):
            out.append("A fan-out above `FANOUT_IN_REQUEST` (set to half the followers for this row) handed to the "
                       "background writer: "
                       + "; ".join(f"{h['backend']} with {h['memcached_servers']} server(s), {h['followers']:,} followers: "
                                   f"the post's transaction {h['request_ms']} ms, every follower written "
                                   f"{h['written_ms']} ms after it"
                                   for h in doc["handed_off"]) + ".")
            out.append("")
        if doc.get("writes"):
            out.append("The outbox's cost on the smallest write (one user's read cursor and its two keys, "
                       "no HTTP; interleaved rounds, medians): "
                       + "; ".join(f"{w['backend']} with {w['memcached_servers']} server(s) {w['ms_per_write']:.2f} ms "
                                   f"against {w['ms_per_write_without_outbox']:.2f} ms without it ({w['ratio']:.2f}x)"
                                   for w in doc["writes"]) + ".")
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
    out += edge_rows(_load(EDGE_RUN))
    out += public_face_rows()
    return "\n".join(out)


def _kept_tls(doc):
    return doc["ratios"]["kept TLS / kept plain"]


def public_face_rows():
    """Issue 32's figures: the balancer's CPU per poll over TLS (bench/tls.py), held streams over
    TLS beside plain (bench/edgetls.py), one token at its cap (bench/onetoken.py)."""
    out = []
    doc = _load("tls")
    if doc:
        m, t = doc["machine"], doc["tls"]
        out.append(f"TLS at the balancer (`bench/tls.py`, {m['date']}, commit {m['commit']}; {t['protocol']} "
                   f"{t['cipher']}, {t['openssl']}): the balancer's nginx CPU (master + worker) per poll, "
                   f"median of {doc['rounds']} alternated rounds of {doc['seconds']} s; kept: wrk -t1 "
                   f"-c{doc['connections']}; new: {doc['new_connection_threads']} threads, one poll per "
                   f"connection:\n")
        out += _head("mode", "balancer CPU per poll", "rounds", "polls/s (median round)")
        for name, r in doc["modes"].items():
            resumed = f" ({r['resumed']:,} of {r['handshakes']:,} resumed)" if r.get("handshakes") else ""
            out.append(f"| {name}{resumed} | **{r['balancer_cpu_us_per_request']:.1f} us** | "
                       f"{_span(r['rounds_cpu_us_per_request'], '.1f')} | {r['requests_per_s']:,} |")
        out.append("")
        out.append("- " + "; ".join(f"{k}: **{r['median_over_median']:.3f}x** (rounds {_span(r['rounds'])})"
                                    for k, r in doc["ratios"].items()))
        out.append("- goals: " + "; ".join(f"{k}: {'met' if v else '**not met**'}" for k, v in doc["goals"].items()))
        out.append("")
    doc = _load("edgetls")
    if doc and "summary" in doc:
        s, m = doc["summary"], doc["machine"]
        out.append(f"Held streams over TLS (`bench/edgetls.py`, {m['date']}, commit {m['commit']}; "
                   f"{doc['streams']:,} streams, PSS per held stream):\n")
        out += _head("path", "fastpath", "TLS terminator (nginx stream)", "all", "CPU per event")
        out.append(f"| plain edge | {_b(s['fastpath_pss_bytes_per_stream'])} | - | "
                   f"{_b(s['fastpath_pss_bytes_per_stream'])} | {s['plain_cpu_us_per_event']} us |")
        out.append(f"| TLS at the balancer's nginx | {_b(s['fastpath_pss_bytes_per_stream'])} (the same connection) | "
                   f"{_b(s['tls_nginx_stream_pss_bytes_per_stream'])} | {_b(s['tls_total_pss_bytes_per_stream'])} | "
                   f"{s['tls_cpu_us_per_event']} us |")
        out.append("")
        if doc.get("goals"):
            out.append("- goals: " + "; ".join(f"{k}: {'met' if v else '**not met**'}" for k, v in doc["goals"].items()))
            out.append("")
    doc = _load("onetoken")
    if doc:
        m = doc["machine"]
        out.append(f"One token at its cap (`bench/onetoken.py`, {m['date']}, commit {m['commit']}; "
                   f"PLURK_MAX_HELD_PER_USER={doc['cap']:,}, one fastpath worker):\n")
        out += _head("one token's long-polls held", "another user's poll through nginx (median / max)",
                     "on the edge (median / max)", "the next long-poll of the token (median / max)")
        for name in ("nginx", "edge"):
            r = doc[name]
            o, b = r["other_user"], r["beyond_the_cap"]
            out.append(f"| {r['held']:,} {'through nginx' if name == 'nginx' else 'on the edge'} | "
                       + " | ".join(f"{v['median_ms']:.2f} / **{v['max_ms']:.1f} ms** ({_answers(v['x_cache'], 'X-Cache')})"
                                    for v in o.values())
                       + f" | {_refusals(b)}: {b['median_ms']:.2f} / **{b['max_ms']:.1f} ms** |")
        out.append("")
        out.append("- goals: " + "; ".join(f"{k}: {'met' if v else '**not met**'}" for k, v in doc["goals"].items()))
        out.append("")
    return out


def _answers(counts, name=""):
    """"50 HIT" of {"HIT": 50}."""
    return ", ".join(f"{v:,} {name + ' ' if name else ''}{k}" for k, v in counts.items())


def _refusals(beyond):
    """"429, Retry-After 5 (10 of 10)" of bench/onetoken.py's tries beyond the cap."""
    return ", ".join(f"{k.replace(' Retry', ', Retry')} ({v} of {beyond['tries']})" for k, v in beyond["answers"].items())


def public_face_headline_rows():
    rows = []
    doc = _load("tls")
    if doc:
        r = _kept_tls(doc)
        modes = doc["modes"]
        goal = next(iter(doc["goals"].values()))
        rows.append(("a poll over TLS through the balancer against plain HTTP (balancer CPU per poll, kept "
                     "connections)",
                     f"**{r['median_over_median']:.3f}x** (rounds {_span(r['rounds'])}; "
                     f"{modes['kept TLS']['balancer_cpu_us_per_request']:.1f} / "
                     f"{modes['kept plain']['balancer_cpu_us_per_request']:.1f} us); a new connection each: "
                     f"full handshake {modes['new TLS full handshake']['balancer_cpu_us_per_request']:.0f} us, "
                     f"resumed {modes['new TLS resumed']['balancer_cpu_us_per_request']:.0f} us, plain "
                     f"{modes['new plain']['balancer_cpu_us_per_request']:.0f} us",
                     f"≤ 1.3x: {'met' if goal else '**not met**'}"))
    doc = _load("edgetls")
    if doc and "summary" in doc:
        s = doc["summary"]
        ok = s["fastpath_pss_bytes_per_stream"] <= 2048
        rows.append(("memory per held stream, plain edge / TLS at the balancer (PSS, all processes)",
                     f"{_b(s['fastpath_pss_bytes_per_stream'])} / **{_kb(s['tls_total_pss_bytes_per_stream'])}** "
                     f"(fastpath {_b(s['fastpath_pss_bytes_per_stream'])} + nginx stream "
                     f"{_kb(s['tls_nginx_stream_pss_bytes_per_stream'])}) at {doc['streams']:,}",
                     f"fastpath's part <= 2 KB: {'met' if ok else '**not met**'}; TLS: reported"))
    doc = _load("onetoken")
    if doc:
        cells = []
        for name in ("nginx", "edge"):
            r = doc[name]
            worst = max(v["max_ms"] for v in r["other_user"].values())
            cells.append(f"{r['held']:,} held {'through nginx' if name == 'nginx' else 'on the edge'}: another "
                         f"user's poll max **{worst:.1f} ms**, the next one {_refusals(r['beyond_the_cap'])} "
                         f"in ≤ {r['beyond_the_cap']['max_ms']:.1f} ms")
        met = all(doc["goals"].values())
        rows.append((f"one token holding {doc['cap']:,} long-polls (its cap)", "; ".join(cells),
                     f"another's poll ≤ 100 ms, the next refused at once: {'met' if met else '**not met**'}"))
    return rows


def main():
    text = tables()
    print(text)
    if "--write-readme" in sys.argv:
        _write_between(os.path.join(ROOT, "docs", "benchmarks.md"), START, END, text)
        _write_between(os.path.join(ROOT, "README.md"), HEADLINE_START, HEADLINE_END, headline())


def _f(value, spec=".2f"):
    return "n/a" if value is None else format(value, spec)


def _head(*cells):
    """A markdown table's first two lines."""
    return ["| " + " | ".join(cells) + " |", "|" + "---|" * len(cells)]


def _measured(doc):
    """Machine facts, the run's configuration, and the fastpath commit it measured."""
    m, cfg = doc["machine"], doc["config"]
    return m, cfg, (cfg.get("fastpath") or {}).get("commit") or m["commit"]


def _atr_lines(doc):
    """The active-ratio sweep: per total and ATR, each backend's req/s, the paired epoll/poll ratios
    for fastpath and for the kernel-only control, and fastpath's ready events per wait."""
    m, cfg, commit = _measured(doc)
    out = [f"Active ratio, epoll against poll ({m['date']}, Linux {m['kernel']}, fastpath at {commit}; "
           f"one fastpath worker on CPU 1, bench/atr_client on CPU 0, {cfg['duration_s']:g} s per point, "
           f"median of {cfg['rounds']} interleaved rounds, ratios paired within a round; control: "
           f"bench/pipetest, raw poll()/epoll_wait() on socketpairs). Above 1, epoll is ahead:\n"]
    fp, ctl = doc.get("fastpath", {}).get("sweep", {}), doc.get("control", {}).get("sweep", {})
    out += _head("N", "ATR", "fastpath epoll / poll / select req/s", "epoll/poll req/s", "poll/epoll CPU per request",
                 "events per wait (epoll / poll)", "control epoll/poll rate", "control poll/epoll CPU")
    for total in sorted(set(fp) | set(ctl), key=int):
        ctl_rows = {r["atr"]: r for r in ctl.get(total, [])}
        for row in fp.get(total, []) or ctl.get(total, []):
            b = row["backends"] if total in fp else {}
            c = ctl_rows.get(row["atr"], {}).get("ratios", {})
            rps = " / ".join(f"{b[k]['rps']:,.0f}" for k in ("epoll", "poll", "select") if k in b)
            epw = " / ".join(_f(b.get(k, {}).get("events_per_wait"), ".1f") for k in ("epoll", "poll"))
            r = row["ratios"] if total in fp else {}
            out.append(f"| {int(total):,} | {row['atr']:g} | {rps} | {_f(r.get('epoll/poll req/s'))} | "
                       f"{_f(r.get('poll/epoll CPU per request'))} | {epw} | {_f(c.get('epoll/poll rate'))} | "
                       f"{_f(c.get('poll/epoll CPU per token'))} |")
    out.append("")
    for name, part in (("fastpath", doc.get("fastpath")), ("control", doc.get("control"))):
        for label, by_total in (part or {}).get("break_even", {}).items():
            out.append(f"- {name}, {label}: crosses 1.0 " + "; ".join(
                f"at N={int(t):,} between ATR {', '.join(f'{a:g}-{b:g}' for a, b in spans)}" if spans
                else f"nowhere at N={int(t):,}" for t, spans in by_total.items()))
    sp = doc.get("superpoll")
    if sp:
        lead = sp.get("largest_poll_lead") or {}
        out.append(f"- superpoll (issue 15 item 4): poll ahead of epoll by {sp['threshold']:.2f}x or more in both "
                   f"req/s and CPU per request at {len(sp['poll_ahead'])} point(s); poll's largest req/s lead "
                   f"{_f(lead.get('poll/epoll req/s'), '.3f')}x (N={lead.get('total')}, ATR {lead.get('atr')}): "
                   f"**{'build it' if sp['build'] else 'not built'}**")
    fp = doc.get("fastpath") or {}
    if fp.get("limited_by"):
        out.append(f"- the load generator used at most {fp['client_max_cpu_pct']:.0f}% of its CPU; runs limited by "
                   + ", ".join(f"{k} {v}" for k, v in sorted(fp["limited_by"].items())))
    checks = fp.get("client_check") or []
    if checks:
        out.append("- client check: through the same generator nginx `return 200` answers "
                   + ", ".join(f"{c['nginx/fastpath']:.2f}x" for c in checks if c.get("nginx/fastpath"))
                   + " fastpath's best backend at (N, ATR) "
                   + ", ".join(f"({c['total']:,}, {c['atr']:g})" for c in checks))
    out.append("")
    return out


def _connbench_lines(doc):
    """Connections without keep-alive, beside the seeds' published figures."""
    m, cfg, commit = _measured(doc)
    out = [f"Without keep-alive ({m['date']}, fastpath at {commit}; median of {cfg['rounds']} interleaved "
           f"rounds): `ab -c {cfg['concurrency']} -n {cfg['ab_requests']}` through nginx (one worker each, "
           f"one shared key as the seed had), and new connections per second straight to the server "
           f"(bench/atr_client --close, {cfg['concurrency']} at once):\n"]
    out += _head("run", "config", "req/s", "p50 / p99 / max ms", "CPU us per connection: servers / client; limited by")
    for key in ("ab", "connect 1 worker", "connect 2 workers"):
        for name, p in doc.get(key, {}).get("configs", {}).items():
            errors = p.get("failed", 0) + p.get("socket_errors", 0) + p.get("non_2xx", 0)
            cpu = (f"{p['server_cpu_us_per_request']:.1f} / {p['client_cpu_us_per_request']:.1f}; {p['limited_by']}"
                   if "limited_by" in p else f"{p['server_cpu_us_per_request']:.1f} / n/a (ab)"
                   if "server_cpu_us_per_request" in p else "")
            out.append(f"| {key} | {name} | {p['rps']:,.0f}" + (f" **{errors:,} errors**" if errors else "")
                       + f" | {_ms(p['p50_ms'])} / {_ms(p['p99_ms'])} / {_ms(p['max_ms'])} | {cpu} |")
    seeds = doc.get("seeds", {})
    for label, fig in seeds.items():
        extra = ", ".join(f"{k.replace('_', ' ')} {v:,.0f}" for k, v in fig.items() if k != "rps")
        out.append(f"| published | {label} | {fig['rps']:,} | {extra} | |")
    out.append("")
    for key in ("ab", "connect 1 worker", "connect 2 workers"):
        ratios = doc.get(key, {}).get("ratios", {})
        if ratios:
            out.append(f"- {key}: " + ", ".join(
                f"{label} **{r['median']:.3f}**" + ("" if r["goal"] is None else
                                                   f" (goal {r['goal']:g}: {'met' if r['met'] else 'not met'})")
                for label, r in ratios.items()))
    out.append("")
    return out


def _kb(value):
    return f"{value / 1024:.1f} KB"


# the runs bench/longpoll.py makes besides its default one: name -> what makes them differ
LONGPOLL_EXTRA = {"longpoll-100k": "stretch: `--counts 100000 --fanout 0 --no-load`",
                  "longpoll-load-100": "`--load-only --load-users 100`"}


def _rounds_text(rounds, t):
    """"stack 475 ms, 520 ms; nchan 164 ms, 170 ms" of a run's rounds, each time through t."""
    return ("stack " + ", ".join(t(r["stack_s"]) for r in rounds) + "; nchan "
            + ", ".join(t(r["nchan_s"]) for r in rounds))


def _cpu_cells(cpu):
    """"nginx 0.34 + gunicorn 0.26 + ... = 0.85" of a fan-out's {process: CPU seconds}."""
    parts = sorted(cpu.items(), key=lambda kv: -kv[1])
    return " + ".join(f"{k} {v:.2f}" for k, v in parts) + f" = {sum(cpu.values()):.2f}"


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
                                                      if fan.get("stack_over_nchan") else "")
                   + (f" (median of {len(fan['rounds'])} rounds, alternated: {_rounds_text(fan['rounds'], t)})"
                      if fan.get("rounds") else ""))
        if s.get("cpu_s") and n.get("cpu_s"):
            out.append("  CPU seconds spent meanwhile (median round): stack " + _cpu_cells(s["cpu_s"])
                       + "; against " + _cpu_cells(n["cpu_s"]))
        d = fan.get("delivery")
        if d:
            ds, dn = d["stack"], d["nchan"]
            out.append(f"- the push layer alone (the bench stores each held follower's new answer in memcached and "
                       f"sends one notice; no database, no writer): last follower answered after "
                       f"**{t(ds['last_answer_s'])}**, nchan **{t(dn['last_answer_s'])}**"
                       + (f"; ratio **{d['stack_over_nchan']:.2f}**" if d.get("stack_over_nchan") else "")
                       + f" (median of {len(d['rounds'])} rounds: {_rounds_text(d['rounds'], t)}); CPU seconds: stack "
                       + _cpu_cells(ds["cpu_s"]) + "; against " + _cpu_cells(dn["cpu_s"]))
    for load in [doc.get("load")] + [d["load"] for d in extra.values() if d.get("load")]:
        if not load:
            continue
        for mode in ("long", "short"):
            r = load.get(mode, {})
            if "requests_per_s" not in r:
                out.append(f"- locust, {mode} polling: {r.get('error', 'no result')}")
                continue
            procs = load.get("locust_processes")
            out.append(f"- locust, {mode} polling ({r['users']} users, {r['run_time_s']} s"
                       + (f", {procs} locust processes" if procs and procs > 1 else "") + "): "
                       f"{r['requests_per_s']:,} requests/s, {r['failures']} failures, **{r['lost']} lost** of "
                       f"{r['deliveries_checked']:,} deliveries, delivery latency p50 **{r['delivery_p50_ms']} ms**, "
                       f"p95 {r['delivery_p95_ms']} ms, p99 **{r.get('delivery_p99_ms', 'n/a')} ms** (locust's "
                       f"histogram of every first sight: {r['delivery_p99_ms_locust']} ms), max {r['delivery_max_ms']} ms")
        if load.get("requests_per_s_long_over_short"):
            out.append(f"- requests per second, long / short polling at equal users: "
                       f"**{load['requests_per_s_long_over_short']:.2f}**")
    goals = doc.get("goals") or {}
    if goals:
        out.append("- goals: " + "; ".join(f"{k}: {'met' if v else '**not met**'}" for k, v in goals.items()))
    out.append("")
    return out


def _span(values, spec=".2f"):
    """"0.77-0.94" of several values (one value alone when they are equal)."""
    low, high = format(min(values), spec), format(max(values), spec)
    return low if low == high else f"{low}-{high}"


def _goal_cell(goal, met_at, missed_at):
    """"met", "not met", or "met at c=200, 1000; not at c=50"."""
    if not missed_at:
        return f"{goal}: met"
    if not met_at:
        return f"{goal}: **not met**"
    return f"{goal}: met at {', '.join(met_at)}; **not at {', '.join(missed_at)}**"


def _throughput_row(doc, label, ratio, goal_text=None):
    values = {c: r[ratio] for c, r in doc["ratios"].items() if r.get(ratio)}
    if not values:
        return None
    goal = GOALS.get(ratio)
    cell = ""
    if goal is not None:
        met = [f"c={c}" for c, v in values.items() if v >= goal and not _goal_mark(ratio, v, doc, c).count("errors")]
        missed = [f"c={c}" for c in values if f"c={c}" not in met]
        cell = _goal_cell(f"≥ {goal:g}x", met, missed)
    conc = ", ".join(values)
    return (label, f"**{_span(values.values())}x** (c={conc})", goal_text or cell)


def _goals(doc, prefix):
    """The run's own goals whose name starts with ``prefix``, each met or not."""
    return "; ".join(f"{k[len(prefix):].strip()}: {'met' if v else '**not met**'}"
                     for k, v in (doc.get("goals") or {}).items() if k.startswith(prefix))



# bench/longpoll.py's run with the edge and streams (issue 31): its result name and the stretch's
EDGE_RUN, EDGE_STRETCH_RUNS = "longpoll-edge", ("longpoll-edge", "longpoll-edge-100k", "longpoll-edge-200k",
                                                  "longpoll-edge-500k")
EDGE_MODES = (("stream-edge", "stream, edge"), ("longpoll-edge", "long-poll, edge"),
              ("stream-nginx", "stream, nginx"), ("stack", "long-poll, nginx"),
              ("nchan-eventsource", "nchan EventSource"), ("nchan", "nchan long-poll"))


# runs that hold one mode first on servers that have held nothing (the first mode held on a
# server measures its growth; later modes reuse what earlier connections freed): name -> what
# each with the modes it held first on their server (nginx's share of stream-nginx: fastpath's is
# small), in bold in the table
EDGE_FRESH_RUNS = {"longpoll-edge-fresh": ("`--modes stream-edge,nchan-eventsource,longpoll-edge,stream-nginx`",
                                           {"stream-edge", "nchan-eventsource", "stream-nginx"}),
                   "longpoll-edge-fresh-lp": ("`--modes longpoll-edge`", {"longpoll-edge", "stack", "nchan"})}


# the locust runs in stream mode (bench/load.py with PLURK_LOAD_POLL_MODE=stream): on the edge, through nginx
STREAM_LOADS = ("load-streampoll", "load-streampoll-nginx")


def _ms(v):
    return "n/a" if v is None else f"{v * 1000:.0f} ms"


def _b(v):
    """Bytes as bytes below 1 KB (per-connection figures of a few hundred bytes), else KB."""
    return f"{v:,} B" if abs(v) < 1024 else _kb(v)


def _stretches():
    """[(run name, edge_stretch)] of the runs that opened streams on the edge at once."""
    return [(name, d["edge_stretch"]) for name in EDGE_STRETCH_RUNS if (d := _load(name)) and d.get("edge_stretch")]


def edge_rows(doc):
    """Streams and the edge against nchan (bench/longpoll.py, issue 31): per held connection, the
    fan-out and the push layer alone by mode, the edge's stretch."""
    if not doc:
        return []
    m = doc["machine"]
    out = [f"Streams and the edge against nchan ({m['date']}, commit {m['commit']}, `bench/longpoll.py "
           f"--counts {','.join(map(str, doc['counts']))} --fanout {doc['fanout_followers']} --edge-stretch ...`, "
           f"{doc['runtime_s']} s; fastpath {doc['workers']['fastpath']} workers, nginx and nchan "
           f"{doc['workers']['nginx']}): growth per held connection of every user-space process on the path "
           f"(PSS) and of the kernel (slab, both ends of the loopback connection; the server's sockets per "
           f"connection):\n",
           "| held | " + " | ".join(label for _, label in EDGE_MODES) + " |",
           "|---|" + "---|" * len(EDGE_MODES)]
    points = [(count, point, "", None) for count, point in doc["held"].items()]
    points += [(count, point, f" (`{name}`, {what}: fresh servers)", fresh)
               for name, (what, fresh) in EDGE_FRESH_RUNS.items() if (d := _load(name))
               for count, point in d.get("held", {}).items()]
    for count, point, note, fresh in points:
        cells = []
        for key, _ in EDGE_MODES:
            r = point.get(key)
            if not r:
                cells.append("n/a")
                continue
            k = r.get("kernel_per_held", {})
            slab = k.get("slab_bytes_both_ends")
            first = fresh and key in fresh
            cell = f"{_b(r['per_held']['path']['pss_bytes'])}" + (f"; kernel {_kb(slab)}" if slab is not None else "")
            if not fresh:
                cell += f", {k.get('server_sockets', 0):g} socket(s)"
            cells.append(("**" + cell + "**" if first else cell)
                         + ("" if r["held"] == int(count) else f" (held {r['held']:,})"))
        out.append(f"| {int(count):,}{note} | " + " | ".join(cells) + " |")
    out.append("")
    for name, st in _stretches():
        k = st["kernel_per_held"]
        out.append(f"- `{name}`: **{st['held']:,} of {st['count']:,} streams held on the edge**, "
                   f"{st['refused']} refused, {st.get('ended', 0):,} ended before the measure ({st['statuses']}, "
                   f"{st['failed']} connects failed), held {st['held_after_s']} s after the burst began; fastpath "
                   f"{_b(st['per_held']['path']['pss_bytes'])} per stream (PSS), kernel "
                   f"{_kb(k['slab_bytes_both_ends'] or 0)} (both ends); CPU with nothing changing "
                   + ", ".join(f"{p} {v:g}%" for p, v in st["cpu_pct_quiet"].items()) + ".")
    fan = doc.get("fanout") or {}
    for title, runs in (("a post through the API (the writer computes every follower's answer)",
                         fan.get("modes")),
                        ("the push layer alone (answers stored by the bench, one notice)",
                         (fan.get("delivery") or {}).get("modes"))):
        if not runs:
            continue
        parts = []
        for key, label in EDGE_MODES:
            r = runs.get({"stack": "longpoll-nginx", "nchan": "nchan-longpoll"}.get(key, key))
            if not r:
                continue
            ratio = ""
            if "over_nchan_eventsource" in r:
                ratio = f" ({r['over_nchan_longpoll']:.2f}x nchan long-poll, {r['over_nchan_eventsource']:.2f}x EventSource)"
            parts.append(f"{label} **{_ms(r['last_answer_s'])}**{ratio} [rounds "
                         + ", ".join(_ms(v) for v in r.get("rounds_s", [])) + "]")
        out.append(f"- to {doc['fanout_followers']:,} held followers, {title}, last event (median round): "
                   + "; ".join(parts) + ".")
    for name in STREAM_LOADS:
        load = _load(name)
        if not load:
            continue
        lat = load["delivery_latency_s"]
        lm = load.get("machine", {})
        d = load.get("endpoints", {}).get("delivery plurk first seen by a follower")
        out.append(f"- locust `{name}` ({lm.get('date', '?')}, commit {lm.get('commit', '?')}), "
                   f"PLURK_LOAD_POLL_MODE=stream, streams of `{_stream_resources(load)}` on {_streams_via(load)}: "
                   f"{load['users']} users, {load['run_time_s']} s, {load['processes']} locust process(es): delivery "
                   f"p50 **{_ms(lat['p50'])}**, p95 {_ms(lat['p95'])}, p99 **{_ms(lat['p99'])}**, max {_ms(lat['max'])}, "
                   f"**{load['lost']} lost** of {load['deliveries_checked']:,}, {load['failures']} failures"
                   + _judge_notes(load) + ".")
    out.append("")
    return out


STREAM_RUNS_DIR = "load-streampoll-runs"
# runs that are not figures of the code as it is: instrumented, or of an experiment reverted
STREAM_RUNS_APART = ("strace", "perftrace", "together", "4procs")


def _stream_spread(load):
    """", over N runs p50 a-b ms, p99 c-d ms": the runs of the same path and the same stream in
    bench/results/load-streampoll-runs/ (not instrumented, not of a reverted experiment), the
    one in the table among them; "" when there are fewer than two.  The same stream: the same
    resources in it (a stream of the count alone, whose users fetched the messages, is another
    measure than a stream of both)."""
    folder = os.path.join(RESULTS_DIR, STREAM_RUNS_DIR)
    runs = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        if not name.endswith(".json") or any(word in name for word in STREAM_RUNS_APART):
            continue
        with open(os.path.join(folder, name)) as fh:
            doc = json.load(fh)
        if _streams_via(doc) == _streams_via(load) and doc.get("latency_from") == "created" \
                and _stream_resources(doc) == _stream_resources(load):
            runs.append(doc["delivery_latency_s"])
    if len(runs) < 2:
        return ""
    p50, p99 = sorted(r["p50"] for r in runs), sorted(r["p99"] for r in runs)
    return (f"; over {len(runs)} runs p50 {p50[0] * 1000:.0f}-{p50[-1] * 1000:.0f} ms, "
            f"p99 {p99[0] * 1000:.0f}-{p99[-1] * 1000:.0f} ms")


def _stream_resources(load):
    """The resources locust's users streamed ("getUnreadCount", "getUnreadCount,getMessages"), by
    locust's endpoint names ("GET /Poll/<resources> (stream)"); None when it streamed nothing."""
    for name in load.get("endpoints", {}):
        if name.endswith(("(stream)", "(edge stream)")) and name.startswith("GET /Poll/"):
            return name[len("GET /Poll/"):].split(" ")[0]
    return None


def _streams_via(load):
    """Where the run's streams went: recorded since the nginx run's streams were found on the
    edge (the stack's default PLURK_EDGE); before, by locust's endpoint names."""
    via = load["stack"].get("streams_via")
    if via is None:                   # older results: by locust's names, else the stack's edge
        names = load.get("endpoints", {})
        if any(n.endswith("(edge stream)") for n in names):
            via = "edge"
        elif any(n.endswith("(stream)") for n in names):
            via = "nginx"
        else:
            via = "edge" if load["stack"].get("edge") else "nginx"
    return "the edge" if via == "edge" else via


def _judge_notes(load):
    """How the judge measured (from the plurk's created since c206906; the author's 201 before,
    with what arrived sooner counted 0) and, when recorded, where the time went."""
    if load.get("latency_from") != "created":
        d = load.get("endpoints", {}).get("delivery plurk first seen by a follower")
        return ("; judged from the author's 201, what arrived sooner counted 0 ms (older judge)"
                + (f"; locust's histogram, from the plurk's created: p50 {d['median_ms']:.0f} ms" if d else ""))
    out = f"; from the plurk's created, {load.get('clock_disagreements', 0)} seen before it"
    stages = [f"{name} {_ms(st['p50'])} / {_ms(st['p99'])}"
              for name, st in load.get("stages_s", {}).items() if st["deliveries"]]
    if stages:
        out += "; p50 / p99 by stage: " + ", ".join(stages)
    return out


def edge_headline_rows():
    doc = _load(EDGE_RUN)
    rows = []
    if doc:
        # per held connection: each mode's figure from a run where it was the first held on
        # fresh servers when there is one, else the main run's largest count
        best = {}
        count, point = max(doc.get("held", {}).items(), key=lambda kv: int(kv[0]), default=(None, {}))
        for key, _ in EDGE_MODES:
            if key in point:
                best[key] = (point[key], f"{int(count):,}")
        for name, (_, fresh) in EDGE_FRESH_RUNS.items():
            for c, p in ((_load(name) or {}).get("held") or {}).items():
                for key in fresh:
                    if key in p:
                        best[key] = (p[key], f"{int(c):,}, fresh")
        if best:
            cells = [f"{label} {_b(best[key][0]['per_held']['path']['pss_bytes'])}" for key, label in EDGE_MODES
                     if key in best]
            edge = [best[k][0]["per_held"]["path"]["pss_bytes"] for k in ("stream-edge", "longpoll-edge") if k in best]
            rows.append((f"memory per held connection, every user-space process on the path (PSS; at "
                         f"{best.get('stream-edge', (None, '?'))[1]})", "; ".join(cells),
                         "<= 2 KB for a stream and a long-poll on the edge: "
                         + ("met" if edge and max(edge) <= 2048 else "**not met**")))
            kern = [f"{label} {_kb(best[key][0]['kernel_per_held']['slab_bytes_both_ends'])}"
                    for key, label in EDGE_MODES if key in best
                    and best[key][0].get("kernel_per_held", {}).get("slab_bytes_both_ends") is not None]
            if kern:
                rows.append(("kernel memory per held connection (slab growth, both ends of the loopback connection)",
                             "; ".join(kern), "reported (no goal)"))
        fan = doc.get("fanout") or {}
        for what, runs, prefix in (("a post reaching", fan.get("modes"), "fan-out,"),
                                   ("the push layer alone reaching", (fan.get("delivery") or {}).get("modes"),
                                    "push layer alone,")):
            if not runs:
                continue
            cells = []
            for mode, label in (("stream-edge", "stream, edge"), ("longpoll-edge", "long-poll, edge"),
                                ("stream-nginx", "stream, nginx"), ("longpoll-nginx", "long-poll, nginx")):
                r = runs.get(mode)
                if r and r.get("last_answer_s"):
                    like = "over_nchan_eventsource" if mode.startswith("stream") else "over_nchan_longpoll"
                    cells.append(f"{label} **{_ms(r['last_answer_s'])}** ({r[like]:.2f}x)")
            n = [f"{label} {_ms(runs[m]['last_answer_s'])}" for m, label in
                 (("nchan-eventsource", "EventSource"), ("nchan-longpoll", "long-poll")) if m in runs]
            rows.append((f"{what} {doc['fanout_followers']:,} held followers against nchan's broadcast "
                         f"(streams against EventSource, long-polls against long-poll)",
                         "; ".join(cells) + "; nchan " + ", ".join(n), _goals(doc, prefix)))
    for name, st in _stretches():
        if name == EDGE_RUN or st["count"] < 200_000:
            continue                   # smaller stretches: in the tables only (the goal is 200,000)
        clean = st["held"] == st["count"] and not st["refused"] and not st.get("ended")
        rows.append((f"streams held at once on the edge (`{name}`)",
                     f"**{st['held']:,}** of {st['count']:,}, {st['refused']} refused, {st.get('ended', 0):,} ended "
                     f"(`event: miss`) before the measure, {_b(st['per_held']['path']['pss_bytes'])} each in fastpath",
                     ("200,000" if st["count"] <= 200_000 else "moonshot 500,000") + ", none refused: "
                     + ("met" if clean and st["held"] >= min(st["count"], 200_000) else "**not met**")))
    for load in filter(None, map(_load, STREAM_LOADS)):
        lat = load["delivery_latency_s"]
        ok = lat["p50"] is not None and lat["p50"] <= 0.03, lat["p99"] is not None and lat["p99"] <= 0.15, load["lost"] == 0
        honest = load.get("latency_from") == "created" and not load.get("clock_disagreements")
        rows.append((f"locust, {load['users']} streaming users"
                     f" {'on' if _streams_via(load) == 'the edge' else 'through'} {_streams_via(load)}: a plurk reaching a follower",
                     f"p50 **{_ms(lat['p50'])}**, p99 {_ms(lat['p99'])}, {load['lost']} lost of "
                     f"{load['deliveries_checked']:,} (from the plurk's created to its first sight"
                     f"{_stream_spread(load)})"
                     if honest else f"p50 {_ms(lat['p50'])}, p99 {_ms(lat['p99'])}{_judge_notes(load)}",
                     "; ".join(f"{g}: {'met' if v else '**not met**'}" for g, v in
                               zip(("p50 <= 30 ms", "p99 <= 150 ms", "0 lost"), ok))
                     + ("" if honest else " (not by one honest measure: rerun)")))
    return rows


def headline_rows():
    """(comparison, figure, goal) of the latest runs: each figure against its peer, measured in
    the same run on the same machine."""
    rows = []
    doc = _load("throughput")
    if doc:
        for label, ratio in (
                ("fastpath alone against nginx's own `memcached_pass` (keep-alive)", "fastpath / memcached_pass"),
                ("fastpath alone against nginx `return 200` (keep-alive)", "fastpath / return 200"),
                ("nginx → fastpath over its unix socket (the stack) against `memcached_pass`",
                 "nginx+fastpath unix / memcached_pass"),
                ("nginx → fastpath against nginx → an upstream that does nothing (unix socket)",
                 "nginx+fastpath unix / nginx+return-200 upstream unix")):
            row = _throughput_row(doc, label, ratio)
            if row:
                rows.append(row)
        ic = doc.get("idle_connections")
        if ic:
            rows.append(("memory of an idle keep-alive connection in fastpath",
                         f"**{ic['bytes_per_connection']:,} bytes**",
                         f"< 2,048: {'met' if ic['bytes_per_connection'] < 2048 else '**not met**'}"))
    doc = _load("connbench")
    if doc:
        for key, label, ratio in (
                ("ab", "no keep-alive, `ab -c 50` through nginx: → fastpath (unix) against `memcached_pass`",
                 "nginx+fastpath unix / memcached_pass"),
                ("connect 1 worker", "new connections straight to fastpath against nginx `return 200`",
                 "fastpath / return 200")):
            r = doc.get(key, {}).get("ratios", {}).get(ratio)
            if r:
                goal = "" if r["goal"] is None else f"≥ {r['goal']:g}x: {'met' if r['met'] else '**not met**'}"
                rows.append((label, f"**{r['median']:.2f}x** (rounds {_span(r['rounds'])})", goal))
    doc = _load("longpoll")
    if doc:
        held = doc.get("held", {})
        if held:
            cells = [f"{_kb(p['stack']['per_held']['nginx+fastpath']['pss_bytes'])} / "
                     f"{_kb(p['nchan']['per_held']['nchan nginx']['pss_bytes'])} at {int(n):,}"
                     for n, p in held.items()]
            below = all(p["stack"]["per_held"]["nginx+fastpath"]["pss_bytes"]
                        <= p["nchan"]["per_held"]["nchan nginx"]["pss_bytes"] for p in held.values())
            rows.append(("memory per held long-poll: nginx + fastpath / nchan (PSS)", "; ".join(cells),
                         f"≤ nchan's: {'met' if below else '**not met**'}"))
        fan = doc.get("fanout") or {}
        if fan.get("stack", {}).get("last_answer_s") and fan.get("nchan", {}).get("last_answer_s"):
            s_ms, n_ms = fan["stack"]["last_answer_s"] * 1000, fan["nchan"]["last_answer_s"] * 1000
            rows.append((f"a post reaching {doc['fanout_followers']:,} held followers, against nchan's publish",
                         f"**{s_ms:.0f} ms** / {n_ms:.0f} ms ({s_ms / n_ms:.2f}x)", _goals(doc, "fan-out")))
        long = (doc.get("load") or {}).get("long") or {}
        if "delivery_p50_ms" in long:
            rows.append((f"locust, {long['users']} long-polling users: a plurk reaching a follower",
                         f"p50 **{long['delivery_p50_ms']:.0f} ms**, p99 {long.get('delivery_p99_ms', 'n/a')} ms, "
                         f"{long['lost']} lost of {long['deliveries_checked']:,}", _goals(doc, "load:")))
    return rows


def headline():
    """The README's table: :func:`headline_rows` with the runs' commits and a link to the rest."""
    commits = sorted({d["machine"]["commit"] for d in map(_load, ("throughput", "connbench", "longpoll", EDGE_RUN)
                                                                 + STREAM_LOADS + ("tls", "edgetls", "onetoken"))
                      if d and d.get("machine", {}).get("commit")})
    out = _head("comparison (one run each, 2 shared cores; read the ratios)", "figure", "goal")
    out += [f"| {a} | {b} | {c} |" for a, b, c in headline_rows() + edge_headline_rows() + public_face_headline_rows()]
    out.append("")
    out.append(f"Measured at {', '.join(commits) or 'n/a'} by `make bench`; every table, the history of the "
               f"runs and what each figure means: [docs/benchmarks.md](docs/benchmarks.md).")
    return "\n".join(out) + "\n"


START, END = "<!-- bench:start (bench/report.py --write-readme) -->", "<!-- bench:end -->"
HEADLINE_START = "<!-- headline:start (bench/report.py --write-readme) -->"
HEADLINE_END = "<!-- headline:end -->"


def _write_between(path, start, end, text):
    """Replace what lies between the markers ``start`` and ``end`` in ``path`` with ``text``."""
    with open(path) as fh:
        doc = fh.read()
    if start not in doc or end not in doc:
        print(f"{os.path.relpath(path, ROOT)} has no {start} marker; not written", file=sys.stderr)
        return False
    head, rest = doc.split(start, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as fh:
        fh.write(head + start + "\n" + text.rstrip() + "\n" + end + tail)
    print(f"{os.path.relpath(path, ROOT)}: tables written", file=sys.stderr)
    return True


if __name__ == "__main__":
    main()
