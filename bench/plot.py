"""Draw PNG plots from bench/results/*.json (matplotlib, Agg).  `python bench/plot.py`"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.common import RESULTS_DIR  # noqa: E402


def _load(name):
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    return json.load(open(path)) if os.path.exists(path) else None


def throughput(doc):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    levels = doc["concurrency"]
    for name, points in doc["configs"].items():
        xs = [c for c in levels if str(c) in points]
        ax1.plot(xs, [points[str(c)]["rps"] for c in xs], marker="o", label=name)
    ax1.set(xlabel="concurrent keep-alive connections (wrk -t1)", ylabel="requests/s", xscale="log",
            title="Poll throughput, 10,000 per-user keys")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=.3)
    c = str(levels[0])
    names = [n for n in doc["configs"] if c in doc["configs"][n]]
    p50 = [doc["configs"][n][c]["p50_ms"] or 0 for n in names]
    p99 = [doc["configs"][n][c]["p99_ms"] or 0 for n in names]
    xs = range(len(names))
    ax2.bar([x - .2 for x in xs], p50, width=.4, label="p50")
    ax2.bar([x + .2 for x in xs], p99, width=.4, label="p99")
    ax2.set_xticks(list(xs), names, rotation=20, fontsize=8)
    ax2.set(ylabel="ms", yscale="log", title=f"Latency at c={c}")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS_DIR, "throughput.png"), dpi=110)


def fanout(doc):
    fig, ax = plt.subplots(figsize=(6, 4))
    labels, values = [], []
    for run in doc["runs"]:
        past = (f" h{run['history']}" if run.get("history") else "") + \
            (f" b{run['backlog']}" if run.get("backlog") else "")
        labels.append(f"{run['backend']}\n{run['memcached_servers']}mc {run['followers']//1000}k{past} {run['phase']}")
        values.append(run["seconds"])
    ax.bar(range(len(values)), values)
    ax.axhline(1.0, color="red", linestyle="--", label="goal (10k < 1 s)")
    ax.set_xticks(range(len(values)), labels, fontsize=6, rotation=45)
    ax.set(ylabel="seconds from commit to all entries written", title="Fan-out of one plurk")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS_DIR, "fanout.png"), dpi=110)


def delivery(docs):
    fig, ax = plt.subplots(figsize=(6, 4))
    names, p50, p95, mx = [], [], [], []
    for name, doc in docs:
        lat = doc["delivery_latency_s"]
        if lat["p50"] is None:
            continue
        wait = doc.get("knobs", {}).get("PLURK_LOAD_POLL_WAIT", "2")
        names.append(f"{name}\n{doc['users']} users, poll ~{float(wait):g} s")
        p50.append(lat["p50"]), p95.append(lat["p95"]), mx.append(lat["max"])
    xs = range(len(names))
    ax.bar([x - .25 for x in xs], p50, width=.25, label="p50")
    ax.bar(list(xs), p95, width=.25, label="p95")
    ax.bar([x + .25 for x in xs], mx, width=.25, label="max")
    ax.set_xticks(list(xs), names)
    ax.set(ylabel="seconds, commit to first sight", title="Delivery latency")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS_DIR, "delivery.png"), dpi=110)


def load_run(name, doc):
    """One locust run over time: users, requests/s and failures/s (locust), and the CPU of each part
    of the stack and of locust (100% = one core)."""
    history, series = doc.get("locust_history"), doc.get("resource_series")
    if not history or not series:
        return False
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    t0 = history[0][0]
    ts = [h[0] - t0 for h in history]
    ax1.plot(ts, [h[2] for h in history], label="requests/s")
    ax1.plot(ts, [h[3] for h in history], label="failures/s", color="red")
    ax1.set(ylabel="per second", title=f"{name}: {doc['users']} locust users in {doc['processes']} "
            f"process(es); {doc['requests']} requests, {doc['failures']} failures, {doc['lost']} lost")
    users = ax1.twinx()
    users.plot(ts, [h[1] for h in history], color="gray", linestyle=":", label="users")
    users.set_ylabel("users")
    ax1.legend(loc="upper left")
    users.legend(loc="lower right")
    for component, points in series.items():
        if any(cpu for cpu, _ in points):
            ax2.plot(range(len(points)), [cpu for cpu, _ in points], label=component, linewidth=1)
    ax2.set(xlabel="seconds since locust started", ylabel="CPU % (100 = one core; 2 cores)")
    ax2.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS_DIR, f"{name}.png"), dpi=110)
    return True


def _ratio_panel(ax, sweep, label, claimed, title, ylabel):
    """One curve per total (median paired ratio, the rounds' range as error bars), 1.0 and the
    claimed break-even marked."""
    for total, rows in sweep.items():
        pts = [(r["atr"], r["ratios"][label], r["ratios"][label + " rounds"]) for r in rows if label in r["ratios"]]
        if not pts:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        err = [[y - min(p[2]) for y, p in zip(ys, pts)], [max(p[2]) - y for y, p in zip(ys, pts)]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=f"{int(total):,} descriptors")
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axvline(claimed, color="red", linestyle="--", linewidth=1, label=f"claimed break-even ({claimed:g})")
    ax.set(xlabel="active / total (ATR)", ylabel=ylabel, title=title, xlim=(0, 1.05))
    ax.grid(alpha=.3)
    ax.legend(fontsize=8)


def atr(doc):
    """Like the 2010 original: x = ATR, y = epoll/poll, one curve per total; fastpath above, the
    kernel-only control below; throughput on the left, CPU per request on the right."""
    claimed = doc["config"]["claimed_break_even"]
    parts = [(name, doc[name]["sweep"]) for name in ("fastpath", "control") if doc.get(name)]
    fig, axes = plt.subplots(len(parts), 2, figsize=(12, 4.5 * len(parts)), squeeze=False)
    labels = {"fastpath": ("epoll/poll req/s", "poll/epoll CPU per request", "request"),
              "control": ("epoll/poll rate", "poll/epoll CPU per token", "token")}
    for row, (name, sweep) in zip(axes, parts):
        rate, cpu, unit = labels[name]
        what = "fastpath (one worker, libevent)" if name == "fastpath" else "control (pipetest: raw poll / epoll_wait)"
        _ratio_panel(row[0], sweep, rate, claimed, f"{what}: throughput",
                     f"epoll / poll {'requests' if unit == 'request' else 'tokens'}/s (above 1: epoll ahead)")
        _ratio_panel(row[1], sweep, cpu, claimed, f"{what}: CPU per {unit}",
                     f"poll / epoll CPU per {unit} (above 1: epoll cheaper)")
    m = doc["machine"]
    fig.suptitle(f"epoll against poll by active ratio: Linux {m['kernel']}, {m['cpus']} CPUs {m['host_cpu']}, "
                 f"{m['date'][:10]}, median of {doc['config']['rounds']} paired rounds", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS_DIR, "atr.png"), dpi=110)


def connbench(doc):
    """Requests per second without keep-alive: ab through nginx, and new connections straight to
    the server with one and two workers; the seeds' figures as lines."""
    groups = [(key, doc[key]["configs"]) for key in ("ab", "connect 1 worker", "connect 2 workers") if doc.get(key)]
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 4.5), squeeze=False)
    seeds = list(doc.get("seeds", {}).values())
    for ax, (key, configs) in zip(axes[0], groups):
        names = list(configs)
        ax.bar(range(len(names)), [configs[n]["rps"] for n in names])
        ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
        title = f"ab -c {doc['config']['concurrency']} -n {doc['config']['ab_requests']}" if key == "ab" else key
        ax.set(ylabel="requests/s, one connection each", title=title)
        if key == "ab" and seeds:
            ax.axhline(seeds[0]["rps"], color="red", linestyle="--", label="Plurk 2009 (ab -c 50, laptop)")
        elif len(seeds) > 1:
            ax.axhline(seeds[1]["rps_per_core"] * (2 if "2" in key else 1), color="red", linestyle="--",
                       label="leader-follower, per core used")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS_DIR, "connbench.png"), dpi=110)


def longpoll(doc):
    """Memory per held request against nchan's per subscriber, and the fan-out times."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    counts = list(doc["held"])
    xs = range(len(counts))
    series = [("fastpath", lambda p: p["stack"]["per_held"]["fastpath"]),
              ("nginx + fastpath", lambda p: p["stack"]["per_held"]["nginx+fastpath"]),
              ("nchan", lambda p: p["nchan"]["per_held"]["nchan nginx"])]
    for i, (label, get) in enumerate(series):
        ax1.bar([x + (i - 1) * .27 for x in xs], [get(doc["held"][c])["pss_bytes"] / 1024 for c in counts],
                width=.27, label=label)
    ax1.axhline(1.0, color="red", linestyle="--", linewidth=1, label="goal for fastpath (1 KB)")
    ax1.set_xticks(list(xs), [f"{int(c):,} held" for c in counts])
    ax1.set(ylabel="KB per held request (PSS growth)", title="Held long-polls against nchan subscribers")
    ax1.legend(fontsize=8)
    fan = doc.get("fanout")
    if fan:
        values = [fan["stack"]["last_answer_s"] or 0, fan["nchan"]["last_answer_s"] or 0]
        labels = ["plurk via API\n-> held followers", "nchan publish\n-> subscribers"]
        colors = ["tab:orange", "tab:green"]
        if (d := fan.get("delivery")):
            # the push layer alone: answers stored by the bench, one notice (no writer)
            values += [d["stack"]["last_answer_s"] or 0, d["nchan"]["last_answer_s"] or 0]
            labels += ["stored + notice\n-> held followers", "nchan publish\n(same rounds)"]
            colors += ["tab:blue", "tab:green"]
        ax2.bar(range(len(values)), values, color=colors)
        ax2.axhline(0.5, color="red", linestyle="--", linewidth=1, label="goal (0.5 s)")
        ax2.set_xticks(list(range(len(values))), labels, fontsize=8)
        ax2.set(ylabel="seconds, before the POST to the last answer",
                title=f"Fan-out to {doc['fanout_followers']:,}")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS_DIR, "longpoll.png"), dpi=110)


def longpoll_edge(doc, fresh_docs):
    """Streams and the edge against nchan (bench/longpoll.py, issue 31): memory per held
    connection by mode (user space and kernel), and the fan-out and the push layer alone by mode."""
    modes = [("stream-edge", "stream\nedge"), ("longpoll-edge", "long-poll\nedge"),
             ("stream-nginx", "stream\nnginx"), ("stack", "long-poll\nnginx"),
             ("nchan-eventsource", "nchan\nEventSource"), ("nchan", "nchan\nlong-poll")]
    # each mode's figure from the run where it was held first on fresh servers, else the main run's
    best = {}
    count, point = max(doc["held"].items(), key=lambda kv: int(kv[0]), default=(None, {}))
    best.update({k: v for k, v in point.items()})
    for fdoc, fresh in fresh_docs:
        for p in fdoc.get("held", {}).values():
            best.update({k: p[k] for k in fresh if k in p})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    shown = [(k, label) for k, label in modes if k in best]
    xs = range(len(shown))
    user = [best[k]["per_held"]["path"]["pss_bytes"] / 1024 for k, _ in shown]
    kern = [(best[k].get("kernel_per_held", {}).get("slab_bytes_both_ends") or 0) / 1024 for k, _ in shown]
    ax1.bar([x - .2 for x in xs], user, width=.4, label="user space, every process on the path (PSS)")
    ax1.bar([x + .2 for x in xs], kern, width=.4, label="kernel slab, both ends of the connection")
    ax1.axhline(2.0, color="red", linestyle="--", linewidth=1, label="goal on the edge (2 KB)")
    ax1.set_xticks(list(xs), [label for _, label in shown], fontsize=8)
    ax1.set(ylabel="KB per held connection", title="Held connections (10,000; fresh servers where measured)")
    ax1.legend(fontsize=7)
    fan = doc.get("fanout") or {}
    runs = [("fan-out (post via API)", fan.get("modes") or {}),
            ("push layer alone", (fan.get("delivery") or {}).get("modes") or {})]
    keys = [("stream-edge", "stream edge"), ("longpoll-edge", "long-poll edge"), ("stream-nginx", "stream nginx"),
            ("longpoll-nginx", "long-poll nginx"), ("nchan-eventsource", "nchan EventSource"),
            ("nchan-longpoll", "nchan long-poll")]
    width = .8 / len(keys)
    for i, (key, label) in enumerate(keys):
        ax2.bar([j + (i - len(keys) / 2 + .5) * width for j in range(len(runs))],
                [(r.get(key) or {}).get("last_answer_s") or 0 for _, r in runs], width=width, label=label)
    ax2.set_xticks(range(len(runs)), [t for t, _ in runs])
    ax2.set(ylabel="seconds to the last of the held followers (median round)",
            title=f"Fan-out to {doc['fanout_followers']:,}")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS_DIR, "longpoll-edge.png"), dpi=110)


def main():
    made = []
    for name, draw in (("atr", atr), ("connbench", connbench)):
        if (doc := _load(name)):
            draw(doc)
            made.append(f"{name}.png")
    if (doc := _load("throughput")):
        throughput(doc)
        made.append("throughput.png")
    if (doc := _load("fanout")):
        fanout(doc)
        made.append("fanout.png")
    docs = [(n, d) for n in ("load", "load-10k") if (d := _load(n))]
    if docs:
        delivery(docs)
        made.append("delivery.png")
    for name, doc in docs:
        if name == "load-10k" and load_run(name, doc):
            made.append(f"{name}.png")
    if (doc := _load("longpoll")) and doc.get("held"):
        longpoll(doc)
        made.append("longpoll.png")
    if (doc := _load("longpoll-edge")) and doc.get("held"):
        fresh = [(d, keys) for name, keys in (("longpoll-edge-fresh", {"stream-edge", "nchan-eventsource", "stream-nginx"}),
                                              ("longpoll-edge-fresh-lp", {"longpoll-edge", "stack", "nchan"}))
                 if (d := _load(name))]
        longpoll_edge(doc, fresh)
        made.append("longpoll-edge.png")
    print("plots:", ", ".join(os.path.join(RESULTS_DIR, m) for m in made))


if __name__ == "__main__":
    main()
