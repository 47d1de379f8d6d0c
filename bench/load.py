"""`make load`: the locust simulation against the stack, with a delivery verdict.

    .venv/bin/python bench/load.py [--users 300] [--spawn-rate 50] [--run-time 60]
                                   [--processes N] [--host URL] [--quick]

Starts the stack (plurksite.stack) unless --host is given or PLURK_HTTP already answers, creates
a few celebrity accounts, runs locust headless, then merges every process's records and reports:
delivery latency (post committed -> first seen by a follower, p50/p95/max), messages lost (a
follower who followed before the post and polled after it never saw it: must be 0), request
failures, and the cache hit ratio the pollers saw.  Exit status 1 when anything was lost or failed.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import requests  # noqa: E402

from bench.common import ROOT, progress, write_result  # noqa: E402


def _percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def make_accounts(count, prefix, path, env, celebrities=0, prefollow=False):
    """Logged-in accounts made in bulk by `manage.py loadusers` (no password hashing under load)."""
    extra = ["--celebrities", str(celebrities), "--prefollow"] if prefollow else []
    subprocess.run([sys.executable, os.path.join(ROOT, "manage.py"), "loadusers", str(count),
                    "--prefix", prefix, "--out", path, *extra], check=True, cwd=ROOT, env=env,
                   stdout=subprocess.DEVNULL)
    with open(path) as fh:
        return json.load(fh)


def judge(records_dir):
    """Merge every process's records and apply the delivery rule."""
    posts, follows, seen, polls = [], [], {}, {}
    cache = {"HIT": 0, "MISS": 0}
    truncated = 0
    for path in glob.glob(os.path.join(records_dir, "*.json")):
        with open(path) as fh:
            rec = json.load(fh)
        posts += rec["posts"]
        follows += rec["follows"]
        for user, item_id, t in rec["seen"]:
            key = (user, item_id)
            seen[key] = min(t, seen.get(key, t))
        for user, t in rec["polls"].items():
            polls[user] = max(t, polls.get(user, 0))
        for k in cache:
            cache[k] += rec["cache"][k]
        truncated += rec["truncated"]
    followers = {}
    for follower, followee, t in follows:
        followers.setdefault(followee, []).append((follower, t))
    latencies, lost, checked = [], [], 0
    for author, plurk_id, started, committed in posts:
        for follower, followed_at in followers.get(author, []):
            if followed_at >= started:
                continue                     # followed after the post began: not owed it
            first = seen.get((follower, plurk_id))
            if first is not None:
                latencies.append(max(0.0, first - committed))
                checked += 1
            elif polls.get(follower, 0) > committed:
                lost.append([author, plurk_id, follower])
                checked += 1
    total = cache["HIT"] + cache["MISS"]
    return {
        "plurks_posted": len(posts),
        "deliveries_checked": checked,
        "lost": len(lost),
        "lost_examples": lost[:10],
        "delivery_latency_s": {"p50": _percentile(latencies, 50), "p95": _percentile(latencies, 95),
                               "max": max(latencies) if latencies else None},
        "poll_responses": total,
        "hit_ratio": cache["HIT"] / total if total else None,
        "truncated_polls": truncated,
    }


def _stats_failures(csv_prefix):
    path = csv_prefix + "_stats.csv"
    if not os.path.exists(path):
        return None, None
    import csv
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    agg = next((r for r in rows if r["Name"] == "Aggregated"), None)
    if agg is None:
        return None, None
    return int(agg["Request Count"]), int(agg["Failure Count"])


def run(host, users, spawn_rate, run_time, processes, celebrities, stack_env, prefollow=False):
    work = tempfile.mkdtemp(prefix="plurk-load-")
    records = os.path.join(work, "records")
    setup = os.path.join(work, "setup.json")
    run_id = f"r{os.getpid()}x{int(time.time()) % 10**6}_"
    env = dict(os.environ, **stack_env, DJANGO_SETTINGS_MODULE="plurksite.settings")
    accounts = make_accounts(users + celebrities, run_id, os.path.join(work, "accounts.json"), env,
                             celebrities, prefollow)
    with open(setup, "w") as fh:
        json.dump({"celebrities": accounts[:celebrities], "users": accounts[celebrities:]}, fh)
    if prefollow:
        # the bulk-made graph published nothing: write every answer once, as a warm cache would hold
        progress("warming the cache (checkcache --fix) ...")
        subprocess.run([sys.executable, os.path.join(ROOT, "manage.py"), "checkcache", "--fix"],
                       cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    env = dict(os.environ, PLURK_LOAD_RECORDS=records, PLURK_LOAD_SETUP=setup)
    argv = [os.path.join(os.path.dirname(sys.executable), "locust"), "-f",
            os.path.join(ROOT, "locustfiles", "plurkers.py"), "--headless", "--host", host,
            "-u", str(users), "-r", str(spawn_rate), "-t", f"{run_time}s", "--stop-timeout", "5",
            "--csv", os.path.join(work, "locust"), "--only-summary", "--loglevel", "WARNING"]
    if processes > 1:
        argv += ["--processes", str(processes)]
    progress(f"locust: {users} users, {run_time}s, against {host} ...")
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    out_lines = []
    import threading

    def reader():
        for line in proc.stdout:
            out_lines.append(line)
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    while proc.poll() is None:
        time.sleep(5)
        requests_, failures = _stats_failures(os.path.join(work, "locust"))
        progress(f"  {time.monotonic() - started:5.0f}s elapsed"
                 + (f", {requests_} requests, {failures} failures" if requests_ is not None else ""))
    t.join(timeout=5)
    requests_, failures = _stats_failures(os.path.join(work, "locust"))
    verdict = judge(records)
    verdict.update({"users": users, "run_time_s": run_time, "processes": processes,
                    "requests": requests_, "failures": failures, "locust_exit": proc.returncode})
    if proc.returncode not in (0, 1) or requests_ is None:
        verdict["locust_output_tail"] = "".join(out_lines[-20:])
    return verdict


SERVICES = {  # how each part of the stack shows up in /proc/<pid>/cmdline
    "nginx": lambda cmd: cmd.startswith("nginx"),
    "fastpath": lambda cmd: "-m fastpath" in cmd,
    "memcached": lambda cmd: "memcached" in cmd.split(" ")[0],
    "gunicorn": lambda cmd: "gunicorn" in cmd and "plurksite.wsgi" in cmd,
}


class StackSampler:
    """Every second: CPU (from /proc/<pid>/stat utime+stime) and RSS of nginx, fastpath, memcached
    and gunicorn, each summed over its processes (masters and workers)."""

    def __init__(self, interval=1.0):
        import threading
        self.interval = interval
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ticks = os.sysconf("SC_CLK_TCK")

    def _read(self):
        totals = {name: {"cpu_s": 0.0, "rss_kb": 0, "processes": 0} for name in SERVICES}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/status") as fh:
                    rss = next((int(ln.split()[1]) for ln in fh if ln.startswith("VmRSS")), 0)
            except (OSError, ValueError, IndexError):
                continue
            for name, match in SERVICES.items():
                if match(cmd):
                    t = totals[name]
                    t["cpu_s"] += (int(fields[11]) + int(fields[12])) / self._ticks
                    t["rss_kb"] += rss
                    t["processes"] += 1
                    break
        return totals

    def _run(self):
        last, last_t = self._read(), time.monotonic()
        while not self._stop.wait(self.interval):
            now, now_t = self._read(), time.monotonic()
            self.samples.append({name: {"cpu_pct": round(100 * (now[name]["cpu_s"] - last[name]["cpu_s"]) / (now_t - last_t), 1),
                                        "rss_mb": round(now[name]["rss_kb"] / 1024, 1),
                                        "processes": now[name]["processes"]} for name in SERVICES})
            last, last_t = now, now_t

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)
        summary = {}
        for name in SERVICES:
            cpu = [s[name]["cpu_pct"] for s in self.samples]
            rss = [s[name]["rss_mb"] for s in self.samples]
            if cpu:
                summary[name] = {"cpu_pct_mean": round(sum(cpu) / len(cpu), 1), "cpu_pct_max": max(cpu),
                                 "rss_mb_max": max(rss), "processes": self.samples[-1][name]["processes"]}
        return summary


def _stack_running(host):
    try:
        requests.get(host + "/Poll/getUnreadCount", timeout=2)
        return True
    except requests.RequestException:
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(description="Run the locust simulation and judge delivery.")
    ap.add_argument("--users", type=int, default=300)
    ap.add_argument("--spawn-rate", type=float, default=50)
    ap.add_argument("--run-time", type=int, default=60)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--celebrities", type=int, default=5)
    ap.add_argument("--host", default=None, help="base URL (default: PLURK_HTTP; started if not running)")
    ap.add_argument("--quick", action="store_true", help="30 users for 30 s (the CI-sized run)")
    ap.add_argument("--result-name", default="load")
    ap.add_argument("--prefollow", action="store_true",
                    help="create the social graph in bulk before the run (for 10,000 users)")
    args = ap.parse_args(argv)
    if args.quick:
        args.users, args.run_time, args.spawn_rate = 30, 30, 10
    from plurksite.config import load

    stack = None
    config = load()                  # the same PLURK_* the stack runs with (its database)
    host = args.host
    if host is None:
        host = config.base_url
        if not _stack_running(host):
            from plurksite.stack import Stack
            subprocess.run([sys.executable, os.path.join(ROOT, "manage.py"), "migrate", "--noinput", "-v", "0"],
                           check=True, cwd=ROOT)
            progress(f"starting the stack at {host} ...")
            stack = Stack(config).start()
    sampler = StackSampler().start()
    try:
        verdict = run(host, args.users, args.spawn_rate, args.run_time, args.processes, args.celebrities,
                      config.to_env(), args.prefollow)
    finally:
        verdict_resources = sampler.stop()
        if stack is not None:
            stack.stop()
    verdict["stack_resources"] = verdict_resources
    path = write_result(args.result_name, verdict)
    lat = verdict["delivery_latency_s"]
    fmt = (lambda v: "n/a" if v is None else f"{v * 1000:.0f} ms")
    print(f"\nplurks posted {verdict['plurks_posted']}, deliveries checked {verdict['deliveries_checked']}, "
          f"LOST {verdict['lost']}")
    print(f"delivery latency p50 {fmt(lat['p50'])}, p95 {fmt(lat['p95'])}, max {fmt(lat['max'])}")
    print(f"requests {verdict['requests']}, failures {verdict['failures']}, "
          f"poll hit ratio {verdict['hit_ratio'] if verdict['hit_ratio'] is None else round(verdict['hit_ratio'], 4)}")
    for name, r in verdict_resources.items():
        print(f"  {name:10s} CPU mean {r['cpu_pct_mean']:6.1f}% max {r['cpu_pct_max']:6.1f}%   "
              f"RSS max {r['rss_mb_max']:7.1f} MB  ({r['processes']} processes)")
    print(f"results: {path}")
    ok = verdict["lost"] == 0 and verdict["failures"] == 0 and verdict["requests"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
