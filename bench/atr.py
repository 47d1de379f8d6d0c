"""The active-ratio (ATR) experiment: fastpath's libevent backends, epoll against poll (and select).

    .venv/bin/python bench/atr.py [--smoke] [--totals 1000,10000] [--ratios 0.05,0.1,0.2,...,1]
        [--rounds 3] [--duration 3] [--warmup 1] [--backends epoll,poll,select] [--pipeline 1]
        [--control-duration 1] [--no-fastpath] [--no-control]

The claim under test (docs/benchmarks.md): epoll's cost grows with the active descriptors and
poll's with all of them, so epoll wins below an active/total ratio of ~0.6 and poll wins above it,
by 15-20% when every descriptor is active (2010, pipetest, 1,000 and 10,000 descriptors).

fastpath: one fastpath per backend (`--backend`, one worker each), pinned to CPU 1; memcached
and the load generator (build/bench/atr_client: one process, epoll) on CPU 0.  Per point the
generator opens N keep-alive connections, primes each with one poll, then A = ATR x N of them,
spread evenly, send polls back to back (--pipeline in flight each) while N-A stay idle.  select
only where N keeps every descriptor below FD_SETSIZE (1024).  Interleaved rounds: each round
visits every (N, ATR) once and runs the backends of a point one after another, in an order rotated
from point to point; ratios are paired within a round and the median over rounds is reported.

Per point: requests/s, p50/p99, server CPU microseconds per request (the worker's /proc stat),
ready events per wait (fastpath_loop_events_total / fastpath_loop_waits_total when fastpath
exports them, else null; the worker's sleeps per request always), the generator's own CPU, both
CPUs' busy share, and what limited the point.  Client check, each round: the same generator
against nginx `return 200` (one worker, CPU 1) at the smallest and largest ATR of each N; it
answers faster than fastpath, so the generator can drive more than fastpath takes.

control: build/bench/pipetest (raw poll()/select() against epoll_wait(), T tokens among N socket
descriptors, no other work) on CPU 1 over the same sweep: the kernel's share, without fastpath
or libevent.

Results: bench/results/atr.json; `bench/plot.py` draws bench/results/atr.png.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import progress, write_result  # noqa: E402
from bench.loadgen import (CLIENT_CPU, SERVER_CPU, Fastpath, Workdir, exit_on_sigterm,  # noqa: E402
                           fastpath_source, limited_by, loop_counters, per_answer, pin, pinned, raise_fd_limit,
                           run_client, start_memcached, tool)
from bench.throughput import BODIES, _settle, _start_nginx, _stop, _tree  # noqa: E402
from plurksite.services import free_port  # noqa: E402

RATIOS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
CLAIMED_BREAK_EVEN = 0.6
SUPERPOLL_THRESHOLD = 1.10           # issue 15 item 4: build it only if poll leads by 10% or more
# select() takes descriptors below FD_SETSIZE (1024) only; a worker holds 8 of its own (standard
# streams, libevent's signal pipe, both listeners, memcached) and one more while /metrics is read
SELECT_LIMIT = 1024 - 16
# fastpath's memcached deadline (50 ms in the stack) would fire here: with thousands of
# connections ready at once, one pass of the loop on a shared CPU can take longer than that, and
# a 503 is not the work being measured.  Both backends get the same.
TIMEOUT_MS = 5000

# (numerator backend, denominator backend, field): every ratio reads "above 1: the numerator wins"
FASTPATH_RATIOS = {"epoll/poll req/s": ("epoll", "poll", "rps"),
                   "poll/epoll CPU per request": ("poll", "epoll", "server_cpu_us_per_request"),
                   "epoll/select req/s": ("epoll", "select", "rps"),
                   "select/epoll CPU per request": ("select", "epoll", "server_cpu_us_per_request")}
CONTROL_RATIOS = {"epoll/poll rate": ("epoll", "poll", "rate"),
                  "poll/epoll CPU per token": ("poll", "epoll", "cpu_us_per_token"),
                  "epoll/select rate": ("epoll", "select", "rate"),
                  "select/epoll CPU per token": ("select", "epoll", "cpu_us_per_token")}


def _rotated(items, k):
    k %= len(items)
    return items[k:] + items[:k]


def _schedule(args, totals, ratios, backends):
    """The interleaved order: (round, N, ATR, A, the backends in the order to run them), every
    point once per round, the backends' order rotated from one point to the next."""
    step = 0
    for rnd in range(args.rounds):
        for total in totals:
            for atr in ratios:
                usable = [b for b in backends if b != "select" or total <= SELECT_LIMIT]
                yield rnd, total, atr, max(1, round(atr * total)), _rotated(usable, step)
                step += 1


def _client_argv(client, port, total, active, args, tokens_file):
    return pinned([client, "--connect", f"127.0.0.1:{port}", "--connections", str(total),
                   "--active", str(active), "--pipeline", str(args.pipeline), "--duration", str(args.duration),
                   "--warmup", str(args.warmup), "--tokens", tokens_file], CLIENT_CPU)


def _http_point(argv, pids, admin=None):
    """One generator run against an HTTP server whose worker is pids["worker"]."""
    r, before, after = run_client(argv, pids, admin)
    srv = per_answer(r, before, after)
    server_pct = srv["cpu_pct"]["worker"]
    point = {"rps": r["rps"], "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"], "max_ms": r["max_ms"],
             "answers": r["answers"], "socket_errors": r["closed"] + r["errors"], "non_2xx": r["non_2xx"],
             "server_cpu_us_per_request": srv["cpu_us_per_request"]["worker"],
             "cpu_us_per_request": srv["cpu_us_per_request"], "server_cpu_pct": server_pct,
             "client": {"cpu_pct": r["cpu_pct"], "cpu_us_per_request": r["cpu_us_per_answer"],
                        "events_per_wait": r["events_per_wait"], "sources": r["sources"]},
             "cpu_busy_pct": srv["cpu_busy_pct"],
             "limited_by": limited_by(server_pct, r["cpu_pct"], srv["cpu_busy_pct"])}
    point.update(loop_counters(before, after, r["answers"]))
    return point


def _control_point(pipetest, backend, total, active, args):
    argv = pinned([pipetest, "--backend", backend, "--descriptors", str(total), "--active", str(active),
                   "--duration", str(args.control_duration), "--warmup", str(args.control_warmup)], SERVER_CPU)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120 + args.control_duration)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def _median(points, key):
    """The point with the median ``key`` (the lower middle of an even count), with every round's
    value beside it and errors summed over the rounds."""
    ranked = sorted(points, key=lambda p: p[key])
    point = dict(ranked[(len(ranked) - 1) // 2])
    point["rounds"] = [p[key] for p in points]
    for err in ("socket_errors", "non_2xx"):
        if err in point:
            point[err] = sum(p[err] for p in points)
    return point


def summarize(runs, ratio_defs, key):
    """{str(N): [one row per ATR: medians per backend and the paired ratios]} from per-run records
    ({round, total, atr, active, backend, point})."""
    sweep = {}
    for total in sorted({r["total"] for r in runs}):
        rows = []
        for atr in sorted({r["atr"] for r in runs if r["total"] == total}):
            here = [r for r in runs if r["total"] == total and r["atr"] == atr]
            by = {}
            for r in here:
                by.setdefault(r["backend"], {})[r["round"]] = r["point"]
            row = {"atr": atr, "active": here[0]["active"],
                   "backends": {b: _median(list(pts.values()), key) for b, pts in by.items()}, "ratios": {}}
            for label, (num, den, field) in ratio_defs.items():
                paired = [by[num][rnd][field] / by[den][rnd][field] for rnd in by.get(num, {})
                          if rnd in by.get(den, {}) and by[num][rnd].get(field) and by[den][rnd].get(field)]
                if paired:
                    row["ratios"][label] = round(statistics.median(paired), 4)
                    row["ratios"][label + " rounds"] = [round(x, 4) for x in paired]
            rows.append(row)
        sweep[str(total)] = rows
    return sweep


def break_even(rows, label):
    """The ATRs between which the median ratio crosses 1.0 (epoll ahead below, poll above)."""
    pts = [(row["atr"], row["ratios"].get(label)) for row in rows if row["ratios"].get(label)]
    return [[a0, a1] for (a0, r0), (a1, r1) in zip(pts, pts[1:]) if (r0 - 1) * (r1 - 1) < 0]


def superpoll(sweep):
    """Issue 15 item 4's evidence: the points where poll leads epoll by SUPERPOLL_THRESHOLD or more
    in fastpath, both in requests/s and in server CPU per request (one alone can be noise)."""
    ahead = []
    for total, rows in sweep.items():
        for row in rows:
            rps = row["ratios"].get("epoll/poll req/s")
            cpu = row["ratios"].get("poll/epoll CPU per request")
            if rps and cpu and 1 / rps >= SUPERPOLL_THRESHOLD and 1 / cpu >= SUPERPOLL_THRESHOLD:
                ahead.append({"total": int(total), "atr": row["atr"], "poll/epoll req/s": round(1 / rps, 3),
                              "epoll/poll CPU per request": round(1 / cpu, 3)})
    best = min(((row["ratios"].get("epoll/poll req/s", 9), int(t), row["atr"]) for t, rows in sweep.items()
                for row in rows), default=None)
    return {"threshold": SUPERPOLL_THRESHOLD, "poll_ahead": ahead,
            "largest_poll_lead": None if best is None else
            {"total": best[1], "atr": best[2], "poll/epoll req/s": round(1 / best[0], 3)},
            "build": bool(ahead)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a few seconds: N=200, ATR 0.1 and 1, one round")
    ap.add_argument("--totals", default="1000,10000")
    ap.add_argument("--ratios", default=",".join(map(str, RATIOS)))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0, help="measured seconds per fastpath point")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--pipeline", type=int, default=1, help="requests in flight per active connection")
    ap.add_argument("--backends", default="epoll,poll,select")
    ap.add_argument("--control-duration", type=float, default=1.0)
    ap.add_argument("--control-warmup", type=float, default=0.2)
    ap.add_argument("--settle", type=float, default=3.0,
                    help="at most this many seconds of waiting for quiet CPUs before a point")
    ap.add_argument("--no-fastpath", action="store_true")
    ap.add_argument("--no-control", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.totals, args.ratios, args.rounds = "200", "0.1,1", 1
        args.duration, args.warmup, args.control_duration, args.control_warmup = 0.3, 0.1, 0.2, 0.05
        args.settle = 0.3
    totals = [int(x) for x in args.totals.split(",")]
    ratios = [float(x) for x in args.ratios.split(",")]
    backends = args.backends.split(",")
    raise_fd_limit()
    exit_on_sigterm()
    if os.cpu_count() < 2:
        progress("atr: one CPU only: the server and the load generator share it")
    started = time.monotonic()
    results = {"config": {"totals": totals, "ratios": ratios, "rounds": args.rounds, "duration_s": args.duration,
                          "warmup_s": args.warmup, "pipeline": args.pipeline, "backends": backends,
                          "control_duration_s": args.control_duration, "fastpath_timeout_ms": TIMEOUT_MS,
                          "claimed_break_even": CLAIMED_BREAK_EVEN,
                          "fastpath": fastpath_source(),
                          "cpus": {"server": SERVER_CPU, "client": CLIENT_CPU, "memcached": CLIENT_CPU,
                                   "control": SERVER_CPU}}}
    if not args.no_fastpath:
        results.update(_fastpath_sweep(args, totals, ratios, backends))
    if not args.no_control:
        results["control"] = _control_sweep(args, totals, ratios, backends)
    results["seconds"] = round(time.monotonic() - started, 1)
    path = write_result("atr", results)
    _print(results)
    print(f"results: {path} ({results['seconds']:.0f} s)")


def _fastpath_sweep(args, totals, ratios, backends):
    client = tool("atr_client")
    work = Workdir("plurk-atr-")
    tmp, log, tokens_file = work.path, work.log, work.tokens_file
    procs, servers, runs, checks = [], {}, [], []
    try:
        mc, mc_port = start_memcached(log, cpu=CLIENT_CPU)
        procs.append(mc)
        for b in backends:
            servers[b] = Fastpath(mc_port, work.secret_file, log, backend=b, timeout_ms=TIMEOUT_MS,
                                  max_connections=max(totals) + 1000)
            procs.append(servers[b].proc)
        nginx_port = free_port()
        upstreams = {"fastpath": free_port(), "fastpath_unix": os.path.join(tmp, "none.sock"),
                     "memcached": mc_port, "ret200": free_port(), "ret200_unix": os.path.join(tmp, "none-ret200.sock")}
        nginx = _start_nginx(tmp, "nginx return 200", nginx_port, BODIES["nginx return 200"], upstreams, log)
        procs.append(nginx)
        pin(_tree(nginx.pid), SERVER_CPU)
        in_use = {b: s.backend for b, s in servers.items()}
        progress(f"atr: fastpath backends in use {in_use}")
        for rnd, total, atr, active, order in _schedule(args, totals, ratios, backends):
            for b in order:
                fp = servers[b]
                settled = _settle(limit_s=args.settle)
                point = _http_point(_client_argv(client, fp.port, total, active, args, tokens_file),
                                    {"worker": fp.workers()[0], "memcached": mc.pid}, fp.admin)
                point["settled_s"] = round(settled, 1)
                runs.append({"round": rnd, "total": total, "atr": atr, "active": active, "backend": b, "point": point})
                progress(f"atr round {rnd + 1}/{args.rounds} N={total:<6d} ATR={atr:<4g} {b:6s} "
                         f"{point['rps']:>9.0f} req/s  p99 {point['p99_ms']:.2f} ms  server "
                         f"{point['server_cpu_us_per_request']:.1f} us/req ({point['server_cpu_pct']:.0f}% "
                         f"of CPU {SERVER_CPU})  client {point['client']['cpu_pct']:.0f}%  "
                         f"events/wait {point['events_per_wait']}  errors "
                         f"{point['socket_errors'] + point['non_2xx']}  [{point['limited_by']}]")
            if atr in (min(ratios), max(ratios)):
                _settle(limit_s=args.settle)
                point = _http_point(_client_argv(client, nginx_port, total, active, args, tokens_file),
                                    {"worker": _tree(nginx.pid)[1]})
                checks.append({"round": rnd, "total": total, "atr": atr, "active": active,
                               "backend": "nginx return 200", "point": point})
                progress(f"atr round {rnd + 1}/{args.rounds} N={total:<6d} ATR={atr:<4g} nginx return 200 "
                         f"{point['rps']:>9.0f} req/s  client {point['client']['cpu_pct']:.0f}% "
                         f"[{point['limited_by']}]")
    finally:
        for proc in reversed(procs):
            _stop(proc)
        log.close()
    return {"fastpath": _fastpath_summary(runs, checks, in_use), "superpoll": superpoll(summarize(runs, FASTPATH_RATIOS, "rps"))}


def _fastpath_summary(runs, checks, in_use):
    sweep = summarize(runs, FASTPATH_RATIOS, "rps")
    limits = {}
    for r in runs:
        limits[r["point"]["limited_by"]] = limits.get(r["point"]["limited_by"], 0) + 1
    return {"backends_in_use": in_use, "sweep": sweep, "runs": runs,
            "break_even": _break_evens(sweep, ("epoll/poll req/s", "poll/epoll CPU per request")),
            # the generator's own share of its CPU at its busiest, and what limited the runs
            "client_max_cpu_pct": max((r["point"]["client"]["cpu_pct"] for r in runs), default=None),
            "limited_by": limits, "client_check": _client_check(sweep, checks)}


def _break_evens(sweep, labels):
    return {label: {t: break_even(rows, label) for t, rows in sweep.items()} for label in labels}


def _client_check(sweep, checks):
    """Per checked point: nginx `return 200`'s median req/s through the same generator, against the
    best fastpath backend's; above 1, the generator had room to spare."""
    out = []
    for c_total, rows in summarize(checks, {}, "rps").items():
        for row in rows:
            fp_row = next((r for r in sweep.get(c_total, []) if r["atr"] == row["atr"]), None)
            nginx = row["backends"]["nginx return 200"]
            best = max((p["rps"] for p in fp_row["backends"].values()), default=None) if fp_row else None
            out.append({"total": int(c_total), "atr": row["atr"], "nginx_rps": nginx["rps"],
                        "nginx_client_cpu_pct": nginx["client"]["cpu_pct"], "fastpath_best_rps": best,
                        "nginx/fastpath": round(nginx["rps"] / best, 3) if best else None})
    return out


def _control_sweep(args, totals, ratios, backends):
    pipetest = tool("pipetest")
    runs = []
    for rnd, total, atr, active, order in _schedule(args, totals, ratios, backends):
        for b in order:
            point = _control_point(pipetest, b, total, active, args)
            runs.append({"round": rnd, "total": total, "atr": atr, "active": active, "backend": b, "point": point})
            progress(f"control round {rnd + 1}/{args.rounds} N={total:<6d} ATR={atr:<4g} {b:6s} "
                     f"{point['rate']:>10.0f} tokens/s  {point['cpu_us_per_token']:.2f} us/token  "
                     f"{point['events_per_wait']:.0f} events/wait")
    sweep = summarize(runs, CONTROL_RATIOS, "rate")
    return {"sweep": sweep, "runs": runs,
            "break_even": _break_evens(sweep, ("epoll/poll rate", "poll/epoll CPU per token"))}


def _print(results):
    for name, label, cpu_label in (("fastpath", "epoll/poll req/s", "poll/epoll CPU per request"),
                                   ("control", "epoll/poll rate", "poll/epoll CPU per token")):
        part = results.get(name)
        if not part:
            continue
        print(f"\n{name}: median paired ratios (above 1: epoll ahead)")
        for total, rows in part["sweep"].items():
            print(f"  N={total}: " + "  ".join(
                f"{row['atr']:g}: {row['ratios'].get(label, float('nan')):.2f}/{row['ratios'].get(cpu_label, float('nan')):.2f}"
                for row in rows) + f"   ({label} / {cpu_label})")
    if "superpoll" in results:
        sp = results["superpoll"]
        print(f"\nsuperpoll: poll ahead by >= {sp['threshold']:.2f}x at {sp['poll_ahead'] or 'no point'}; "
              f"largest poll lead {sp['largest_poll_lead']}")


if __name__ == "__main__":
    main()
