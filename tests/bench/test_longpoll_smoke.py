"""bench/longpoll.py --quick end to end (a stack, an nchan, 100 held polls each): the structure of
its results, not their speed.  Skipped without Debian's libnginx-mod-nchan."""
import json
import os
import subprocess
import sys

import pytest

from bench import longpoll

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(not os.path.exists(longpoll.NCHAN_MODULE),
                                reason="libnginx-mod-nchan is not installed (deps/apt-packages.txt)")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    env = dict(os.environ, PLURK_BENCH_RESULTS=str(results))
    proc = subprocess.run([sys.executable, "bench/longpoll.py", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(results / "longpoll.json") as fh:
        return json.load(fh)


def test_every_poll_is_held_by_fastpath_and_every_subscriber_by_nchan(result):
    point = result["held"]["100"]
    assert point["stack"]["held"] == 100 and point["nchan"]["held"] == 100
    # held, not answered: a poll answered at once (a wrong ETag, a miss) would not be measured
    assert point["stack"]["answered_early"] == 0 and point["nchan"]["answered_early"] == 0
    assert point["stack"]["failed"] == 0 and point["nchan"]["failed"] == 0
    for side, parts in (("stack", ("fastpath", "nginx", "nginx+fastpath")), ("nchan", ("nchan nginx",))):
        for part in parts:
            assert set(point[side]["per_held"][part]) == {"rss_bytes", "pss_bytes"}
    assert set(point["stack"]["cpu_pct_quiet"]) == {"fastpath", "nginx", "memcached"}


def test_a_post_through_the_api_answers_every_held_follower_with_its_new_answer(result):
    fan = result["fanout"]
    assert fan["stack"]["post_status"] == 201 and fan["nchan"]["post_status"] == 201
    # 200 with the new count: not 304 (a hold that timed out) nor 404 (a miss sent to Django)
    assert fan["stack"]["statuses"] == {"200": 100} and fan["nchan"]["statuses"] == {"200": 100}
    assert 0 < fan["stack"]["last_answer_s"] < 30 and 0 < fan["nchan"]["last_answer_s"] < 30


def test_the_fan_out_says_what_each_process_spent(result):
    fan = result["fanout"]
    assert set(fan["stack"]["cpu_s"]) == {"fastpath", "nginx", "gunicorn", "memcached", "client"}
    assert set(fan["nchan"]["cpu_s"]) == {"nchan nginx", "client"}


def test_the_push_layer_alone_answers_every_held_follower(result):
    """Answers stored by the bench and one notice: every held poll answered with a 200 (a lost
    notice would leave them held until the re-read; a wrong key would never wake them)."""
    delivery = result["fanout"]["delivery"]
    assert delivery["stack"]["post_status"] == "stored"
    assert delivery["stack"]["notices"]["datagrams"] >= 1
    assert delivery["stack"]["statuses"] == {"200": 100} and delivery["nchan"]["statuses"] == {"200": 100}
    assert 0 < delivery["stack"]["last_answer_s"] < 30 and len(delivery["rounds"]) == 1


def test_the_goals_are_judged_from_the_numbers(result):
    assert "fan-out <= 0.5 s" in result["goals"]
    assert "fastpath RSS per held poll <= 1 KB at 100" in result["goals"]
    assert result["machine"]["cpus"] and result["note"]
