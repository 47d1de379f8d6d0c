"""The failure drills (plurksite.cluster.drills): the short run of `make test` for real (the
namespace cluster, 2,000 long-polling locust users, a memcached host partitioned and a web host
killed whole), and the verdict arithmetic on made-up records."""
import os
import subprocess
import sys

import pytest

from plurksite.cluster import ClusterError, drills, netns
from plurksite.config import ROOT


def test_the_short_drill_passes_and_leaves_nothing_behind(tmp_path):
    report = tmp_path / "drills.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "manage.py"), "drill", "--short",
                           "--json", str(report)], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    out = done.stdout
    verdicts = [line for line in out.splitlines() if line.startswith("drill ") and (": PASS" in line or ": FAIL" in line)]
    assert done.returncode == 0, out[-3000:] + done.stderr[-2000:]
    assert [v.split(":")[0] for v in verdicts] == ["drill memcached-partition", "drill web-host-lost"], out[-3000:]
    assert all(": PASS:" in v and "stale 0, lost 0 of " in v for v in verdicts), verdicts
    assert out.strip().splitlines()[-1].startswith("drills: 2 run, 2 passed, 0 failed; stale 0 (after the load: 0), lost 0")
    import json
    data = json.loads(report.read_text())
    assert data["users"] == 2000 and data["passed"]
    assert all(d["deliveries_checked"] > 0 for d in data["drills"])
    assert [n for n in netns.namespaces() if n.startswith("plk")] == []
    assert [n for n in netns.links() if n.startswith("plk")] == []


# ---- the arithmetic ---------------------------------------------------------------------------

def _records(posts, seen, polls, follows):
    return [{"accounts": ["author", "f1", "f2"], "users": 3, "posts": posts, "follows": follows, "seen": seen,
             "polls": polls, "cache": {"HIT": 0, "MISS": 0}, "truncated": 0}]


def test_a_window_judges_only_the_plurks_committed_in_it():
    follows = [["f1", "author", 0.0], ["f2", "author", 0.0]]
    # [author, plurk, started, committed, created]: latency is first seen - created (plurksite.delivery)
    posts = [["author", 1, 99.0, 100.0, 100.0], ["author", 2, 109.0, 110.0, 110.0],
             ["author", 3, 119.0, 120.0, 120.0]]
    seen = [["f1", 1, 100.5], ["f2", 1, 101.0], ["f1", 2, 111.0], ["f1", 3, 120.2], ["f2", 3, 120.4]]
    polls = {"f1": 130.0, "f2": 130.0}          # f2 polled after plurk 2 and never saw it: lost
    records = _records(posts, seen, polls, follows)
    first = drills._window(records, 100.0, 110.0)
    assert (first["plurks_posted"], first["lost"], first["deliveries_checked"]) == (1, 0, 2)
    assert first["delivery_latency_s"]["max"] == pytest.approx(1.0)
    second = drills._window(records, 110.0, 120.0)
    assert (second["lost"], second["lost_examples"]) == (1, [["author", 2, "f2"]])
    assert drills._window(records, 130.0, 140.0)["deliveries_checked"] == 0


def test_a_drill_fails_on_a_stale_key_a_lost_plurk_or_an_empty_window():
    follows = [["f1", "author", 0.0], ["f2", "author", 0.0]]
    posts = [["author", 1, 99.0, 100.0, 100.0], ["author", 2, 109.0, 110.0, 110.0]]
    seen = [["f1", 1, 100.5], ["f2", 1, 101.0], ["f1", 2, 111.0]]
    records = _records(posts, seen, {"f1": 130.0, "f2": 130.0}, follows)
    history = [(95, 0, 0), (100, 10, 0), (105, 30, 4), (112, 50, 4)]
    cluster = type("C", (), {"hosts": []})()
    drill = drills.select(["web-host-lost"])[0]
    good = drills._judge(cluster, drills.Window(drill, 100.0, 105.0, 109.0, {}, True, 0.5), records, history)
    assert good["passed"] and good["problems"] == []
    assert (good["deliveries_checked"], good["during"]["requests"], good["during"]["failures"]) == (2, 20, 4)
    stale = drills._judge(cluster, drills.Window(drill, 100.0, 105.0, 109.0, {"k": "k: cached x"}, True, 0), records,
                          history)
    assert not stale["passed"] and stale["problems"][0].startswith("1 stale") and stale["stale_examples"] == ["k: cached x"]
    lost = drills._judge(cluster, drills.Window(drill, 109.0, 112.0, 120.0, {}, True, 0), records, history)
    assert not lost["passed"] and lost["problems"] == ["1 lost, e.g. [['author', 2, 'f2']]"]
    empty = drills._judge(cluster, drills.Window(drill, 200.0, 205.0, 210.0, {}, False, 60.0), records, history)
    assert empty["problems"] == ["checkcache could not reach every memcached after recovery",
                                 "no delivery was owed in its window: it proves nothing"]


def test_the_run_fails_on_what_no_single_drill_saw():
    clean = {"final_stale": 0, "final_check_complete": True, "lost_total": 0, "record_files": 2}
    assert drills._run_problems(clean, expected_records=2) == []
    assert drills._run_problems(dict(clean, final_stale=3, lost_total=1, record_files=1), expected_records=2) == [
        "3 stale answers after the load stopped", "1 messages lost over the whole run",
        "1 locust records files, expected 2"]


def test_requests_and_failures_between_two_times_come_from_the_cumulative_history():
    history = [(100, 10, 0), (101, 30, 2), (103, 50, 5), (110, 90, 5)]
    assert drills._count_between(history, 101, 103) == (20, 3)
    assert drills._count_between(history, 102, 109) == (20, 3)      # the last row at or before each time
    assert drills._count_between(history, 90, 200) == (90, 5)
    assert drills._count_between([], 0, 1) == (0, 0)


class _Checker:
    """Stands in for the cluster: each checkcache run prints the next of ``runs``."""

    def __init__(self, runs, status=None):
        self.runs, self.status, self.calls = list(runs), status, 0

    def run_on(self, name, argv, timeout=300):
        assert name == drills.CHECKER and argv[-1] == "checkcache"
        keys = self.runs[min(self.calls, len(self.runs) - 1)]
        self.calls += 1
        out = "".join(f"{k}: cached b'x', database b'y'\n" for k in keys) + f"5 user(s), 10 cached answer(s), {len(keys)} difference(s)\n"
        status = self.status if self.status is not None else (1 if keys else 0)
        return subprocess.CompletedProcess(argv, status, out, "")


def test_stale_is_what_every_checkcache_run_finds_different():
    in_flight = _Checker([{"p1:a:1:0", "p1:a:2:0"}, {"p1:a:2:0"}, {"p1:a:2:0", "p1:a:3:0"}])
    stale, complete = drills.stale_keys(in_flight, pauses=(0, 0))
    assert (set(stale), complete) == ({"p1:a:2:0"}, True)
    assert stale["p1:a:2:0"].startswith("p1:a:2:0: cached ")       # checkcache's own line, for the report
    settled = _Checker([{"p1:a:1:0"}, set()])
    assert drills.stale_keys(settled, pauses=(0, 0)) == ({}, True) and settled.calls == 2
    unreachable = _Checker([set()], status=2)
    assert drills.stale_keys(unreachable, pauses=(0,)) == ({}, False)
    with pytest.raises(ClusterError, match="checkcache failed"):
        drills.stale_keys(_Checker([set()], status=3), pauses=(0,))


def test_unknown_drills_are_refused_in_one_line():
    with pytest.raises(ClusterError, match="no drill nope; the drills are memcached-partition, "):
        drills.select(["memcached-partition", "nope"])
    assert [d.name for d in drills.select(drills.SHORT)] == ["memcached-partition", "web-host-lost"]


def test_every_drill_names_hosts_and_services_the_cluster_has():
    """Each fault and heal, run against a recorder: the hosts exist in the topology, the
    services are ones the harness can find (a typo would stop `make drill` mid-run)."""
    from plurksite.cluster import harness, topology

    class Recorder:
        def __init__(self):
            self.calls = []

        def __getattr__(self, method):
            def record(*args):
                self.calls.append((method, *args))
            return record

    names = {h.name for h in topology.hosts()}
    for drill in drills.DRILLS:
        cluster = Recorder()
        drill.fault(cluster)
        drill.heal(cluster)
        assert cluster.calls, drill.name
        for method, host, *rest in cluster.calls:
            assert hasattr(harness.Cluster, method), (drill.name, method)
            assert host in names, (drill.name, host)
            if method in ("kill_service", "service_pids"):
                assert rest[0] in harness.SERVICE_MATCH, (drill.name, rest)
            if method == "restart_service":
                assert rest == ["postgres"], (drill.name, rest)


def test_outbox_replays_are_counted_from_the_repair_hosts_log(tmp_path, monkeypatch):
    from plurksite.cluster import topology
    import time as _time

    monkeypatch.setattr(drills.plurk_config, "ROOT", str(tmp_path))
    hosts = topology.hosts()
    repairer = next(h for h in hosts if "repair" in h.roles)
    log_dir = tmp_path / repairer.var_dir / "log"
    log_dir.mkdir(parents=True)
    at = lambda t: _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(t)) + ",123"
    (log_dir / "repaircache.log").write_text(
        f"{at(1000)} WARNING fastpoll.repair: writing the answers of 3 change(s) whose writer did not finish\n"
        f"{at(2000)} WARNING fastpoll.repair: writing the answers of 4 change(s) whose writer did not finish\n"
        f"{at(2000)} INFO fastpoll.repair: memcached x answers again: flushed its entries before trusting it\n")
    cluster = type("C", (), {"hosts": hosts})()
    assert drills.outbox_replays(cluster, 1500, 2500) == 4
    assert drills.outbox_replays(cluster, 0, 5000) == 7
    assert drills.outbox_replays(cluster, 2001, 2500) == 0


class _Counter:
    """A cluster whose database answers the counts given, one per ``run_on``."""

    def __init__(self, counts, status=0):
        self.counts, self.status, self.calls = list(counts), status, 0

    def run_on(self, name, argv, timeout=None):
        assert name == drills.CHECKER and "shell" in argv
        self.calls += 1
        return subprocess.CompletedProcess(argv, self.status, stdout=f"{self.counts.pop(0)}\n", stderr="boom\n")


def test_a_window_is_stretched_until_a_plurk_was_committed_in_it():
    cluster = _Counter([0, 0, 2])
    drills.await_a_plurk(cluster, 0.0, limit_s=5, poll_s=0)
    assert cluster.calls == 3
    cluster = _Counter([0] * 100)
    drills.await_a_plurk(cluster, 0.0, limit_s=0.05, poll_s=0.01)      # gives up: the verdict says why
    assert 1 < cluster.calls < 100
    with pytest.raises(ClusterError, match="counting plurks failed .status 1.: boom"):
        drills.await_a_plurk(_Counter([0], status=1), 0.0)
