"""The delivery judge and bench/load.py's verdict, on hand-made records (no stack, no locust)."""
import json

from bench import load
from plurksite import delivery as _delivery


def _records(accounts, posts=(), follows=(), polls=None, seen=(), hits=1):
    return {"pid": 1, "runner": "worker", "worker_index": 0, "users": len(accounts),
            "accounts": list(accounts), "logins": 0, "posts": list(posts), "follows": list(follows),
            "polls": dict(polls or {}), "seen": list(seen), "cache": {"HIT": hits, "MISS": 0},
            "truncated": 0}


def test_disjoint_processes_pass():
    a = _records(["alice", "bob"], posts=[["alice", 7, 10.0, 10.1, 10.05]],
                 follows=[["bob", "alice", 0.0]], polls={"alice": 11.0, "bob": 12.0}, seen=[["bob", 7, 10.5]])
    b = _records(["carol"], polls={"carol": 12.0})
    verdict = _delivery.judge([a, b])
    assert verdict["shared_accounts"] == 0
    assert verdict["distinct_accounts"] == verdict["accounts_run"] == 3
    assert verdict["deliveries_checked"] == 1 and verdict["lost"] == 0
    assert abs(verdict["delivery_latency_s"]["p50"] - 0.45) < 1e-9       # from created (10.05)
    assert verdict["delivery_latency_s"]["p99"] == verdict["delivery_latency_s"]["p50"]


def test_percentiles_are_of_the_checked_deliveries():
    values = [i / 1000 for i in range(1, 201)]          # 1 ms .. 200 ms
    assert _delivery.percentile(values, 50) == 0.101
    assert _delivery.percentile(values, 99) == 0.198
    assert _delivery.percentile([], 99) is None


def test_an_account_run_by_two_processes_is_rejected():
    """The bug the offsets computed at import time caused: every worker drove the same accounts."""
    a = _records(["alice", "bob"], polls={"alice": 11.0, "bob": 12.0})
    b = _records(["bob", "carol"], polls={"bob": 13.0, "carol": 12.0})
    verdict = _delivery.judge([a, b])
    assert verdict["shared_accounts"] == 1 and verdict["shared_examples"] == ["bob"]
    assert verdict["distinct_accounts"] == 3 and verdict["accounts_run"] == 4
    assert "more than one process" in _delivery.summary(verdict)


def test_a_follower_that_polled_after_the_post_and_never_saw_it_is_lost():
    rec = _records(["alice", "bob"], posts=[["alice", 7, 10.0, 10.1, 10.05]], follows=[["bob", "alice", 0.0]],
                   polls={"bob": 12.0})
    verdict = _delivery.judge([rec])
    assert verdict["lost"] == 1 and verdict["lost_examples"] == [["alice", 7, "bob"]]
    assert "LOST 1" in _delivery.summary(verdict)


def test_latency_is_from_created_even_when_the_authors_201_comes_later():
    """The followers' streams often deliver before the author reads its 201: from ``created``
    those deliveries are what they are (12, 20, 30 ms), where ``seen - committed`` read 0."""
    posts = [["alice", 1, 100.000, 100.050, 100.010]]         # 201 read 40 ms after created
    follows = [[f, "alice", 0.0] for f in ("bob", "carol", "dave")]
    seen = [["bob", 1, 100.022], ["carol", 1, 100.030], ["dave", 1, 100.040]]
    verdict = _delivery.judge([_records(["alice", "bob", "carol", "dave"], posts, follows,
                                        polls={"bob": 101.0, "carol": 101.0, "dave": 101.0}, seen=seen)])
    lat = verdict["delivery_latency_s"]
    assert verdict["latency_from"] == "created" and verdict["deliveries_checked"] == 3
    assert abs(lat["p50"] - 0.020) < 1e-9 and abs(lat["max"] - 0.030) < 1e-9
    assert abs(lat["p99"] - 0.030) < 1e-9
    assert verdict["clock_disagreements"] == 0 and verdict["untimed_deliveries"] == 0


def test_stages_split_each_delivery_at_the_events_arrival_and_handling():
    """created -> arrived (kernel) is the stack's, arrived -> handled locust's, handled -> seen the
    getMessages fetch; a sight without them (a poll) counts in the latency only."""
    posts = [["alice", 1, 100.0, 100.2, 100.010]]
    seen = [["bob", 1, 100.060, 100.020, 100.045], ["carol", 1, 100.5]]
    rec = _records(["alice", "bob", "carol"], posts, [["bob", "alice", 0.0], ["carol", "alice", 0.0]],
                   polls={"bob": 101.0, "carol": 101.0}, seen=seen)
    verdict = _delivery.judge([rec])
    stages = verdict["stages_s"]
    assert stages["stack"]["deliveries"] == stages["client"]["deliveries"] == stages["fetch"]["deliveries"] == 1
    assert abs(stages["stack"]["p50"] - 0.010) < 1e-9
    assert abs(stages["client"]["p50"] - 0.025) < 1e-9
    assert abs(stages["fetch"]["p99"] - 0.015) < 1e-9
    assert verdict["deliveries_checked"] == 2 and abs(verdict["delivery_latency_s"]["max"] - 0.490) < 1e-9
    assert "stack p50 10 ms" in _delivery.summary(verdict)
    # shown by a fetch an earlier event announced (handled before it was created): no stages
    rec["seen"] = [["bob", 1, 100.060, 99.990, 100.000], ["carol", 1, 100.5]]
    verdict = _delivery.judge([rec])
    assert verdict["stages_announced_before"] == 1 and verdict["stages_s"]["stack"]["deliveries"] == 0
    assert abs(verdict["delivery_latency_s"]["p50"] - 0.050) < 1e-9


def test_a_delivery_before_its_created_is_counted_and_kept_not_clamped():
    posts = [["alice", 1, 100.0, 100.2, 100.1]]
    seen = [["bob", 1, 100.05], ["carol", 1, 100.3]]            # bob: 50 ms before created
    rec = _records(["alice", "bob", "carol"], posts, [["bob", "alice", 0.0], ["carol", "alice", 0.0]],
                   polls={"bob": 101.0, "carol": 101.0}, seen=seen)
    verdict = _delivery.judge([rec])
    assert verdict["clock_disagreements"] == 1
    assert verdict["clock_disagreement_examples"] == [["alice", 1, "bob", -0.05]]
    lat = verdict["delivery_latency_s"]
    assert verdict["deliveries_checked"] == 2
    # kept as measured: the p50 of (-50 ms, 200 ms) is the negative one, not a clamped 0
    assert abs(lat["p50"] + 0.05) < 1e-9 and abs(lat["max"] - 0.2) < 1e-9
    assert "clocks disagree" in _delivery.summary(verdict)
    problems = load.problems_of(_verdict(clock_disagreements=1))
    assert len(problems) == 1 and "clocks" in problems[0]


def test_a_post_recorded_without_created_is_not_timed_and_fails_the_run():
    rec = _records(["alice", "bob"], posts=[["alice", 7, 10.0, 10.1]], follows=[["bob", "alice", 0.0]],
                   polls={"bob": 12.0}, seen=[["bob", 7, 10.5]])
    verdict = _delivery.judge([rec])
    assert verdict["deliveries_checked"] == 1 and verdict["untimed_deliveries"] == 1
    assert verdict["delivery_latency_s"]["p50"] is None
    assert "without their created" in load.problems_of(dict(_verdict(), untimed_deliveries=1))[0]


def _verdict(**overrides):
    verdict = {"lost": 0, "failures": 0, "exceptions": 0, "locust_exit": 0, "requests": 100,
               "record_files_with_users": 2, "record_files_expected": 2, "shared_accounts": 0,
               "shared_examples": []}
    verdict.update(overrides)
    return verdict


def test_bench_verdict_fails_on_every_kind_of_problem():
    assert load.problems_of(_verdict()) == []
    for bad, words in ((dict(lost=1), "lost"), (dict(failures=2), "failed"),
                       (dict(exceptions=1), "exceptions in locust tasks"),
                       (dict(locust_exit=1), "locust exited with status 1"),
                       (dict(requests=0), "no requests"),
                       (dict(record_files_with_users=1), "records files"),
                       (dict(shared_accounts=1, shared_examples=["bob"]), "more than one locust process")):
        problems = load.problems_of(_verdict(**bad))
        assert len(problems) == 1 and words in problems[0], (bad, problems)


def test_bench_judge_counts_the_records_files(tmp_path):
    for pid, accounts in ((11, ["a", "b"]), (12, ["c"]), (13, [])):
        (tmp_path / f"{pid}.json").write_text(json.dumps(_records(accounts)))
    verdict = load.judge(str(tmp_path), expected_processes=2)
    assert verdict["record_files"] == 3 and verdict["record_files_with_users"] == 2
    assert load.problems_of(dict(verdict, failures=0, exceptions=0, locust_exit=0, requests=1)) == []
    (tmp_path / "12.json").unlink()
    verdict = load.judge(str(tmp_path), expected_processes=2)
    problems = load.problems_of(dict(verdict, failures=0, exceptions=0, locust_exit=0, requests=1))
    assert problems and "expected 2" in problems[0]


def test_progress_reads_a_half_written_stats_file_as_nothing_yet(tmp_path):
    """locust rewrites its stats CSV while the run goes on: a short last row is not a crash."""
    header = "Type,Name,Request Count,Failure Count\n"
    (tmp_path / "locust_stats.csv").write_text(header + "GET,/Poll/x,10,1\nPOST,/api/plurks,3,0\n")
    assert load._stats_failures(str(tmp_path / "locust")) == (13, 1)
    (tmp_path / "locust_stats.csv").write_text(header + "GET,/Poll/x,10,1\nPOST,/api/plu")
    assert load._stats_failures(str(tmp_path / "locust")) == (None, None)


def test_machine_cpu_is_in_percent_of_one_core_and_names_what_was_not_ours(monkeypatch):
    monkeypatch.setattr(load.os, "cpu_count", lambda: 2)
    # 300 of 400 jiffies busy on 2 cores: 150% of one core; the stack and locust used 100
    m = load.machine_cpu((1000, 5000), (1300, 5400), {"gunicorn": {"cpu_pct_mean": 60.0},
                                                      "locust": {"cpu_pct_mean": 40.0}})
    assert m == {"cores": 2, "busy_pct": 150.0, "others_pct": 50.0}
    assert load.machine_cpu((0, 0), (0, 0)) == {"cores": 2, "busy_pct": None}


def test_a_run_without_edge_streams_through_nginx_even_when_the_stack_has_an_edge():
    """PLURK_EDGE has a default and the locustfile falls back to it: without this, the "through
    nginx" run streamed on the edge (load-streampoll-nginx.json said edge None)."""
    assert load.stream_via(False, {}) == "nginx"
    assert load.stream_via(True, {}) == "edge"
    assert load.stream_via(False, {"PLURK_LOAD_EDGE": "127.0.0.1:9"}) == "edge"
    assert load.stream_via(True, {"PLURK_LOAD_STREAM_VIA": "nginx"}) == "nginx"
    assert load.streams_used({"GET /Poll/getUnreadCount (edge stream)": {}}) == "edge"
    assert load.streams_used({"GET /Poll/getUnreadCount (stream)": {}, "GET /Poll/getMessages": {}}) == "nginx"
    assert load.streams_used({"GET /Poll/getMessages": {}}) is None
    assert load.streams_used({"GET /Poll/getUnreadCount,getMessages (edge stream)": {}}) == "edge"
    assert load.streams_used({"GET /Poll/getUnreadCount,getMessages (stream)": {}}) == "nginx"
