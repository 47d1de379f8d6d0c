"""locustfiles/plurkers.py run as a plain locust user would (no bench/load.py): the host comes from
PLURK_HTTP, bad answers are request failures (not exceptions), and locust itself reports delivery
and exits non-zero on a loss.  Against a fake API (a few seconds each) and once against the stack."""
import csv
import datetime
import http.server
import itertools
import json
import os
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOCUST = os.path.join(os.path.dirname(sys.executable), "locust")
LOCUSTFILE = os.path.join(ROOT, "locustfiles", "plurkers.py")


class FakeApi(http.server.ThreadingHTTPServer):
    """Just enough of the API for the simulation.  ``polls``: "nonjson" answers every poll with a
    200 HTML page (a misrouted request), "silent" with 204 (nothing new, ever: every plurk is lost),
    "holds" as a long-polling fastpath with nothing new: 204 and its ETag, then, for a request
    with Prefer: wait and that ETag, a 304 after HOLD_S with Preference-Applied.  A stream
    (``Accept: text/event-stream``) is answered as Django does (one empty event per resource,
    ``retry:``, the end), except with "streams": fastpath's, open, its first events the count
    (1) and the messages (plurk 7), then heartbeats."""

    HOLD_S = 1.5

    daemon_threads = True

    def __init__(self, polls):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.polls = polls
        self.requests = []
        self.poll_headers = []         # (Prefer, If-None-Match) of every poll
        self.ids = itertools.count(1)
        self.messages_asked = 0
        self.stream_paths = []         # the path of every stream request

    LAG = 2

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()

    @property
    def hostport(self):
        return f"127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status, body=b"", content_type="application/json", cache=None):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if body:
            self.send_header("Content-Type", content_type)
        if cache:
            self.send_header("X-Cache", cache)
        self.end_headers()
        self.wfile.write(body)

    def _hold(self):
        etag = '"e3b0c44298fc1c149afbf4c8996fb924"'        # of the empty body
        self.send_response(304 if self.headers.get("If-None-Match") == etag else 204)
        if self.headers.get("Prefer"):
            if self.headers.get("If-None-Match") == etag:
                time.sleep(self.server.HOLD_S)
            self.send_header("Preference-Applied", "wait=50")
        self.send_header("ETag", etag)
        self.send_header("X-Cache", "HIT")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _lagging(self):
        """One plurk (id 7) is unread from the start; getUnreadCount says so (count 1, held on
        its ETag, 304 after HOLD_S), but the first LAG getMessages answers are still the old
        "nothing unread" (204): the count's key was written before the messages' key."""
        if self.path.startswith("/Poll/getMessages"):
            self.server.messages_asked += 1
            if self.server.messages_asked <= self.server.LAG:
                return self._send(204, cache="HIT")
            item = {"id": 7, "kind": "plurk", "author": "celeb", "content": "x",
                    "created": "2026-01-01T00:00:00.000Z"}
            return self._json(200, {"count": 1, "items": [item]})
        etag = '"count-1"'
        held = self.headers.get("If-None-Match") == etag
        if held and self.headers.get("Prefer"):
            time.sleep(self.server.HOLD_S)
        body = b"" if held else b'{"count":1}'
        self.send_response(304 if held else 200)
        if self.headers.get("Prefer"):
            self.send_header("Preference-Applied", "wait=50")
        self.send_header("ETag", etag)
        self.send_header("X-Cache", "HIT")
        self.send_header("Content-Length", str(len(body)))
        if body:
            self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def _stream(self):
        self.server.stream_paths.append(self.path)
        resources = self.path[len("/Poll/"):].split(",")
        if self.server.polls != "streams":               # Django's: one event each, then the end
            body = "retry: 300\n\n" + "".join(f'id: ""\nevent: {r}\ndata: \n\n' for r in resources)
            return self._send(200, body.encode(), "text/event-stream", cache="MISS")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Cache", "HIT")
        self.end_headers()
        now = datetime.datetime.now(datetime.timezone.utc)
        item = {"id": 7, "kind": "plurk", "author": "celeb", "content": "x",
                "created": now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"}
        blocks = ['id: "c",""\nevent: getUnreadCount\ndata: {"count":1}\n\n',
                  f'id: "c","m"\nevent: getMessages\ndata: {json.dumps({"count": 1, "items": [item]})}\n\n']
        try:
            for block in blocks + [": \n\n"] * 40:
                data = block.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                time.sleep(0.25)
        except OSError:
            pass
        self.close_connection = True

    def _json(self, status, obj):
        self._send(status, json.dumps(obj).encode())

    def do_GET(self):
        self.server.requests.append(("GET", self.path))
        if self.path.startswith("/Poll/"):
            self.server.poll_headers.append((self.headers.get("Prefer"), self.headers.get("If-None-Match")))
            if "text/event-stream" in self.headers.get("Accept", ""):
                self._stream()
            elif self.server.polls == "holds":
                self._hold()
            elif self.server.polls == "lagging":
                self._lagging()
            elif self.server.polls == "nonjson":
                self._send(200, b"<html>not the API</html>", "text/html", cache="HIT")
            else:
                self._send(204, cache="HIT")
        elif self.path.startswith("/api/timeline"):
            self._json(200, {"items": []})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self.server.requests.append(("POST", self.path))
        if self.path in ("/api/signup", "/api/login"):
            self._json(201 if self.path == "/api/signup" else 200,
                       {"token": f"t-{body['username']}", "user": {"username": body["username"]}})
        elif self.path == "/api/follow":
            self._json(201, {"following": body["username"]})
        elif self.path == "/api/plurks":
            now = datetime.datetime.now(datetime.timezone.utc)    # the API's created, to the ms
            self._json(201, {"id": next(self.server.ids),
                             "created": now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"})
        elif self.path == "/api/markRead":
            self._send(204)
        else:
            self._json(404, {"error": "not found"})


def _plain_locust(tmp_path, plurk_http, *args, env=None, timeout=120):
    """`locust -f locustfiles/plurkers.py --headless ...` with PLURK_HTTP and *no* --host."""
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("PLURK_LOAD_")}
    run_env.update(env or {}, PLURK_HTTP=plurk_http)
    proc = subprocess.run([LOCUST, "-f", LOCUSTFILE, "--headless", "--csv", str(tmp_path / "locust"),
                           "--loglevel", "WARNING", *args],
                          env=run_env, cwd=str(tmp_path), capture_output=True, text=True, timeout=timeout)
    return proc, proc.stdout + proc.stderr


def _csv(tmp_path, name):
    path = tmp_path / f"locust_{name}.csv"
    with open(path) as fh:
        return list(csv.DictReader(fh))


@pytest.mark.load
@pytest.mark.parametrize("mode, name", [("short", "/Poll/getUnreadCount"), ("long", "/Poll/getUnreadCount (held)")])
def test_a_poll_answer_that_is_not_json_is_a_failure_and_the_run_fails(tmp_path, mode, name):
    with FakeApi("nonjson") as api:
        proc, out = _plain_locust(tmp_path, api.hostport, "-u", "2", "-r", "2", "-t", "4s", "--poll-mode", mode,
                                  env={"PLURK_LOAD_POLL_WAIT": "0.3"})
        assert ("GET", "/Poll/getUnreadCount") in api.requests, out[-3000:]   # host: PLURK_HTTP
    assert proc.returncode == 1, out[-3000:]
    failures = _csv(tmp_path, "failures")
    assert any(f["Name"] == name and "not JSON" in f["Error"] for f in failures), failures
    assert _csv(tmp_path, "exceptions") == [], out[-3000:]     # a failure, not an exception


@pytest.mark.load
@pytest.mark.parametrize("mode", ["short", "long", "stream"])
def test_a_lost_plurk_makes_locust_itself_exit_non_zero(tmp_path, mode):
    """Every poll says "nothing new": the celebrity's plurks never reach its followers.  No request
    fails, yet the run must fail: the in-locust verdict sets the exit status.  (Streams: each one
    Django's, empty; a stream asked for after a post, that does not carry it, lost it.)"""
    setup = {"celebrities": [{"username": "celeb", "token": "t-celeb"}],
             "users": [{"username": f"fan{i}", "token": f"t-fan{i}", "follows": ["celeb"]} for i in range(3)]}
    (tmp_path / "setup.json").write_text(json.dumps(setup))
    with FakeApi("silent") as api:
        proc, out = _plain_locust(tmp_path, api.hostport, "-u", "4", "-r", "4", "-t", "6s",
                                  env={"PLURK_LOAD_SETUP": str(tmp_path / "setup.json"),
                                       "PLURK_LOAD_POLL_WAIT": "0.3", "PLURK_LOAD_CELEB_WAIT": "0.3",
                                       "PLURK_LOAD_POLL_MODE": mode, "PLURK_LOAD_STREAM_VIA": "nginx"})
    assert ("POST", "/api/plurks") in api.requests, out[-3000:]
    assert proc.returncode == 1, out[-3000:]
    assert sum(int(r["Failure Count"]) for r in _csv(tmp_path, "stats") if r["Name"] == "Aggregated") == 0, out
    line = next((ln for ln in out.splitlines() if ln.startswith("delivery (4 users")), None)
    assert line is not None and "LOST 0" not in line and "LOST" in line, out[-3000:]


@pytest.mark.load
def test_stream_mode_reads_the_messages_from_the_stream_not_a_fetch(tmp_path):
    """As the timeline page: one stream of both resources; the plurk is first seen when the
    getMessages event carrying it is read (no GET /Poll/getMessages), as the delivery's record."""
    records = tmp_path / "records"
    with FakeApi("streams") as api:
        proc, out = _plain_locust(tmp_path, api.hostport, "-u", "1", "-r", "1", "-t", "4s",
                                  env={"PLURK_LOAD_POLL_WAIT": "0.3", "PLURK_LOAD_WRITE_WEIGHT": "0",
                                       "PLURK_LOAD_POLL_MODE": "stream", "PLURK_LOAD_STREAM_VIA": "nginx",
                                       "PLURK_LOAD_RECORDS": str(records)})
        requests, paths = list(api.requests), list(api.stream_paths)
    assert proc.returncode == 0, out[-3000:]
    assert paths == ["/Poll/getUnreadCount,getMessages"], (paths, out[-3000:])
    assert not any(path.startswith("/Poll/getMessages") for _, path in requests), requests
    stats = {(r["Type"], r["Name"]): r for r in _csv(tmp_path, "stats")}
    assert int(stats[("GET", "/Poll/getUnreadCount,getMessages (stream)")]["Request Count"]) == 1, stats.keys()
    seen = [s for p in records.glob("*.json") for s in json.loads(p.read_text())["seen"]]
    assert [s[1] for s in seen] == [7], seen
    _, _, first, arrived, handled = seen[0]
    assert first == handled and arrived is not None and arrived <= handled, seen     # seen as read
    # what was shown is marked read a moment later (the page's rule), with the stream still open
    assert ("POST", "/api/markRead") in requests, requests


@pytest.mark.load
def test_long_mode_keeps_one_held_poll_in_flight_with_its_etag(tmp_path):
    """Each user sends Prefer: wait and, once it has one, the ETag of its last answer, and polls
    again at once after a held answer: about one poll per hold, not one per poll wait."""
    with FakeApi("holds") as api:
        proc, out = _plain_locust(tmp_path, api.hostport, "-u", "2", "-r", "2", "-t", "6s",
                                  env={"PLURK_LOAD_POLL_WAIT": "0.3", "PLURK_LOAD_WRITE_WEIGHT": "0"})
    polls = api.poll_headers
    assert proc.returncode == 0, out[-3000:]
    assert polls and all(prefer == "wait=50" for prefer, _ in polls), polls
    assert sum(inm is not None for _, inm in polls) >= 2, polls          # held with the ETag
    assert len(polls) <= 2 * (6 / FakeApi.HOLD_S + 3), polls             # short polls would be ~40


@pytest.mark.load
def test_messages_behind_their_count_are_asked_for_again_not_held_over(tmp_path):
    """A count answer can be read before the messages it announces are stored (two keys): the
    user must fetch the messages again, not hold its next poll on the count's ETag (which would
    show the plurk only at the next change: the drill that found it lost one)."""
    records = tmp_path / "records"
    with FakeApi("lagging") as api:
        proc, out = _plain_locust(tmp_path, api.hostport, "-u", "1", "-r", "1", "-t", "8s",
                                  env={"PLURK_LOAD_POLL_WAIT": "0.3", "PLURK_LOAD_WRITE_WEIGHT": "0",
                                       "PLURK_LOAD_RECORDS": str(records)})
        asked = api.messages_asked
    data = [json.loads(p.read_text()) for p in records.glob("*.json")]
    assert asked > FakeApi.LAG, (asked, out[-3000:])
    assert any(seen[1] == 7 for rec in data for seen in rec["seen"]), (asked, out[-3000:])
    assert sum(rec["behind"] for rec in data) >= FakeApi.LAG, data


@pytest.mark.load
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["short", "long", "stream"])
def test_plain_locust_run_against_the_stack_reports_delivery(stack, tmp_path, mode):
    """No setup file, no --host: users sign up at PLURK_HTTP, follow each other, post and poll;
    locust prints its own delivery line (nothing lost) and exits 0."""
    edge = stack.config.edge          # the stack's, not PLURK_EDGE's default port
    proc, out = _plain_locust(tmp_path, f"{stack.config.http[0]}:{stack.config.http[1]}",
                              "-u", "6", "-r", "3", "-t", "15s", "--poll-mode", mode,
                              env={"PLURK_LOAD_POLL_WAIT": "1", "PLURK_LOAD_WRITE_WEIGHT": "6",
                                   "PLURK_EDGE": f"{edge[0]}:{edge[1]}" if edge else ""})
    assert proc.returncode == 0, out[-3000:]
    stats = {(r["Type"], r["Name"]): r for r in _csv(tmp_path, "stats")}
    assert int(stats[("POST", "/api/signup")]["Request Count"]) == 6, stats.keys()
    if mode == "short":
        assert int(stats[("GET", "/Poll/getUnreadCount")]["Request Count"]) > 20
    elif mode == "long":
        assert int(stats[("GET", "/Poll/getUnreadCount (held)")]["Request Count"]) >= 6
        assert ("GET", "/Poll/getUnreadCount") not in stats
    else:
        # one stream per user through nginx (the stack has no edge unless PLURK_EDGE is set),
        # kept open: not one per delivery
        name = "/Poll/getUnreadCount,getMessages (edge stream)" if getattr(stack.config, "edge", None) else \
            "/Poll/getUnreadCount,getMessages (stream)"
        assert 6 <= int(stats[("GET", name)]["Request Count"]) <= 12, stats.keys()
        assert ("GET", "/Poll/getUnreadCount (held)") not in stats
        assert ("GET", "/Poll/getMessages") not in stats        # the messages came by the stream
        # the streams' events did deliver (a stream that never parsed one would lose nothing
        # in the judge's eyes: no poll completes after a post)
        assert int(stats[("delivery", "plurk first seen by a follower")]["Request Count"]) > 0, stats.keys()
    assert int(stats[("", "Aggregated")]["Failure Count"]) == 0
    line = next((ln for ln in out.splitlines() if ln.startswith("delivery (6 users")), None)
    assert line is not None and "LOST 0" in line and "poll hit ratio" in line, out[-3000:]


@pytest.mark.load
def test_what_was_shown_is_marked_read_once_when_it_has_been_seen_a_moment(tmp_path):
    """As the page: one markRead for what was shown, once it has been on screen READ_AFTER_S, and
    the hold before it ends when the read falls due (not a markRead after every answer, which
    blocked the next poll behind Django under load)."""
    with FakeApi("lagging") as api:
        proc, out = _plain_locust(tmp_path, api.hostport, "-u", "1", "-r", "1", "-t", "8s",
                                  env={"PLURK_LOAD_POLL_WAIT": "0.3", "PLURK_LOAD_WRITE_WEIGHT": "0",
                                       "PLURK_LOAD_READ_AFTER_S": "2"})
        marks = api.requests.count(("POST", "/api/markRead"))
        prefers = [prefer for prefer, _ in api.poll_headers]
    assert proc.returncode == 0, out[-3000:]
    assert marks == 1, (marks, out[-3000:])
    assert "wait=2" in prefers and prefers[-1] == "wait=50", prefers
