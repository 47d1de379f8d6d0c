"""Failure drills (issue 16): faults injected into the running namespace cluster while locust's
long-polling users post and poll through the balancer, each judged on what users would notice.

    from plurksite.cluster.drills import DRILLS, run_drills
    with Cluster() as cluster:
        report = run_drills(cluster, DRILLS, users=2000)

One locust run (distributed mode, on plk-client, against the balancer) carries every drill: the
users ramp up, then each drill in turn injects its fault, holds it ``fault_s``, heals it and
waits ``recover_s``.  Afterwards the records every locust process wrote (locustfiles/_delivery.py)
are cut by time:

- **lost**: a plurk committed during the drill that a follower, who followed before it and
  completed a poll after it, never saw (must be 0);
- **stale**: cached answers that differ from the database (``manage.py checkcache``) after the
  drill's recovery, confirmed by four reads spread over 10 s (a key whose writer is still at
  work under load differs for a moment, then agrees), and once more when the load has stopped (must be 0);
- **failed requests** and **delivery latency** (commit -> first seen by a follower) during the
  fault and after it, printed, not judged: a fault may cost errors and time, never data.

A drill passes with 0 lost and 0 stale and at least one delivery checked in its window (a window
nobody was owed anything in vouches for nothing).
"""
import collections
import contextlib
import csv
import dataclasses
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

from plurksite import config as plurk_config

from . import ClusterError, topology

PYTHON = sys.executable
MANAGE = os.path.join(plurk_config.ROOT, "manage.py")
LOCUST = os.path.join(os.path.dirname(sys.executable), "locust")
CLIENT = "plk-client"
CHECKER = "plk-db"                  # checkcache runs beside the database, never on a faulted host
STALE_PAUSES = (2.0, 3.0, 5.0)      # seconds between the checkcache runs that must all find a key different


def _noop(_cluster):
    pass


@dataclasses.dataclass(frozen=True)
class Drill:
    name: str
    what: str
    fault: object                   # callable(cluster)
    heal: object = _noop            # callable(cluster)
    fault_s: float = 15.0           # how long the fault lasts once injected
    recover_s: float = 15.0         # how long the load runs after the heal before judging


DRILLS = (
    Drill("memcached-partition", "plk-mc2's link down, then back holding its old entries",
          lambda c: c.partition("plk-mc2"), lambda c: c.heal("plk-mc2")),
    Drill("memcached-restart-empty", "memcached on plk-mc3 killed; its runner restarts it empty",
          lambda c: c.kill_service("plk-mc3", "memcached"), fault_s=5.0),
    Drill("web-host-lost", "plk-web1 killed whole mid-load (the balancer moves its clients), then "
                           "started again", lambda c: c.kill("plk-web1"), lambda c: c.revive("plk-web1"),
          recover_s=20.0),
    Drill("fastpath-killed", "fastpath on plk-web2 killed; its runner restarts it",
          lambda c: c.kill_service("plk-web2", "fastpath"), fault_s=5.0),
    Drill("postgres-restart", "PostgreSQL on plk-db stopped and started again",
          lambda c: c.restart_service("plk-db", "postgres"), fault_s=5.0, recover_s=20.0),
    Drill("notice-path-cut", "notices to plk-web1 dropped: its held polls wake by the re-read "
                             "interval alone", lambda c: c.cut_notices("plk-web1"),
          lambda c: c.restore_notices("plk-web1"), fault_s=20.0),
)

#: `make test`'s short run (the issue's choice): one memcached partition, one web host lost.
SHORT = ("memcached-partition", "web-host-lost")


def select(names):
    by_name = {d.name: d for d in DRILLS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ClusterError(f"no drill {', '.join(unknown)}; the drills are {', '.join(by_name)}")
    return tuple(by_name[n] for n in names)


# ---- the load --------------------------------------------------------------------------------

#: The users' behaviour (locustfiles/plurkers.py knobs), sized for the two cores that carry the
#: whole cluster and locust: every account follows 1-3 of 20 celebrities (zipf 0.6, so each has
#: ~160 followers), only celebrities post (each acts every ~60 s: a plurk every few seconds, some
#: 50 follower wakes a second, each a getMessages and a markRead), ordinary users act every ~15 s.
#: A drill's window must hold plurks to judge: at one every ~10 s (celebrities acting every 120 s)
#: a 25 s window came out empty.  Heavier, and the 4 gunicorn workers queue requests until nginx's 30 s read
#: timeout answers 504: the drills would then measure overload, not the fault (the first run,
#: at locust's defaults, failed 40% of its requests with no fault at all).
LOAD_PROFILE = {"celebrities": 20, "zipf": 0.6, "write_weight": 0, "celeb_wait": 60, "poll_wait": 15}


class Load:
    """locust on the client host against the balancer, in distributed mode, with pre-made
    logged-in accounts and a social graph (LOAD_PROFILE)."""

    def __init__(self, cluster, work, users, processes=2, spawn_rate=200, poll_wait=None):
        self.cluster = cluster
        self.work = work
        self.users = users
        self.processes = processes
        self.spawn_rate = spawn_rate
        self.profile = dict(LOAD_PROFILE)
        if poll_wait is not None:
            self.profile["poll_wait"] = poll_wait
        self.celebrities = self.profile["celebrities"]
        self.records = os.path.join(work, "records")
        self.csv = os.path.join(work, "locust")
        self.proc = None
        self.started = None

    def make_accounts(self):
        out = os.path.join(self.work, "accounts.json")
        prefix = f"d{int(time.time()) % 10**7}_"
        argv = [PYTHON, MANAGE, "loadusers", str(self.users), "--prefix", prefix, "--out", out,
                "--warm", "--celebrities", str(self.celebrities), "--prefollow", "--zipf",
                str(self.profile["zipf"])]
        done = self.cluster.run_on(CLIENT, argv, timeout=600)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise ClusterError(f"creating {self.users} accounts failed: {said[-1] if said else done.returncode}")
        with open(out) as fh:
            accounts = json.load(fh)
        setup = os.path.join(self.work, "setup.json")
        with open(setup, "w") as fh:
            json.dump({"celebrities": accounts[:self.celebrities], "logins": [],
                       "users": accounts[self.celebrities:]}, fh)
        return setup

    def start(self, setup, limit_s):
        host = topology.site_url()          # https; the client host trusts the cluster's CA
        argv = [LOCUST, "-f", os.path.join(plurk_config.ROOT, "locustfiles", "plurkers.py"), "--headless",
                "--host", host, "-u", str(self.users), "-r", str(self.spawn_rate), "-t", f"{int(limit_s)}s",
                "--stop-timeout", "5", "--csv", self.csv, "--csv-full-history", "--only-summary",
                "--loglevel", "WARNING"]
        if self.processes > 1:
            argv += ["--processes", str(self.processes), "--master-bind-host", "127.0.0.1",
                     "--master-host", "127.0.0.1"]
        env = {"PLURK_LOAD_RECORDS": self.records, "PLURK_LOAD_SETUP": setup, "PLURK_LOAD_POLL_MODE": "long",
               "PLURK_LOAD_POLL_WAIT": str(self.profile["poll_wait"]),
               "PLURK_LOAD_WRITE_WEIGHT": str(self.profile["write_weight"]),
               "PLURK_LOAD_CELEB_WAIT": str(self.profile["celeb_wait"])}
        self.proc = self.cluster.spawn(CLIENT, argv, log_name="locust", env=env)
        self.started = time.time()

    def alive(self):
        return self.proc is not None and self.proc.alive()

    def stop(self, timeout=60):
        """SIGTERM to locust's master: it stops the users, and every process writes its records."""
        if self.proc is None:
            return None
        popen = self.proc.process
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(timeout=10)
        return popen.returncode

    def read_records(self):
        records = []
        for path in sorted(glob.glob(os.path.join(self.records, "*.json"))):
            with open(path) as fh:
                records.append(json.load(fh))
        return records

    def history(self):
        """[(unix time, total requests, total failures)] of locust's aggregated row, per second
        (locust's pseudo-requests for delivery figures are not HTTP: left out of the requests)."""
        path = self.csv + "_stats_history.csv"
        if not os.path.exists(path):
            return []
        rows = {}
        with open(path) as fh:
            for row in csv.DictReader(fh):
                t = int(row["Timestamp"])
                entry = rows.setdefault(t, [0, 0, 0])
                if row["Name"] == "Aggregated":
                    entry[0] += int(row["Total Request Count"])
                    entry[1] += int(row["Total Failure Count"])
                elif row["Type"] == "delivery":
                    entry[2] += int(row["Total Request Count"])
        return [(t, req - delivery, fail) for t, (req, fail, delivery) in sorted(rows.items())]


def _count_between(history, start, end):
    """Requests and failures locust counted between two unix times (cumulative rows)."""
    def at(t):
        last = (0, 0)
        for ts, req, fail in history:
            if ts > t:
                break
            last = (req, fail)
        return last
    (r0, f0), (r1, f1) = at(start), at(end)
    return max(0, r1 - r0), max(0, f1 - f0)


def _figures(records, history, start, end):
    """What users saw between two unix times: requests and failures (locust's history), and the
    delivery of the plurks committed then."""
    verdict = _window(records, start, end)
    requests, failures = _count_between(history, start, end)
    return {"requests": requests, "failures": failures, "latency_s": verdict["delivery_latency_s"],
            "plurks": verdict["plurks_posted"], "deliveries_checked": verdict["deliveries_checked"],
            "lost": verdict["lost"]}


def _window(records, start, end):
    """The delivery verdict (lost, latency) of the plurks committed in [start, end)."""
    from plurksite import delivery as _delivery

    cut = [dict(rec, posts=[p for p in rec["posts"] if start <= p[3] < end]) for rec in records]
    return _delivery.judge(cut)


# ---- staleness ---------------------------------------------------------------------------------

_DIFFERENCE = re.compile(r"^(\S+): cached ")


def check_cache(cluster):
    """({differing key: checkcache's line}, complete?) from one ``manage.py checkcache`` on the
    checker host."""
    done = cluster.run_on(CHECKER, [PYTHON, MANAGE, "checkcache"], timeout=300)
    if done.returncode not in (0, 1, 2):
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ClusterError(f"checkcache failed (status {done.returncode}): {said[-1] if said else ''}")
    lines = {m.group(1): line for line in done.stdout.splitlines() if (m := _DIFFERENCE.match(line))}
    return lines, done.returncode != 2


#: longest a drill's window is stretched, after its recovery, until a plurk was committed in it
PLURK_WAIT_S = 60.0

_PLURKS_SINCE = ("import datetime; from plurkcore.models import Plurk; "
                 "print(Plurk.objects.filter(created__gte=datetime.datetime.fromtimestamp({since!r}, "
                 "datetime.timezone.utc)).count())")


def plurks_since(cluster, since):
    """How many plurks the database holds that were committed since ``since`` (unix time)."""
    done = cluster.run_on(CHECKER, [PYTHON, MANAGE, "shell", "-v", "0", "-c", _PLURKS_SINCE.format(since=since)],
                          timeout=120)
    words = done.stdout.split()
    if done.returncode != 0 or not words or not words[-1].isdigit():
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ClusterError(f"counting plurks failed (status {done.returncode}): {said[-1] if said else ''}")
    return int(words[-1])


def await_a_plurk(cluster, since, limit_s=PLURK_WAIT_S, poll_s=3.0):
    """Wait until a plurk was committed since ``since`` (the users post at random: a window
    without one would owe no delivery and prove nothing); the seconds waited."""
    start = time.time()
    while plurks_since(cluster, since) == 0 and time.time() - start < limit_s:
        time.sleep(poll_s)
    return round(time.time() - start, 1)


def stale_keys(cluster, pauses=STALE_PAUSES):
    """{key: checkcache's last line} of the keys that differ from the database in every
    checkcache run, the runs ``pauses`` seconds apart, and whether every run reached every
    server.  A key whose writer is still at work (a publish under load can take seconds) differs
    for a while and then agrees; a stale one keeps differing until its user changes again."""
    stale, complete = None, True
    for i in range(len(pauses) + 1):
        lines, whole = check_cache(cluster)
        complete &= whole
        stale = lines if stale is None else {k: lines[k] for k in stale if k in lines}
        if not stale:
            break
        if i < len(pauses):
            time.sleep(pauses[i])
    return stale or {}, complete


_REPLAY = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ WARNING fastpoll\.repair: writing the "
                     r"answers of (\d+) change\(s\) whose writer did not finish")


def outbox_replays(cluster, start, end):
    """Changes the repair service wrote for a writer that died (plurkcore's outbox) between two
    unix times, from the repair host's log: the evidence that a lost web host needed it."""
    total = 0
    for host in cluster.hosts:
        if "repair" not in host.roles:
            continue
        path = os.path.join(plurk_config.ROOT, host.var_dir, "log", "repaircache.log")
        with contextlib.suppress(OSError), open(path, errors="replace") as fh:
            for line in fh:
                match = _REPLAY.match(line)
                if match:     # the log's time has whole seconds (and its milliseconds after)
                    at = time.mktime(time.strptime(match[1], "%Y-%m-%d %H:%M:%S"))
                    total += int(match[2]) if start - 1 < at <= end else 0
    return total


# ---- running --------------------------------------------------------------------------------

def _fmt_latency(lat):
    f = (lambda v: "n/a" if v is None else f"{v:.2f}")
    return f"{f(lat['p50'])}/{f(lat['p95'])}/{f(lat['max'])} s"


def verdict_line(result):
    d, a = result["during"], result["after"]
    status = "PASS" if result["passed"] else "FAIL"
    why = "" if result["passed"] else f" ({'; '.join(result['problems'])})"
    return (f"drill {result['name']}: {status}{why}: stale {result['stale']}, lost {result['lost']} of "
            f"{result['deliveries_checked']} deliveries; failed requests {d['failures']} of {d['requests']} "
            f"during, {a['failures']} of {a['requests']} after; delivery p50/p95/max "
            f"{_fmt_latency(d['latency_s'])} during, {_fmt_latency(a['latency_s'])} after; "
            f"outbox replays {result.get('outbox_replays', 0)}")


def totals_line(report):
    results = report["drills"]
    passed = sum(r["passed"] for r in results)
    failures = sum(r["during"]["failures"] + r["after"]["failures"] for r in results)
    requests = sum(r["during"]["requests"] + r["after"]["requests"] for r in results)
    return (f"drills: {len(results)} run, {passed} passed, {len(results) - passed} failed; stale "
            f"{sum(r['stale'] for r in results)} (after the load: {report['final_stale']}), lost "
            f"{report['lost_total']} of {report['deliveries_checked_total']} deliveries; failed requests "
            f"{failures} of {requests} during the drills; {report['users']} long-polling users")


#: What one drill's run left to judge: its times (unix), the stale keys after its recovery, and
#: how long its window was stretched to hold a plurk.
Window = collections.namedtuple("Window", "drill fault heal end stale complete waited")


def run_drills(cluster, drills, users=2000, processes=2, spawn_rate=200, warmup_s=15.0, poll_wait=None,
               say=print, work=None, steady_s=0.0, db_delay_ms=0):
    """Run ``drills`` in turn under one locust load; the report (dict) with one result per drill.
    With ``steady_s``, the load first runs that long without a fault: the report's ``steady``
    (bench/cluster.py's delivery figures).  ``db_delay_ms`` delays the database host's link each
    way (netem, or the harness's relay where the kernel has no netem), as a database across a
    network would be."""
    if db_delay_ms:
        say(f"drill: {CHECKER}'s link delayed {db_delay_ms} ms each way")
        cluster.delay(CHECKER, db_delay_ms)
    import tempfile

    work = work or tempfile.mkdtemp(prefix="plurk-drill-")
    load = Load(cluster, work, users, processes=processes, spawn_rate=spawn_rate, poll_wait=poll_wait)
    say(f"drill: {users} accounts (logged in, followers made, answers cached) ...")
    setup = load.make_accounts()
    planned = warmup_s + users / spawn_rate + steady_s + sum(d.fault_s + d.recover_s + 30 for d in drills) + 60
    load.start(setup, limit_s=planned)
    say(f"drill: locust on {CLIENT}: {users} long-polling users through the balancer; "
        f"ramping up for {users / spawn_rate + warmup_s:.0f}s")
    time.sleep(users / spawn_rate + warmup_s)
    steady = (time.time(), time.time() + steady_s)
    try:
        if steady_s:
            say(f"drill: {steady_s:.0f}s of load without a fault")
            time.sleep(steady_s)
        windows = [_inject(cluster, load, drill, say) for drill in drills]
        time.sleep(5)
    finally:
        locust_exit = load.stop()
    final_stale, final_complete = stale_keys(cluster)
    records = load.read_records()
    history = load.history()
    from plurksite import delivery as _delivery
    overall = _delivery.judge(records)
    results = [_judge(cluster, window, records, history) for window in windows]
    steady_report = None
    if steady_s:
        steady_report = dict(_figures(records, history, *steady), seconds=steady_s)
        steady_report["requests_per_s"] = round(steady_report["requests"] / steady_s, 1)
    report = {"users": users, "processes": processes, "load_profile": load.profile, "db_delay_ms": db_delay_ms,
              "drills": results,
              "steady": steady_report,
              "locust_exit": locust_exit, "locust_history": history,
              "final_stale": len(final_stale), "final_stale_examples": [final_stale[k] for k in sorted(final_stale)[:10]],
              "final_check_complete": final_complete, "lost_total": overall["lost"],
              "deliveries_checked_total": overall["deliveries_checked"],
              "plurks_posted": overall["plurks_posted"], "overall_latency_s": overall["delivery_latency_s"],
              "record_files": len(records), "work_dir": work}
    report["problems"] = _run_problems(report, expected_records=min(processes, users))
    report["passed"] = not report["problems"] and all(r["passed"] for r in results)
    return report


def _inject(cluster, load, drill, say):
    """One drill under the running load: the fault, its time, the heal, the recovery, and the
    cache checked; the Window to judge once the load has stopped."""
    if not load.alive():
        raise ClusterError(f"locust stopped before drill {drill.name} (see "
                           f"{topology.VAR_DIR}/{CLIENT}/log/locust.log)")
    say(f"drill {drill.name}: {drill.what}")
    t_fault = time.time()
    drill.fault(cluster)
    time.sleep(drill.fault_s)
    t_heal = time.time()
    drill.heal(cluster)
    time.sleep(drill.recover_s)
    waited = await_a_plurk(cluster, t_fault)
    stale, complete = stale_keys(cluster)
    return Window(drill, t_fault, t_heal, time.time(), stale, complete, waited)


def _judge(cluster, window, records, history):
    """One drill's result (dict): its verdict and its figures during and after the fault."""
    drill, stale = window.drill, window.stale
    whole = _window(records, window.fault, window.end)
    problems = []
    if stale:
        problems.append(f"{len(stale)} stale, e.g. {sorted(stale)[:3]}")
    if not window.complete:
        problems.append("checkcache could not reach every memcached after recovery")
    if whole["lost"]:
        problems.append(f"{whole['lost']} lost, e.g. {whole['lost_examples'][:3]}")
    if not whole["deliveries_checked"]:
        problems.append("no delivery was owed in its window: it proves nothing")
    return {
        "name": drill.name, "what": drill.what, "fault_s": drill.fault_s, "recover_s": drill.recover_s,
        "window": {"fault": window.fault, "heal": window.heal, "end": window.end,
                   "waited_for_a_plurk_s": window.waited},
        "stale": len(stale), "stale_examples": [stale[k] for k in sorted(stale)[:10]], "lost": whole["lost"],
        "deliveries_checked": whole["deliveries_checked"],
        "outbox_replays": outbox_replays(cluster, window.fault, window.end),
        "during": _figures(records, history, window.fault, window.heal),
        "after": _figures(records, history, window.heal, window.end),
        "problems": problems, "passed": not problems}


def _run_problems(report, expected_records):
    """What fails the whole run, beyond its drills: stale or lost over the run, missing records."""
    problems = []
    if report["final_stale"]:
        problems.append(f"{report['final_stale']} stale answers after the load stopped")
    if not report["final_check_complete"]:
        problems.append("the last checkcache could not reach every memcached")
    if report["lost_total"]:
        problems.append(f"{report['lost_total']} messages lost over the whole run")
    if report["record_files"] < expected_records:
        problems.append(f"{report['record_files']} locust records files, expected {expected_records}")
    return problems
