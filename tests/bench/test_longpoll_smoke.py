"""bench/longpoll.py --quick end to end (a stack with an edge, an nchan, 100 held connections in
every mode: long-polls and streams through nginx and on the edge, nchan's long-poll and
EventSource subscribers): the structure of its results, not their speed.  Skipped without
Debian's libnginx-mod-nchan."""
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
    proc = subprocess.run([sys.executable, "bench/longpoll.py", "--quick", "--edge-stretch", "150"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
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


STACK_MODES = ("longpoll-edge", "stream-nginx", "stream-edge")


def test_every_mode_holds_every_connection_and_answers_none_early(result):
    point = result["held"]["100"]
    for mode in STACK_MODES + ("nchan-eventsource",):
        r = point[mode]
        assert r["held"] == 100 and r["answered_early"] == 0 and r["failed"] == 0, (mode, r)
    for mode in ("stream-nginx", "stream-edge", "nchan-eventsource"):
        # a stream is open (its 200 head read) and no event came: the client saw no data line
        assert point[mode]["statuses"] == {"stream 200": 100}, (mode, point[mode]["statuses"])
    assert point["longpoll-edge"]["statuses"] == {}


def test_the_edge_path_is_fastpath_alone_and_nginx_is_on_the_other(result):
    point = result["held"]["100"]
    assert set(point["stream-edge"]["per_held"]) == {"fastpath", "path"}
    assert set(point["stream-nginx"]["per_held"]) == {"fastpath", "nginx", "path", "nginx+fastpath"}
    assert set(point["nchan-eventsource"]["per_held"]) == {"nchan nginx", "path"}
    # the server's sockets per held connection: one on the edge, the client's and two of a unix
    # pair to fastpath through nginx
    assert point["stream-edge"]["kernel_per_held"]["server_sockets"] == 1.0
    assert 2.5 < point["stream-nginx"]["kernel_per_held"]["server_sockets"] <= 3.0
    assert set(point["stream-edge"]["kernel_per_held"]) == {
        "slab_bytes_both_ends", "tcp_buffer_bytes_both_ends", "server_sockets", "server_socket_buffer_bytes"}


def test_a_post_reaches_every_held_follower_in_every_mode_with_its_event(result):
    modes = result["fanout"]["modes"]
    for mode in STACK_MODES:
        r = modes[mode]
        assert r["post_status"] == 201 and r["answered_early"] == 0, (mode, r)
        want = {"stream 200": 100, "event": 100} if mode.startswith("stream") else {"200": 100}
        assert r["statuses"] == want, (mode, r["statuses"])
        assert 0 < r["last_answer_s"] < 30 and r["over_nchan_longpoll"] > 0 and r["over_nchan_eventsource"] > 0
    assert modes["nchan-eventsource"]["statuses"] == {"stream 200": 100, "event": 100}


def test_the_push_layer_alone_reaches_every_held_follower_in_every_mode(result):
    modes = result["fanout"]["delivery"]["modes"]
    for mode in STACK_MODES:
        assert modes[mode]["post_status"] == "stored" and modes[mode]["notices"]["datagrams"] >= 1
        assert modes[mode]["answered"] == 100 and "event miss" not in modes[mode]["statuses"], (mode, modes[mode])
    assert modes["nchan-eventsource"]["answered"] == 100


def test_the_edge_stretch_says_how_many_were_held_and_refused(result):
    st = result["edge_stretch"]
    assert st["count"] == 150 and st["held"] == 150 and st["refused"] == 0, st
    assert st["statuses"] == {"stream 200": 150}
    assert "edge: 150 streams held, none refused" in result["goals"]
    assert "fan-out, stream-edge: <= 1.5x nchan's (nchan-eventsource)" in result["goals"]
