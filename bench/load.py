"""`make load`: the locust simulation against the stack, with a delivery verdict.

    .venv/bin/python bench/load.py [--users 300] [--spawn-rate 50] [--run-time 60]
                                   [--processes N] [--host URL] [--quick]
                                   [--prefollow] [--celebrities K] [--zipf S] [--login-users L]
                                   [--poll-wait S] [--write-weight W] [--celeb-wait S]
                                   [--database config|postgresql] [--result-name NAME]
    .venv/bin/python bench/load.py --preset 10k        # `make load-10k`: 10,000 users, see PRESET_10K

Starts the stack (plurksite.stack) unless --host is given or PLURK_HTTP already answers, creates
the accounts in bulk (logged in, answers already cached; with --prefollow the social graph too)
and L accounts with a password through /api/signup (their users log in with /api/login), runs
locust headless (--processes N: locust's distributed mode, N workers; every account is run by one
user of one process), then merges every process's records and reports: delivery latency (post
created -> first seen by a follower, p50/p95/p99/max: the plurk's own timestamp, the clock locust
and the stack share on this machine; a delivery seen before it fails the run, never reads 0 ms), messages lost (a follower who followed before
the post and polled after it never saw it: must be 0), request failures (with their kinds),
exceptions raised in locust tasks, the cache hit ratio the pollers saw, and the CPU and memory of
each part of the stack (nginx, fastpath, memcached, gunicorn, the cache repairer, PostgreSQL when
it started one) and of locust, sampled every second.  Exit status 1, with the reasons, when
anything was lost or failed, a task raised, locust exited non-zero, a locust process that ran
users left no records file, or two processes ran the same account.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import requests  # noqa: E402

from bench.common import ROOT, proc_stat, progress, socket_inodes, write_result  # noqa: E402
from plurksite import delivery as _delivery  # noqa: E402  (the delivery rule, shared with the locustfile)


def make_accounts(count, prefix, path, env, celebrities=0, prefollow=False, zipf=1.2):
    """Logged-in accounts made in bulk by `manage.py loadusers` (no password hashing under load)."""
    # --warm: the accounts' answers are in memcached before the run, as on a running site (their
    # first polls are hits, not 10,000 Django fills during the ramp-up)
    extra = ["--warm"] + (["--celebrities", str(celebrities), "--prefollow", "--zipf", str(zipf)] if prefollow else [])
    subprocess.run([sys.executable, os.path.join(ROOT, "manage.py"), "loadusers", str(count),
                    "--prefix", prefix, "--out", path, *extra], check=True, cwd=ROOT, env=env,
                   stdout=subprocess.DEVNULL)
    with open(path) as fh:
        return json.load(fh)


LOGIN_PASSWORD = "load-login-pass-1"


def make_login_accounts(host, count, prefix):
    """Accounts with a known password, signed up through the public API (Django hashes each
    password: ~0.5 s of CPU, so keep them few); the locust users that take them log in."""
    accounts = []
    for i in range(count):
        account = {"username": f"{prefix}pw{i}", "password": LOGIN_PASSWORD}
        resp = requests.post(host + "/api/signup", json=account, timeout=60)
        if resp.status_code != 201:
            raise SystemExit(f"error: signing up {account['username']} at {host}: {resp.status_code} {resp.text[:200]}")
        accounts.append(account)
    return accounts


def read_records(records_dir):
    """Every locust process's records file (``<pid>.json``)."""
    records = []
    for path in sorted(glob.glob(os.path.join(records_dir, "*.json"))):
        with open(path) as fh:
            records.append(json.load(fh))
    return records


def judge(records_dir, expected_processes=None):
    """Merge every process's records and apply the delivery rule (plurksite/delivery.py).

    With ``expected_processes`` (the locust processes that must have run users), a missing or extra
    records file is a problem: the verdict would otherwise silently judge part of the run."""
    records = read_records(records_dir)
    verdict = _delivery.judge(records)
    with_users = sum(1 for r in records if r.get("users"))
    verdict.update({"record_files": len(records), "record_files_with_users": with_users,
                    "record_files_expected": expected_processes})
    return verdict


def _csv_rows(path):
    import csv
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return list(csv.DictReader(fh))


# the in-locust delivery figures (locustfiles/plurkers.py): in locust's statistics, not HTTP requests
DELIVERY_TYPE = "delivery"


def _stats_failures(csv_prefix):
    """HTTP requests and failures so far (every endpoint but the ``delivery`` figures); (None,
    None) while there are none, or when the file was read half-written (locust rewrites it while
    the run goes on: a short last row)."""
    rows = [r for r in _csv_rows(csv_prefix + "_stats.csv")
            if r["Name"] != "Aggregated" and r["Type"] != DELIVERY_TYPE]
    try:
        counts = [(int(r["Request Count"]), int(r["Failure Count"])) for r in rows]
    except (TypeError, ValueError):
        return None, None
    if not counts:
        return None, None
    return sum(n for n, _ in counts), sum(f for _, f in counts)


def _locust_details(csv_prefix):
    """Per endpoint: requests, failures, median/p95/max response time; every distinct failure
    (endpoint, error, count); every distinct exception raised in a task (count, message, where);
    and locust's per-second history (users, requests/s, failures/s; HTTP only)."""
    endpoints = {}
    for r in _csv_rows(csv_prefix + "_stats.csv"):
        if r["Name"] == "Aggregated":
            continue
        endpoints[f"{r['Type']} {r['Name']}"] = {
            "requests": int(r["Request Count"]), "failures": int(r["Failure Count"]),
            "median_ms": float(r["Median Response Time"] or 0), "p95_ms": float(r["95%"] or 0) if r["95%"] != "N/A" else None,
            "max_ms": float(r["Max Response Time"] or 0), "rps": round(float(r["Requests/s"] or 0), 1)}
    failures = [{"endpoint": f"{r['Method']} {r['Name']}", "error": r["Error"], "count": int(r["Occurrences"])}
                for r in _csv_rows(csv_prefix + "_failures.csv")]
    exceptions = [{"count": int(r["Count"]), "message": r["Message"], "traceback": r["Traceback"][-600:]}
                  for r in _csv_rows(csv_prefix + "_exceptions.csv")]
    history, delivery_rps = [], {}
    rows = _csv_rows(csv_prefix + "_stats_history.csv")
    for r in rows:
        if r["Type"] == DELIVERY_TYPE:
            delivery_rps[r["Timestamp"]] = delivery_rps.get(r["Timestamp"], 0.0) + float(r["Requests/s"])
    for r in rows:
        if r["Name"] != "Aggregated":
            continue
        history.append([int(r["Timestamp"]), int(r["User Count"]),
                        round(max(0.0, float(r["Requests/s"]) - delivery_rps.get(r["Timestamp"], 0.0)), 1),
                        round(float(r["Failures/s"]), 1)])
    return (endpoints, sorted(failures, key=lambda f: -f["count"]),
            sorted(exceptions, key=lambda e: -e["count"]), history)


def stream_via(edge, environ):
    """PLURK_LOAD_STREAM_VIA for locust: without ``--edge`` and without ``$PLURK_LOAD_EDGE`` the
    streams go through nginx, even when the stack's configuration has an edge (PLURK_EDGE has a
    default, and the locustfile falls back to it): a run without --edge is the nginx path's
    figure.  An explicit ``$PLURK_LOAD_STREAM_VIA`` is kept."""
    if environ.get("PLURK_LOAD_STREAM_VIA"):
        return environ["PLURK_LOAD_STREAM_VIA"]
    return "edge" if edge or environ.get("PLURK_LOAD_EDGE") else "nginx"


def streams_used(endpoints):
    """Where the streams went, by locust's own names: "edge", "nginx", both or None."""
    edge = any(name.endswith("(edge stream)") for name in endpoints)
    nginx = any(name.endswith("(stream)") for name in endpoints)
    return {(True, False): "edge", (False, True): "nginx", (True, True): "edge and nginx"}.get((edge, nginx))


def _cpu_times():
    """(busy, total) jiffies of the whole machine, from /proc/stat's first line."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)        # idle + iowait
    return sum(fields) - idle, sum(fields)


def machine_cpu(before, after, components=None):
    """The machine's CPU use between two :func:`_cpu_times` readings, in % of one core (200% on
    2 cores), and what of it was not the stack nor locust (``others``: on this shared machine,
    other agents' tests) when ``components`` (the sampler's mean % per component) is given."""
    busy, total = after[0] - before[0], after[1] - before[1]
    cores = os.cpu_count() or 1
    used = round(100 * cores * busy / total, 1) if total > 0 else None
    out = {"cores": cores, "busy_pct": used}
    if components is not None and used is not None:
        ours = sum(c["cpu_pct_mean"] for c in components.values())
        out["others_pct"] = round(max(0.0, used - ours), 1)
    return out


def problems_of(verdict):
    """Why the run fails, one phrase each (empty: it passes).  Lost messages, failed requests,
    exceptions inside locust tasks, a non-zero locust exit, a locust process whose records are
    missing, an account run by two processes, or no requests at all."""
    problems = []
    if verdict["lost"]:
        problems.append(f"{verdict['lost']} messages lost")
    if verdict["failures"]:
        problems.append(f"{verdict['failures']} requests failed")
    if verdict["exceptions"]:
        problems.append(f"{verdict['exceptions']} exceptions in locust tasks")
    if verdict["locust_exit"] != 0:
        problems.append(f"locust exited with status {verdict['locust_exit']}")
    if verdict.get("clock_disagreements"):
        problems.append(f"{verdict['clock_disagreements']} deliveries seen before their plurk's created: the "
                        "clocks of locust and the server disagree, the latencies are not a measure (run "
                        "locust on the stack's machine, or sync the clocks)")
    if verdict.get("untimed_deliveries"):
        problems.append(f"{verdict['untimed_deliveries']} deliveries of posts recorded without their created: "
                        "the latencies leave them out (records of an older locustfile?)")
    if not verdict["requests"]:
        problems.append("no requests")
    expected = verdict["record_files_expected"]
    if expected is not None and verdict["record_files_with_users"] != expected:
        problems.append(f"{verdict['record_files_with_users']} records files of processes that ran users, "
                        f"expected {expected} (one per locust process): the verdict would miss a process")
    if verdict["shared_accounts"]:
        problems.append(f"{verdict['shared_accounts']} accounts run by more than one locust process "
                        f"(e.g. {', '.join(verdict['shared_examples'][:3])})")
    return problems


def run(host, users, spawn_rate, run_time, processes, celebrities, stack_env, prefollow=False,
        sampler=None, locust_env=None, zipf=1.2, login_users=0):
    work = tempfile.mkdtemp(prefix="plurk-load-")
    records = os.path.join(work, "records")
    setup = os.path.join(work, "setup.json")
    run_id = f"r{os.getpid()}x{int(time.time()) % 10**6}_"
    env = dict(os.environ, **stack_env, DJANGO_SETTINGS_MODULE="plurksite.settings")
    # locust's -u counts every user, the celebrities' too: `users - login_users` pre-made ordinary
    # accounts leave a few spare (an ordinary user left without one would sign up)
    login_users = max(0, min(login_users, users))
    plain = users - login_users
    progress(f"creating {celebrities + plain} accounts and {login_users} with a password ...")
    accounts = make_accounts(celebrities + plain, run_id, os.path.join(work, "accounts.json"), env,
                             celebrities, prefollow, zipf) if celebrities + plain else []
    logins = make_login_accounts(host, login_users, run_id)
    with open(setup, "w") as fh:
        json.dump({"celebrities": accounts[:celebrities], "logins": logins, "users": accounts[celebrities:]}, fh)
    env = dict(os.environ, **(locust_env or {}), PLURK_LOAD_RECORDS=records, PLURK_LOAD_SETUP=setup)
    argv = [os.path.join(os.path.dirname(sys.executable), "locust"), "-f",
            os.path.join(ROOT, "locustfiles", "plurkers.py"), "--headless", "--host", host,
            "-u", str(users), "-r", str(spawn_rate), "-t", f"{run_time}s", "--stop-timeout", "5",
            "--csv", os.path.join(work, "locust"), "--csv-full-history", "--only-summary",
            "--loglevel", "WARNING"]
    if processes > 1:
        # a free port for the master, not locust's fixed 5557 (another run, a test, may hold it)
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        argv += ["--processes", str(processes), "--master-bind-host", "127.0.0.1",
                 "--master-bind-port", str(port), "--master-host", "127.0.0.1", "--master-port", str(port)]
    progress(f"locust: {users} users ({processes} process{'es' if processes > 1 else ''}), {run_time}s, "
             f"against {host} ...")
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    cpu_before = _cpu_times()
    first_sample = None
    if sampler is not None:
        sampler.locust_pid = proc.pid
        first_sample = sampler.mark()
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
    elapsed = time.monotonic() - started
    cpu_after = _cpu_times()
    requests_, failures = _stats_failures(os.path.join(work, "locust"))
    endpoints, failure_kinds, exception_kinds, history = _locust_details(os.path.join(work, "locust"))
    # every locust process that ran users wrote a records file: the only one, or each worker (the
    # dispatcher gives every worker users when there are at least as many users as workers)
    verdict = judge(records, expected_processes=min(processes, users))
    verdict.update({"users": users, "run_time_s": run_time, "processes": processes, "spawn_rate": spawn_rate,
                    "login_users": login_users, "locust_wall_s": round(elapsed, 1),
                    "requests": requests_, "failures": failures,
                    "exceptions": sum(e["count"] for e in exception_kinds), "locust_exit": proc.returncode,
                    "knobs": {k: v for k, v in env.items() if k.startswith("PLURK_LOAD_") and k not in
                              ("PLURK_LOAD_RECORDS", "PLURK_LOAD_SETUP")},
                    "endpoints": endpoints, "failure_kinds": failure_kinds[:20],
                    "exception_kinds": exception_kinds[:10], "locust_history": history})
    verdict["problems"] = problems_of(verdict)
    if sampler is not None:
        ramp = first_sample + int(users / spawn_rate) + 5
        verdict["stack_resources"] = sampler.summarize(first_sample)
        verdict["machine_cpu"] = machine_cpu(cpu_before, cpu_after, verdict["stack_resources"])
        verdict["stack_resources_after_rampup"] = sampler.summarize(ramp)
        verdict["resource_series"] = {name: [[s[name]["cpu_pct"], s[name]["rss_mb"]] for s in sampler.samples[first_sample:]]
                                      for name in COMPONENTS}
    if verdict["problems"]:
        verdict["locust_output_tail"] = "".join(out_lines[-40:])
        verdict["work_dir"] = work          # kept: locust's CSVs and the records explain a failure
    else:
        shutil.rmtree(work, ignore_errors=True)
    return verdict


SERVICES = {  # how each part of the stack shows up in /proc/<pid>/cmdline
    "nginx": lambda cmd: cmd.startswith("nginx"),
    "fastpath": lambda cmd: "-m fastpath" in cmd,
    "memcached": lambda cmd: "memcached" in cmd.split(" ")[0],
    "gunicorn": lambda cmd: "gunicorn" in cmd and "plurksite.wsgi" in cmd,
    "repaircache": lambda cmd: "manage.py repaircache" in cmd,
    "postgres": lambda cmd: cmd.split(" ")[0].endswith("/postgres") or cmd.startswith("postgres:"),
}
COMPONENTS = list(SERVICES) + ["locust"]


def _listening_inodes(ports):
    """Socket inodes of the TCP sockets listening on these ports (IPv4 and IPv6)."""
    inodes = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as fh:
                next(fh)
                for line in fh:
                    f = line.split()
                    if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) in ports:
                        inodes.add(f[9])
        except OSError:
            continue
    return inodes


class StackSampler:
    """Every second: CPU (from /proc/<pid>/stat utime+stime) and RSS of nginx, fastpath, memcached,
    gunicorn and the cache repairer, each summed over its processes (masters and workers), and of
    locust (master and workers).

    Only *this* stack is counted, not another one on the machine (a test suite's, on other ports):
    the processes listening on the stack's ports are found once, and each sample counts every
    descendant of their supervisor (runstack, or this process when it started the stack), named
    by its command line; locust is the process tree of ``locust_pid``."""

    def __init__(self, ports, interval=1.0):
        import threading
        self.interval = interval
        self.ports = set(ports)
        self.samples = []
        self.locust_pid = None
        self.supervisors = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _cmdline(pid):
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()

    @staticmethod
    def _service(cmd):
        return next((name for name, match in SERVICES.items() if match(cmd)), None)

    def _find_supervisors(self, procs):
        """The parents of the stack's top service processes (those listening on its ports)."""
        inodes = {int(inode) for inode in _listening_inodes(self.ports)}
        listening = {pid for pid, (_, _, cmd) in procs.items()
                     if self._service(cmd) is not None and socket_inodes([pid]) & inodes}
        supervisors = set()
        for pid in listening:
            while procs.get(procs[pid][0]) and self._service(procs[procs[pid][0]][2]) is not None:
                pid = procs[pid][0]        # worker -> its master
            supervisors.add(procs[pid][0])
        return supervisors

    def _scan(self):
        """{pid: (ppid, (cpu_s, rss_kb), cmdline)} of every process."""
        procs = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                ppid, cpu_s = proc_stat(pid)
                with open(f"/proc/{pid}/status") as fh:
                    rss = next((int(ln.split()[1]) for ln in fh if ln.startswith("VmRSS")), 0)
                cmd = self._cmdline(pid)
            except (OSError, ValueError, IndexError):
                continue
            procs[pid] = (ppid, (cpu_s, rss), cmd)
        return procs

    def _read(self):
        procs = self._scan()
        if not self.supervisors:
            self.supervisors = self._find_supervisors(procs)
        children = {}
        for pid, (ppid, _, _) in procs.items():
            children.setdefault(ppid, []).append(pid)

        def tree(roots):
            out, todo = set(), list(roots)
            while todo:
                pid = todo.pop()
                if pid not in out:
                    out.add(pid)
                    todo += children.get(pid, [])
            return out
        locust = tree([str(self.locust_pid)]) if self.locust_pid and str(self.locust_pid) in procs else set()
        totals = {name: {"cpu_s": 0.0, "rss_kb": 0, "processes": 0} for name in COMPONENTS}
        for pid in tree(self.supervisors) | locust:
            if pid not in procs or pid in self.supervisors:
                continue
            name = "locust" if pid in locust else self._service(procs[pid][2])
            if name is None:
                continue
            cpu_s, rss = procs[pid][1]
            totals[name]["cpu_s"] += cpu_s
            totals[name]["rss_kb"] += rss
            totals[name]["processes"] += 1
        return totals

    def _run(self):
        last, last_t = self._read(), time.monotonic()
        while not self._stop.wait(self.interval):
            now, now_t = self._read(), time.monotonic()
            # a process that exited between samples takes its CPU time with it: never below 0
            self.samples.append({name: {"cpu_pct": max(0.0, round(100 * (now[name]["cpu_s"] - last[name]["cpu_s"]) / (now_t - last_t), 1)),
                                        "rss_mb": round(now[name]["rss_kb"] / 1024, 1),
                                        "processes": now[name]["processes"]} for name in COMPONENTS})
            last, last_t = now, now_t

    def start(self):
        self._thread.start()
        return self

    def mark(self):
        """Index of the next sample: summarize(from_=mark()) covers only what follows."""
        return len(self.samples)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)

    def summarize(self, from_=0, to=None):
        summary = {}
        window = self.samples[from_:to]
        for name in COMPONENTS:
            cpu = [s[name]["cpu_pct"] for s in window if s[name]["processes"]]
            rss = [s[name]["rss_mb"] for s in window if s[name]["processes"]]
            if cpu:
                summary[name] = {"cpu_pct_mean": round(sum(cpu) / len(cpu), 1), "cpu_pct_max": max(cpu),
                                 "rss_mb_max": max(rss),
                                 "processes": max(s[name]["processes"] for s in window)}
        return summary


def _stack_running(host):
    try:
        requests.get(host + "/Poll/getUnreadCount", timeout=2)
        return True
    except requests.RequestException:
        return False


# The 10,000-user run on a 2-core machine: locust's distributed mode (2 worker processes), a
# polling-heavy mix (a poll every ~15 s, ordinary users only read; 100 celebrities, each acting
# every ~5 min -- 3 times in 8 a post -- to a bulk-made graph of ~19,700 follows, each user
# following 1-3 of them, popularity Zipf 0.6: the most followed has ~1,400 followers, the median
# ~140), a 100 s ramp-up.  Per poll the stack does almost nothing (fastpath hits); what is
# expensive is Django: each delivered plurk costs its reader a markRead (~10 ms of CPU), and a
# plurk's followers all poll within ~15 s of it, so the deliveries per second, and the followers of
# one plurk, are what have to fit in the CPU that locust leaves (a markRead that waits 30 s is a
# 504; its user retries at the next poll, and a backlog feeds itself).  The stack it starts waits up to 500 ms for memcached (PLURK_MEMCACHED_TIMEOUT_MS, default
# 50): with ~10 busy processes on 2 cores a Django thread can wait 50 ms for the CPU alone, and a
# timed-out cache write is (rightly) a failed write -- memcached marked suspect and flushed, after
# which all 10,000 users miss at once and Django drowns in 504s.  Its database is a throwaway
# PostgreSQL cluster: on SQLite every markRead is a write transaction, and ~40 of them a second
# from 8 gunicorn threads queue on SQLite's single write lock (busy-waiting with sleeps) until
# they take 30 s and nginx answers 504 (Django itself at ~55% of a core).  An already running
# stack keeps its own database and timeout.
PRESET_10K = {"users": 10000, "processes": 2, "spawn_rate": 100, "run_time": 360, "prefollow": True,
              "celebrities": 100, "zipf": 0.6, "write_weight": 0, "celeb_wait": 300, "poll_wait": 15,
              "database": "postgresql", "result_name": "load-10k"}


def main(argv=None):
    ap = argparse.ArgumentParser(description="Run the locust simulation and judge delivery.")
    ap.add_argument("--users", type=int, default=300)
    ap.add_argument("--spawn-rate", type=float, default=50)
    ap.add_argument("--run-time", type=int, default=60)
    ap.add_argument("--processes", type=int, default=1, help="locust worker processes (>1: distributed mode)")
    ap.add_argument("--celebrities", type=int, default=5)
    ap.add_argument("--login-users", type=int, default=3,
                    help="users that log in with a password (/api/login; ~0.5 s of server CPU each, "
                         "keep it small); the others start logged in")
    ap.add_argument("--host", default=None, help="base URL (default: PLURK_HTTP; started if not running)")
    ap.add_argument("--edge", action="store_true",
                    help="the stack this run starts gets fastpath's edge on a free loopback port, where "
                         "PLURK_LOAD_POLL_MODE=stream users open their streams (PLURK_LOAD_EDGE)")
    ap.add_argument("--quick", action="store_true", help="30 users for 30 s (the CI-sized run)")
    ap.add_argument("--result-name", default="load")
    ap.add_argument("--prefollow", action="store_true",
                    help="create the social graph in bulk before the run (for 10,000 users)")
    ap.add_argument("--zipf", type=float, default=1.2,
                    help="with --prefollow: exponent of the celebrities' popularity (smaller is flatter)")
    ap.add_argument("--poll-wait", type=float, default=None,
                    help="mean seconds between an ordinary user's actions (PLURK_LOAD_POLL_WAIT, default 2)")
    ap.add_argument("--write-weight", type=int, default=None,
                    help="task weight of posting/responding against 30 for polling (PLURK_LOAD_WRITE_WEIGHT, default 1)")
    ap.add_argument("--celeb-wait", type=float, default=None,
                    help="mean seconds between a celebrity's actions (PLURK_LOAD_CELEB_WAIT, default 3)")
    ap.add_argument("--database", choices=["config", "postgresql"], default="config",
                    help="for a stack this run starts: config (PLURK_DATABASE_URL, SQLite by default) or "
                         "postgresql (a throwaway cluster, tests/support/postgres.py)")
    ap.add_argument("--preset", choices=["10k"], default=None,
                    help="10k: the 10,000-user polling run (see PRESET_10K); other flags override it")
    args = ap.parse_args(argv)
    if args.preset == "10k":
        explicit = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]) if a.startswith("--")}
        for name, value in PRESET_10K.items():
            if "--" + name.replace("_", "-") not in explicit:
                setattr(args, name, value)
        # see PRESET_10K: only applies to a stack this run starts
        os.environ.setdefault("PLURK_MEMCACHED_TIMEOUT_MS", "500")
    if args.quick:
        args.users, args.run_time, args.spawn_rate = 30, 30, 10
    locust_env = {name: str(value) for name, value in (("PLURK_LOAD_POLL_WAIT", args.poll_wait),
                                                       ("PLURK_LOAD_WRITE_WEIGHT", args.write_weight),
                                                       ("PLURK_LOAD_CELEB_WAIT", args.celeb_wait))
                  if value is not None}
    locust_env["PLURK_LOAD_STREAM_VIA"] = stream_via(args.edge, os.environ)
    from plurksite.config import format_hostport, load

    stack = None
    config = load()                  # the same PLURK_* the stack runs with (its database)
    host = args.host
    cluster = None
    if host is None:
        host = config.base_url
        if not _stack_running(host):
            from plurksite.stack import Stack
            if args.database == "postgresql":
                from tests.support.postgres import PostgresCluster
                progress("starting a throwaway PostgreSQL cluster ...")
                cluster = PostgresCluster().start()
                os.environ["PLURK_DATABASE_URL"] = cluster.create_database("plurkload")
                config = load()
            subprocess.run([sys.executable, os.path.join(ROOT, "manage.py"), "migrate", "--noinput", "-v", "0"],
                           check=True, cwd=ROOT)
            if args.edge and config.edge is None:
                raise SystemExit("error: --edge needs the stack's edge: PLURK_EDGE is empty")
            if config.edge:
                # the stack's own edge (PLURK_EDGE) without its per-address caps: every locust
                # user connects from 127.0.0.1 (a stack already running keeps its caps)
                os.environ.update(PLURK_EDGE_MAX_PER_ADDRESS="0", PLURK_EDGE_MAX_CONNS_PER_ADDRESS="0")
                config = load()
            if args.edge:
                locust_env["PLURK_LOAD_EDGE"] = format_hostport(*config.edge)
            progress(f"starting the stack at {host}{' with an edge at ' + locust_env['PLURK_LOAD_EDGE'] if args.edge else ''} ...")
            stack = Stack(config).start()
        elif args.database != "config":
            progress(f"warning: a stack already answers at {host}: --database {args.database} does not apply, "
                     "the run uses that stack as it is")
    # fastpath by its admin port: always TCP, where its listener may be a unix socket
    ports = [config.http[1], config.django[1], config.fastpath_admin[1]] + [p for _, p in config.memcached]
    if cluster is not None:
        ports.append(cluster.port)
    if args.edge and stack is None:
        raise SystemExit(f"error: --edge needs a stack this run starts, but one already answers at {host}; "
                         "stop it, or give its edge as PLURK_LOAD_EDGE=host:port without --edge")
    stack_info = {"started_by_this_run": stack is not None,
                  "poll_mode": os.environ.get("PLURK_LOAD_POLL_MODE", "long"),
                  "edge": locust_env.get("PLURK_LOAD_EDGE") or os.environ.get("PLURK_LOAD_EDGE"),
                  "database": (config.database_url.split(":", 1)[0].replace("postgres", "postgresql")
                               if stack is not None else None),
                  "memcached_timeout_ms": config.memcached_timeout_ms if stack is not None else None,
                  "gunicorn_workers": config.gunicorn_workers if stack is not None else None}
    sampler = StackSampler(ports).start()
    try:
        verdict = run(host, args.users, args.spawn_rate, args.run_time, args.processes, args.celebrities,
                      config.to_env(), args.prefollow, sampler, locust_env, args.zipf, args.login_users)
    finally:
        sampler.stop()
        if stack is not None:
            stack.stop()
        if cluster is not None:
            cluster.stop()
    verdict["stack"] = stack_info
    stack_info["streams_via"] = streams_used(verdict.get("endpoints", {}))
    path = write_result(args.result_name, verdict)
    lat = verdict["delivery_latency_s"]
    fmt = (lambda v: "n/a" if v is None else f"{v * 1000:.0f} ms")
    print(f"\n{verdict['users']} users, {verdict['processes']} locust process(es), {verdict['run_time_s']} s")
    print(f"plurks posted {verdict['plurks_posted']}, deliveries checked {verdict['deliveries_checked']}, "
          f"LOST {verdict['lost']}")
    print(f"delivery latency (the plurk's created -> first seen) p50 {fmt(lat['p50'])}, p95 {fmt(lat['p95'])}, "
          f"p99 {fmt(lat['p99'])}, max {fmt(lat['max'])}; {verdict['clock_disagreements']} seen before created")
    for name, st in verdict["stages_s"].items():
        if st["deliveries"]:
            print(f"  stage {name:6s} p50 {fmt(st['p50'])}, p99 {fmt(st['p99'])} ({st['deliveries']} deliveries)")
    print(f"requests {verdict['requests']}, failures {verdict['failures']}, exceptions {verdict['exceptions']}, "
          f"poll hit ratio {verdict['hit_ratio'] if verdict['hit_ratio'] is None else round(verdict['hit_ratio'], 4)}")
    print(f"accounts {verdict['distinct_accounts']} distinct ({verdict['password_logins']} logged in with a password), "
          f"{verdict['shared_accounts']} run by two processes; records files {verdict['record_files_with_users']} "
          f"(expected {verdict['record_files_expected']}); locust exit status {verdict['locust_exit']}")
    for kind in verdict["failure_kinds"][:5]:
        print(f"  failure x{kind['count']}: {kind['endpoint']}: {kind['error'][:120]}")
    for kind in verdict["exception_kinds"][:5]:
        print(f"  exception x{kind['count']}: {kind['message'][:120]}")
    if verdict.get("machine_cpu"):
        m = verdict["machine_cpu"]
        print(f"the machine's CPU during the run: {m['busy_pct']}% of {m['cores'] * 100}% "
              f"({m.get('others_pct')}% of it neither the stack nor locust)")
    for title, key in (("during the run", "stack_resources"), ("after ramp-up", "stack_resources_after_rampup")):
        if verdict.get(key):
            print(f"CPU (100% = one core) and memory {title}:")
        for name, r in verdict.get(key, {}).items():
            print(f"  {name:11s} CPU mean {r['cpu_pct_mean']:6.1f}% max {r['cpu_pct_max']:6.1f}%   "
                  f"RSS max {r['rss_mb_max']:7.1f} MB  ({r['processes']} processes)")
    print(f"results: {path}")
    if verdict["problems"]:
        print("FAILED: " + "; ".join(verdict["problems"]))
        if verdict.get("locust_output_tail"):
            print("locust's last lines:\n" + verdict["locust_output_tail"].rstrip())
        if verdict.get("work_dir"):
            print(f"locust's CSVs and the delivery records: {verdict['work_dir']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
