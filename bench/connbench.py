"""Connection benchmarks without keep-alive: the seeds' own figures, reproduced.

    .venv/bin/python bench/connbench.py [--smoke] [--rounds 3] [--requests 50000] [--duration 3]
        [--concurrency 50]

1. The 2009 seed's `ab -c 50 -n 50000` (no -k: one connection per request) through nginx, one
   shared key as the seed had: nginx -> fastpath over TCP and over a unix socket, nginx's own
   `memcached_pass`, nginx `return 200`.  One worker each, not pinned (as the stack runs).
2. New connections per second straight to the server, one worker and memcached on CPU 1, the
   generator (build/bench/atr_client --close: connect, one request with `Connection: close`, read
   the answer and the server's FIN, connect again; --concurrency at once) alone on CPU 0 (until
   1ed7eba memcached shared CPU 0 with the generator, which took ~17% of the generator's CPU from
   fastpath's runs alone and capped them near 0.83x nginx's whenever the generator was the limit):
   fastpath against nginx `return 200`, as nginx listens by default and with `deferred` (accept
   once the request came, as fastpath's TCP listener does; one nginx, two listen sockets).
3. The same with two workers each (fastpath --workers 2, nginx worker_processes 2), nothing
   pinned: every process shares both CPUs.

Interleaved rounds, the order rotated per round, ratios paired within a round (median reported).
Goals (issue 15): fastpath direct >= 0.8x nginx `return 200`; nginx -> fastpath >= 1.0x nginx
`memcached_pass`.  Results: bench/results/connbench.json.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import progress, write_result  # noqa: E402
from bench.loadgen import (CLIENT_CPU, SERVER_CPU, Fastpath, Workdir, exit_on_sigterm,  # noqa: E402
                           fastpath_source, limited_by, per_answer, pin, pinned, raise_fd_limit, run_client,
                           snapshot, start_memcached, tool)
from bench.throughput import BODIES, _settle, _start_nginx, _stop, _tree  # noqa: E402
from plurksite.services import find_binary, free_port  # noqa: E402

# The seeds' published figures (../shared/BACKGROUND.md), printed beside ours.
SEEDS = {
    "plurk 2009, ab -c 50 -n 5000 through nginx, no keep-alive": {"rps": 2417, "mean_ms": 20, "max_ms": 39},
    "leader-follower epoll server, short connections, 12 cores": {"rps": 70000, "rps_per_core": 70000 / 12},
}
AB_CONFIGS = ("nginx+fastpath", "nginx+fastpath unix", "nginx memcached_pass", "nginx return 200")
# ratio -> (numerator, denominator, goal or None, field); above 1 the numerator is ahead: req/s
# divided as is, CPU per connection (of every process that answers: server and memcached)
# divided the other way round, so that it reads as the throughput a CPU-bound server would get
CONNECT = {"fastpath / return 200": ("fastpath", "nginx return 200", 0.8, "rps"),
           "fastpath / return 200 by CPU per connection": ("fastpath", "nginx return 200", None,
                                                           "server_cpu_us_per_request"),
           # fastpath's TCP listener defers accept until the request came (TCP_DEFER_ACCEPT); nginx
           # does only when told (`listen ... deferred`): the same peer with it, beside the goal's
           "fastpath / return 200 deferred": ("fastpath", "nginx return 200 deferred", None, "rps"),
           "fastpath / return 200 deferred by CPU per connection": ("fastpath", "nginx return 200 deferred", None,
                                                                    "server_cpu_us_per_request")}
RATIOS = {
    "ab": {"nginx+fastpath / memcached_pass": ("nginx+fastpath", "nginx memcached_pass", 1.0, "rps"),
           "nginx+fastpath unix / memcached_pass": ("nginx+fastpath unix", "nginx memcached_pass", 1.0, "rps"),
           "nginx memcached_pass / return 200": ("nginx memcached_pass", "nginx return 200", None, "rps"),
           "nginx+fastpath / memcached_pass by CPU per connection": ("nginx+fastpath", "nginx memcached_pass", None,
                                                                     "server_cpu_us_per_request"),
           "nginx+fastpath unix / memcached_pass by CPU per connection": ("nginx+fastpath unix",
                                                                          "nginx memcached_pass", None,
                                                                          "server_cpu_us_per_request")},
    "connect 1 worker": CONNECT,
    "connect 2 workers": CONNECT,
}


def _ab(port, path, token, concurrency, requests):
    """ab without keep-alive; its figures parsed from the report."""
    argv = [find_binary("ab", "apache2-utils"), "-q", "-c", str(concurrency), "-n", str(requests),
            "-H", f"Authorization: Bearer {token}", f"http://127.0.0.1:{port}{path}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    if proc.returncode != 0 or "Requests per second" not in out:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")

    def num(pattern):
        m = re.search(pattern, out, re.M)
        return float(m.group(1)) if m else None

    return {"rps": num(r"^Requests per second:\s+([\d.]+)"), "mean_ms": num(r"^Time per request:\s+([\d.]+) \[ms\] \(mean\)$"),
            "p50_ms": num(r"^\s+50%\s+(\d+)"), "p99_ms": num(r"^\s+99%\s+(\d+)"),
            "max_ms": num(r"^\s+100%\s+(\d+)"), "requests": requests,
            "failed": int(num(r"^Failed requests:\s+(\d+)") or 0),
            "non_2xx": int(num(r"^Non-2xx responses:\s+(\d+)") or 0)}


def _paired(samples, ratios):
    """Median over rounds of each ratio, the rounds beside it, and its goal."""
    out = {}
    for label, (num, den, goal, field) in ratios.items():
        pairs = [(s[num][field], s[den][field]) for s in samples
                 if s.get(num, {}).get(field) and s.get(den, {}).get(field)]
        paired = [a / b if field == "rps" else b / a for a, b in pairs]
        if paired:
            out[label] = {"median": round(statistics.median(paired), 4), "rounds": [round(x, 4) for x in paired],
                          "goal": goal, "met": None if goal is None else statistics.median(paired) >= goal}
    return out


def _medians(samples):
    """Per configuration, the round with the median req/s, every round's req/s beside it."""
    out = {}
    for name in samples[0]:
        points = sorted((s[name] for s in samples if name in s), key=lambda p: p["rps"])
        out[name] = dict(points[(len(points) - 1) // 2], rounds_rps=[s[name]["rps"] for s in samples])
    return out


def _rounds(names, rounds, measure, settle):
    """``rounds`` interleaved rounds of ``measure(name)`` over names, the order rotated per round,
    each run after at most ``settle`` seconds of waiting for quiet CPUs."""
    samples = []
    for rnd in range(rounds):
        k = rnd % len(names)
        sample = {}
        for name in names[k:] + names[:k]:
            _settle(limit_s=settle)
            sample[name] = measure(name)
            p = sample[name]
            progress(f"connbench round {rnd + 1}/{rounds} {name:22s} {p['rps']:>9.0f} req/s  "
                     f"p99 {p['p99_ms']} ms  errors {p.get('failed', 0) + p.get('socket_errors', 0) + p['non_2xx']}")
        samples.append(sample)
    return samples


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a few seconds: small runs, one round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=50000, help="ab -n (the seed: 5000; issue 15: 50000)")
    ap.add_argument("--concurrency", type=int, default=50, help="ab -c, and connections at once for the rate")
    ap.add_argument("--duration", type=float, default=3.0, help="measured seconds of each connection-rate run")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="at most this many seconds of waiting for quiet CPUs before a run")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.requests, args.duration, args.settle = 1, 500, 0.3, 0.3
    raise_fd_limit()
    exit_on_sigterm()
    started = time.monotonic()
    client = tool("atr_client")
    work = Workdir("plurk-connbench-")
    tmp, log, secret_file, tokens_file = work.path, work.log, work.secret_file, work.tokens_file
    with open(tokens_file) as fh:
        uid, token = fh.readline().split()          # one shared key, as the seed had
    results = {"config": {"rounds": args.rounds, "ab_requests": args.requests, "concurrency": args.concurrency,
                          "duration_s": args.duration, "user": int(uid), "fastpath": fastpath_source()},
               "seeds": SEEDS}
    procs = []
    try:
        mc, mc_port = start_memcached(log)
        procs.append(mc)

        # 1. ab through nginx, one worker each, unpinned
        fp = Fastpath(mc_port, secret_file, log, cpu=None)
        fpu = Fastpath(mc_port, secret_file, log, cpu=None, unix=os.path.join(tmp, "fastpath.sock"))
        procs += [fp.proc, fpu.proc]
        upstreams = {"fastpath": fp.port, "fastpath_unix": os.path.join(tmp, "fastpath.sock"),
                     "memcached": mc_port, "ret200": free_port(), "ret200_unix": os.path.join(tmp, "none-ret200.sock")}
        ports = {}
        answering = {}               # config -> the processes that answer its requests
        for name in AB_CONFIGS:
            ports[name] = free_port()
            procs.append(_start_nginx(tmp, name, ports[name], BODIES[name], upstreams, log))
            answering[name] = {"nginx": procs[-1].pid}
            if "fastpath" in name:
                answering[name]["fastpath"] = (fpu if "unix" in name else fp).proc.pid
            if "return 200" not in name:
                answering[name]["memcached"] = mc.pid

        def ab(name):
            path = f"/Poll/getUnreadCount?u={uid}" if "memcached_pass" in name else "/Poll/getUnreadCount"
            before = snapshot(answering[name])
            r = _ab(ports[name], path, token, args.concurrency, args.requests)
            after = snapshot(answering[name])
            cpu = {k: (after["cpu_s"][k] - before["cpu_s"][k]) * 1e6 / args.requests for k in answering[name]}
            r["cpu_us_per_request"] = {k: round(v, 2) for k, v in cpu.items()}
            r["server_cpu_us_per_request"] = round(sum(cpu.values()), 2)
            return r

        samples = _rounds(list(AB_CONFIGS), args.rounds, ab, args.settle)
        results["ab"] = {"configs": _medians(samples), "ratios": _paired(samples, RATIOS["ab"]), "rounds": samples}

        # 2. and 3. new connections per second, one worker pinned, then two workers unpinned
        for workers, key in ((1, "connect 1 worker"), (2, "connect 2 workers")):
            cpu = SERVER_CPU if workers == 1 else None
            # memcached answers fastpath's gets: it is part of the server under test and sits on
            # the server's CPU, so that the generator has its CPU to itself for every peer
            pin([mc.pid], cpu)
            fpw = Fastpath(mc_port, secret_file, log, workers=workers, cpu=cpu)
            port, deferred_port = free_port(), free_port()
            nginx = _start_nginx(tmp, f"return 200 x{workers}", port, BODIES["nginx return 200"], upstreams, log,
                                 extra_listen=f"listen 127.0.0.1:{deferred_port} deferred backlog=4096;",
                                 workers=workers)
            procs += [fpw.proc, nginx]
            pin(_tree(nginx.pid), cpu)
            targets = {"fastpath": (fpw.port, fpw.proc.pid), "nginx return 200": (port, nginx.pid),
                       "nginx return 200 deferred": (deferred_port, nginx.pid)}

            def connect(name):
                port, pid = targets[name]
                argv = pinned([client, "--connect", f"127.0.0.1:{port}", "--connections", str(args.concurrency),
                               "--close", "--duration", str(args.duration), "--warmup", str(min(1.0, args.duration)),
                               "--tokens", tokens_file], CLIENT_CPU if workers == 1 else None)
                r, before, after = run_client(argv, {"server": pid, "memcached": mc.pid})
                srv = per_answer(r, before, after)
                server_pct = srv["cpu_pct"]["server"] / workers
                return {"rps": r["rps"], "connections_per_s": r["connections_per_s"], "p50_ms": r["p50_ms"],
                        "p99_ms": r["p99_ms"], "max_ms": r["max_ms"], "socket_errors": r["closed"] + r["errors"],
                        "non_2xx": r["non_2xx"], "cpu_us_per_request": srv["cpu_us_per_request"],
                        "server_cpu_us_per_request": round(sum(srv["cpu_us_per_request"].values()), 2),
                        "server_cpu_pct": round(server_pct, 1), "client_cpu_pct": r["cpu_pct"],
                        "client_cpu_us_per_request": r["cpu_us_per_answer"], "cpu_busy_pct": srv["cpu_busy_pct"],
                        "limited_by": limited_by(server_pct, r["cpu_pct"], srv["cpu_busy_pct"],
                                                 (SERVER_CPU,) if workers == 1 else tuple(srv["cpu_busy_pct"]))}

            samples = _rounds(list(targets), args.rounds, connect, args.settle)
            results[key] = {"workers": workers, "pinned": workers == 1, "configs": _medians(samples),
                            "ratios": _paired(samples, RATIOS[key]), "rounds": samples}
            _stop(nginx)
            _stop(fpw.proc)
    finally:
        for proc in reversed(procs):
            _stop(proc)
        log.close()
    results["seconds"] = round(time.monotonic() - started, 1)
    path = write_result("connbench", results)
    for key in ("ab", "connect 1 worker", "connect 2 workers"):
        print(f"\n{key}:")
        for name, p in results[key]["configs"].items():
            print(f"  {name:22s} {p['rps']:>9.0f} req/s  p50 {p['p50_ms']} ms  p99 {p['p99_ms']} ms  max {p['max_ms']} ms")
        for label, r in results[key]["ratios"].items():
            goal = "" if r["goal"] is None else f" (goal {r['goal']}: {'met' if r['met'] else 'not met'})"
            print(f"  {label} = {r['median']:.3f}{goal}")
    print(f"results: {path} ({results['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
