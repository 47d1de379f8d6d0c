"""The namespace cluster (issue 16) with 1 and with 2 web hosts, side by side in one run.

    .venv/bin/python bench/cluster.py [--web-hosts 1,2] [--users 2000] [--steady 60] [--wrk-seconds 15]

For each size, a fresh cluster (plurksite.cluster: balancer, N web hosts, 3 memcached hosts,
PostgreSQL, a client host; all on this machine's 2 cores) and, from the client host:

1. poll throughput through the balancer: wrk (2 threads, 200 keep-alive connections, 10,000
   users' tokens at random: fastpath hits) for --wrk-seconds: requests/s, p50, p99;
2. delivery under the drills' load profile (plurksite.cluster.drills.LOAD_PROFILE): --users
   long-polling locust users for --steady seconds without a fault: delivery latency from a
   plurk's commit to a follower's first sight (p50, p95, max), requests/s, failures, lost.

Every host shares the same two cores, so a second web host adds processes, not CPU: the ratio
says what spreading the web tier costs or gains here, not what a second machine would add.
Results: bench/results/cluster.json.  Needs root (network namespaces).
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import ROOT, progress, write_result, wrk_figures  # noqa: E402
from bench.throughput import LUA  # noqa: E402

PYTHON = sys.executable
MANAGE = os.path.join(ROOT, "manage.py")


def _wrk(cluster, seconds, tokens_file, script):
    from plurksite.cluster import topology
    from plurksite.services import find_binary

    argv = [find_binary("wrk", "wrk"), "-t2", "-c200", f"-d{seconds}s", "--latency", "-s", script,
            topology.site_url(), "--", tokens_file, "token"]     # https (plain HTTP only redirects)
    out = cluster.run_on("plk-client", argv, timeout=seconds + 60).stdout
    got = wrk_figures(out)
    if got["rps"] is None:
        raise RuntimeError(f"wrk said: {out[-500:]}")
    return {"rps": got["rps"], **{k: None if got[k] is None else round(got[k], 2) for k in ("p50_ms", "p99_ms")},
            "non_2xx": got["non_2xx"], "socket_errors": got["socket_errors"]}


def _tokens(cluster, work, count=10_000):
    out = os.path.join(work, "wrk-accounts.json")
    done = cluster.run_on("plk-client", [PYTHON, MANAGE, "loadusers", str(count), "--prefix",
                                         f"w{int(time.time()) % 10**7}_", "--out", out, "--warm"], timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"loadusers failed: {done.stderr[-500:]}")
    with open(out) as fh:
        accounts = json.load(fh)
    path = os.path.join(work, "tokens.txt")
    with open(path, "w") as fh:
        for i, account in enumerate(accounts):
            fh.write(f"{i} {account['token']}\n")
    return path


def measure(web_hosts, users, steady_s, wrk_seconds):
    from plurksite.cluster import drills, topology
    from plurksite.cluster.harness import Cluster

    work = tempfile.mkdtemp(prefix="plurk-cluster-bench-")
    script = os.path.join(work, "poll.lua")
    with open(script, "w") as fh:
        fh.write(LUA)
    progress(f"{web_hosts} web host(s): bringing the cluster up")
    with Cluster(hosts=topology.hosts(web_hosts=web_hosts), say=lambda text: progress(f"  {text}")) as cluster:
        tokens = _tokens(cluster, work)
        _wrk(cluster, 3, tokens, script)                    # warm-up: connections, caches
        progress(f"{web_hosts} web host(s): wrk {wrk_seconds}s through the balancer")
        wrk = _wrk(cluster, wrk_seconds, tokens, script)
        progress(f"  {wrk}")
        report = drills.run_drills(cluster, (), users=users, steady_s=steady_s,
                                   say=lambda text: progress(f"  {text}"))
    steady = report["steady"]
    progress(f"{web_hosts} web host(s): delivery {steady}")
    return {"web_hosts": web_hosts, "wrk": wrk, "delivery": steady, "lost_total": report["lost_total"],
            "problems": report["problems"], "load_profile": report["load_profile"], "users": users}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--web-hosts", default="1,2")
    ap.add_argument("--users", type=int, default=2000)
    ap.add_argument("--steady", type=float, default=60.0, help="seconds of locust load measured")
    ap.add_argument("--wrk-seconds", type=int, default=15)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench/cluster.py: the cluster needs root (network namespaces); run it as root")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "plurksite.settings")
    runs = [measure(int(n), args.users, args.steady, args.wrk_seconds) for n in args.web_hosts.split(",")]
    by = {r["web_hosts"]: r for r in runs}
    ratios = {}
    if 1 in by and 2 in by:
        ratios = {"poll_rps_2_over_1": round(by[2]["wrk"]["rps"] / by[1]["wrk"]["rps"], 2)}
    path = write_result("cluster", {
        "what": "the namespace cluster (balancer, N web hosts, 3 memcached, PostgreSQL, client) on one "
                "2-core machine: poll throughput through the balancer (wrk -t2 -c200, fastpath hits) and "
                "delivery latency under long-polling locust users, with 1 and 2 web hosts",
        "runs": runs, "ratios": ratios})
    progress(f"results: {path}")
    for r in runs:
        d, w = r["delivery"], r["wrk"]
        lat = d["latency_s"]
        print(f"{r['web_hosts']} web host(s): polls {w['rps']:.0f} req/s (p99 {w['p99_ms']} ms); "
              f"{r['users']} long-polling users: {d['requests_per_s']} req/s, {d['failures']} failed, "
              f"delivery p50 {lat['p50']} s p95 {lat['p95']} s max {lat['max']} s, lost {d['lost']}")
    return 0 if all(not r["problems"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
