"""fastpoll's browser client (fastpoll/static/fastpoll/fastpoll.js) in headless Chromium, against a
stub ``fetch`` that answers as fastpath, Django or a failing nginx would (docs/contract.md, "The
answer") and a stub ``EventSource`` that opens, sends events, misses and fails as fastpath's,
Django's and the edge's streams do (sections 9 and 10):

- polls: it re-polls at once only after an answer fastpath held (``Preference-Applied``), waits
  the short-poll interval after Django's (fastpath or memcached down: re-polling at once spins),
  backs off on errors with jitter, and without EventSource it long-polls;
- streams: an answer is given once (by its ETag, whichever transport brings it); ``event: miss``
  is one poll of the site, then the same stream again; an edge that refuses (its 401) is one poll
  of the site then the edge again, twice in a row the stream through the site, and a 401 of the
  site ends it all; a stream that fails, or keeps ending at once (Django's one-event streams),
  hands over to long-polls, which bring the stream back once fastpath answers;
- the handle's ``wake()`` asks again at once for the current answers (a held poll without its
  ETag, a stream opened again) and gives them even if given already; ``options.onWire`` tells
  each poll's status, X-Cache and hold, each stream opened, each event and each miss.

The real stack is tests/examples/test_inbox_stack.py's (test_the_page_*)."""
import os
import re
import time

import pytest

from tests.browser.test_live_updates import browsers  # noqa: F401  (the Chromium fixture)
from tests.support.servers import repo_root

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FASTPOLL_JS = os.path.join(repo_root(), "fastpoll", "static", "fastpoll", "fastpoll.js")

# window.__answer(n, url, headers) -> [status, headers, body or null, delay ms] of the n-th poll (1-based;
# status 0: the network fails, fetch rejects);
# every poll's [start ms, url, If-None-Match, Prefer] goes to window.__polls, console.error's lines
# to window.__errors; window.__aborted and window.__cleared count abort() and clearTimeout() calls.
# window.__stream(es, n) plays the n-th EventSource (es.open(), es.emit(type, data, id),
# es.fail(readyState)); each one's [start ms, url, withCredentials] goes to window.__sources.
STUBS = """
window.__polls = []; window.__sources = []; window.__shown = []; window.__states = []; window.__wire = [];
window.__errors = []; console.error = (...args) => window.__errors.push(args.join(" "));
window.__aborted = 0; window.__cleared = 0;
const clear = window.clearTimeout; window.clearTimeout = (id) => { window.__cleared++; clear(id); };
window.AbortController = class extends AbortController { abort() { window.__aborted++; super.abort(); } };
const since = () => Math.round(performance.now() - window.__began);
window.fetch = function (url, opts) {
  const n = window.__polls.length + 1;
  window.__polls.push([since(), url, opts.headers["If-None-Match"] || null, opts.headers["Prefer"] || null]);
  const [status, headers, body, delay] = window.__answer(n, url, opts.headers);
  if (status === 0) return new Promise((ok, no) => setTimeout(() => no(new TypeError("Failed to fetch")), delay));
  return new Promise(ok => setTimeout(() => ok(new Response(body, {status, headers})), delay));
};
class StubEventSource {
  constructor(url, init) {
    this.url = url; this.readyState = 0; this.listeners = {};
    window.__sources.push([since(), url, Boolean(init && init.withCredentials)]);
    window.__stream(this, window.__sources.length);
  }
  addEventListener(type, fn) { (this.listeners[type] = this.listeners[type] || []).push(fn); }
  close() { this.readyState = 2; }
  fire(type, init) { (this.listeners[type] || []).forEach(fn => fn(new MessageEvent(type, init))); }
  open() { if (this.readyState !== 2) { this.readyState = 1; this.fire("open", {}); } }
  emit(type, data, id) { if (this.readyState === 1) this.fire(type, {data, lastEventId: id || ""}); }
  fail(state) { if (this.readyState !== 2) { this.readyState = state; this.fire("error", {}); } }
}
StubEventSource.CONNECTING = 0; StubEventSource.OPEN = 1; StubEventSource.CLOSED = 2;
window.EventSource = StubEventSource;
"""

ANSWERS = {
    # fastpath (or memcached) down: Django answers every poll at once, never Preference-Applied
    "django": """n => n === 1 ? [200, {"ETag": '"a"'}, '{"unread": 1}', 5] : [304, {"ETag": '"a"'}, null, 5]""",
    # nginx: fastpath and Django unreachable
    "503": """n => [503, {"Content-Type": "application/json"}, '{"error": "backend unavailable"}', 5]""",
    # fastpath: a changed answer at once, then holds of 1.2 s that end in a 304
    "held": """n => n === 1 ? [200, {"ETag": '"a"', "Preference-Applied": "wait=25", "X-Cache": "HIT"},
                               '{"unread": 1}', 5]
                            : [304, {"ETag": '"a"', "Preference-Applied": "wait=25", "X-Cache": "HIT"}, null, 1200]""",
    # fastpath --max-wait 0: Preference-Applied, but a 304 at once (not held)
    "max-wait-0": """n => n === 1 ? [200, {"ETag": '"a"', "Preference-Applied": "wait=0"}, '{"unread": 1}', 5]
                                  : [304, {"ETag": '"a"', "Preference-Applied": "wait=0"}, null, 5]""",
    # the site after a miss: Django's answer, a new one
    "site": """n => [200, {"ETag": '"b"', "X-Cache": "MISS"}, '{"unread": 2}', 5]""",
    "logged-out": """n => [401, {"Content-Type": "application/json"}, '{"error": "token revoked"}', 5]""",
    # Django: no such poll resource (an unknown name, or a PATH_PREFIX other than options.prefix)
    "404": """n => [404, {"Content-Type": "application/json"}, '{"error": "unknown poll resource"}', 5]""",
}

STREAMS = {
    # fastpath's stream: the current answer, then a miss (the key went)
    "miss": """(es, n) => setTimeout(() => {
        es.open();
        if (n === 1) { es.emit("inbox", '{"unread": 1}', '"a"'); setTimeout(() => es.fire("miss", {data: ""}), 200); }
        else { es.emit("inbox", '{"unread": 2}', '"b"'); setTimeout(() => es.emit("inbox", '{"unread": 3}', '"c"'), 200); }
      }, 10)""",
    # the edge refuses (a 401: EventSource gives up before it opens) twice, the site's stream works
    "edge-refuses": """(es, n) => setTimeout(() => {
        if (es.url.startsWith("http://edge.test")) { es.fail(2); return; }
        es.open(); es.emit("inbox", '{"unread": 4}', '"d"');
      }, 10)""",
    # the edge refuses once, then streams
    "edge-once": """(es, n) => setTimeout(() => {
        if (n === 1) { es.fail(2); return; }
        es.open(); es.emit("inbox", '{"unread": 2}', '"b"');
      }, 10)""",
    # the first stream is refused (the browser gives up), the next one streams
    "fails": """(es, n) => setTimeout(() => {
        if (n === 1) { es.fail(2); return; }
        es.open(); es.emit("inbox", '{"unread": 1}', '"a"');
      }, 10)""",
    # every stream fails (the browser gives up: a 404, a 401, a 429, ...)
    "fails-all": """(es, n) => setTimeout(() => es.fail(2), 10)""",
    # Django's one-event stream (fastpath down): each connection ends at once; the browser
    # reconnects with Last-Event-ID (so no event after the first)
    "django": """(es, n) => { let k = 0; const cycle = () => {
        if (es.readyState === 2) return;
        es.open();
        if (k++ === 0) es.emit("inbox", '{"unread": 1}', '"a"');
        setTimeout(() => { es.fail(0); setTimeout(cycle, 100); }, 20);
      }; setTimeout(cycle, 10); }""",
    # two resources in one stream: ids are both ETags, in path order
    "several": """(es, n) => setTimeout(() => {
        es.open();
        es.emit("count", '{"n": 1}', '"c1",""');
        es.emit("messages", '', '"c1","m1"');
        es.emit("messages", '', '"c1","m1"');
        es.emit("count", '{"n": 2}', '"c2","m1"');
      }, 10)""",
}


def run_client(driver, seconds, answers=ANSWERS["503"], stream="(es, n) => {}", resources='["inbox"]',
               options="{}", event_source=True, script=""):
    """fastpoll.subscribe(resources, ..., options) for ``seconds`` against the stubs (``script``
    runs right after, the handle in ``window.__sub``): the polls, the EventSources opened, what it
    gave onAnswer ([resource, answer]), its states, what onWire told (an EventSource as its url)
    and the console's errors."""
    driver.get("about:blank")
    with open(FASTPOLL_JS) as fh:
        client = fh.read()
    driver.execute_script(
        STUBS + ("" if event_source else "delete window.EventSource;\n")
        + f"window.__answer = {answers};\nwindow.__stream = {stream};\n" + client
        + "\nwindow.__began = performance.now();"
        + f"\nconst opts = Object.assign({{empty: {{empty: true}}, onState: s => window.__states.push(s),"
        + " onWire: i => window.__wire.push(Object.assign({}, i, i.source ? {source: i.source.url} : {}))},"
        + f" {options});"
        + f"\nwindow.__sub = fastpoll.subscribe({resources}, (r, a) => window.__shown.push([r, a]), opts);\n"
        + script)
    time.sleep(seconds)
    return driver.execute_script("return {polls: window.__polls, sources: window.__sources,"
                                 " shown: window.__shown, states: window.__states, wire: window.__wire,"
                                 " errors: window.__errors};")


# -- polls: without EventSource the client long-polls (docs/integrate.md section 5) ---------------

def test_without_eventsource_it_long_polls_and_django_answers_wait_the_short_poll_interval(browsers):  # noqa: F811
    got = run_client(browsers("page"), 3.5, ANSWERS["django"], event_source=False)
    polls = got["polls"]
    # at 0 and after the 2 s interval: a loop that re-polled at once made 641 polls in 2 s
    assert len(polls) == 2, polls
    assert polls[0][1:] == ["/Poll/inbox", None, "wait=50"], polls
    assert polls[1][0] - polls[0][0] >= 1990 and polls[1][2:] == ['"a"', "wait=50"], polls
    assert got["shown"] == [["inbox", {"unread": 1}]] and got["states"] == ["long"], got


def test_errors_back_off_with_jitter(browsers):  # noqa: F811
    got = run_client(browsers("page"), 4.5, ANSWERS["503"], event_source=False)
    polls = got["polls"]
    gaps = [b[0] - a[0] for a, b in zip(polls, polls[1:])]
    # 1-2 s, then 2-4 s, ...: at most 3 polls in 4.5 s (at once: thousands)
    assert 2 <= len(polls) <= 3 and 990 <= gaps[0] <= 2100, polls
    assert len(gaps) < 2 or gaps[1] >= 1990, polls
    assert got["shown"] == [], got
    # two long-polls failed in a row: short polls (which back off alike) took over
    assert got["states"] == ["long", "short"], got


def test_a_held_answer_is_polled_again_at_once(browsers):  # noqa: F811
    got = run_client(browsers("page"), 3.2, ANSWERS["held"], options='{transports: ["long"]}')
    polls, starts = got["polls"], [p[0] for p in got["polls"]]
    # 0, at once after the 200, then each 1.2 s hold followed at once by the next (not 2 s later)
    assert len(starts) >= 3 and starts[1] < 300, polls
    assert all(1190 <= b - a <= 1700 for a, b in zip(starts[1:], starts[2:])), polls
    assert [p[2] for p in polls] == [None] + ['"a"'] * (len(polls) - 1), polls
    assert got["shown"] == [["inbox", {"unread": 1}]], got


def test_a_304_fastpath_did_not_hold_waits_too(browsers):  # noqa: F811
    got = run_client(browsers("page"), 3.5, ANSWERS["max-wait-0"], options='{transports: ["long"]}')
    starts = [p[0] for p in got["polls"]]
    assert len(starts) == 3 and starts[1] < 300 and starts[2] - starts[1] >= 1990, got["polls"]


def test_a_401_or_403_ends_the_polls(browsers):  # noqa: F811
    got = run_client(browsers("page"), 2.5, ANSWERS["logged-out"], event_source=False)
    assert len(got["polls"]) == 1 and got["states"] == ["long", "ended"], got


def test_a_404_of_the_site_is_a_misconfigured_page_one_console_error_and_refused(browsers):  # noqa: F811
    # a prefix other than PATH_PREFIX: the stream through the site fails (its 404), the long-poll
    # reads the 404; nothing slides down to short polls, nothing is polled again
    got = run_client(browsers("page"), 3.0, ANSWERS["404"], STREAMS["fails-all"],
                     resources='["inbox", "count"]', options='{prefix: "/live/"}')
    assert got["states"] == ["stream", "long", "refused"], got
    assert len(got["sources"]) == 1 and len(got["polls"]) <= 2, got     # the two resources' first polls
    assert len(got["errors"]) == 1, got
    error = got["errors"][0]
    assert "404" in error and "/live/inbox" in error and "options.prefix" in error and '"inbox"' in error, got


def test_after_the_edge_and_the_site_the_404_of_an_unknown_resource_is_refused(browsers):  # noqa: F811
    # the edge's refusal (its 404 included: EventSource does not tell) asks the site, whose 404 decides
    got = run_client(browsers("page"), 1.5, ANSWERS["404"], STREAMS["edge-refuses"], resources='["inbx"]',
                     options='{edge: "http://edge.test:9"}',
                     script="setTimeout(() => window.__sub.wake(), 800);")
    assert len(got["sources"]) == 1 and [p[1] for p in got["polls"]] == ["/Poll/inbx"], got
    assert got["states"] == ["edge", "refused"] and len(got["errors"]) == 1, got   # wake() does nothing


def test_a_429_over_the_cap_hands_over_to_short_polls_and_long_polls_again_later(browsers):  # noqa: F811
    # fastpath's --max-held-per-user is reached by other tabs: every hold is refused (429), short
    # polls are answered (they do not count toward the cap)
    answers = """(n, url, headers) => headers.Prefer
        ? [429, {"Retry-After": "1", "Content-Type": "application/json"}, '{"error": "too many held connections"}', 5]
        : [200, {"ETag": '"a"', "X-Cache": "HIT"}, '{"unread": 1}', 5]"""
    got = run_client(browsers("page"), 6.3, answers, options='{transports: ["long", "short"]}')
    polls = got["polls"]
    # Retry-After (1 s, jittered up to 1.5 s), then short polls: the page gets its answers
    assert polls[0][3] == "wait=50" and polls[1][3] is None and 990 <= polls[1][0] - polls[0][0] <= 1700, polls
    assert got["shown"] == [["inbox", {"unread": 1}]], got
    # the long-poll is tried again 5 s after it failed, on an answer from fastpath (a HIT)
    assert got["states"][:3] == ["long", "short", "long"], got
    again = [p[0] for p in polls[1:] if p[3]]
    assert again and 4900 <= again[0] - polls[0][0] <= 6300, polls


# -- streams (docs/contract.md sections 9 and 10) --------------------------------------------------

def test_a_miss_event_polls_the_site_once_then_reopens_the_stream(browsers):  # noqa: F811
    got = run_client(browsers("page"), 1.5, ANSWERS["site"], STREAMS["miss"])
    polls, sources = got["polls"], got["sources"]
    # one poll of the site, with the ETag the stream gave, not held; then the same stream again
    assert [p[1:] for p in polls] == [["/Poll/inbox", '"a"', None]], got
    assert [s[1:] for s in sources] == [["/Poll/inbox", False]] * 2, got
    assert sources[0][0] < polls[0][0] < sources[1][0], got
    # the reopened stream's first event is the answer the poll gave: not given twice
    assert got["shown"] == [["inbox", {"unread": 1}], ["inbox", {"unread": 2}], ["inbox", {"unread": 3}]], got
    assert got["states"] == ["stream"], got


def test_an_edge_401_asks_the_site_then_the_edge_and_then_streams_through_the_site(browsers):  # noqa: F811
    got = run_client(browsers("page"), 1.5, ANSWERS["site"], STREAMS["edge-refuses"],
                     options='{edge: "http://edge.test:9/"}')
    polls, sources = got["polls"], got["sources"]
    # refused once: the site decides (its 200: the edge again); refused again: the stream through nginx
    assert [s[1:] for s in sources] == [["http://edge.test:9/Poll/inbox", True]] * 2 + [["/Poll/inbox", False]], got
    assert [p[1:] for p in polls] == [["/Poll/inbox", None, None]], got
    assert sources[0][0] < polls[0][0] < sources[1][0], got
    assert got["shown"] == [["inbox", {"unread": 2}], ["inbox", {"unread": 4}]], got
    assert got["states"] == ["edge", "stream"], got


def test_an_edge_refusal_once_comes_back_to_the_edge(browsers):  # noqa: F811
    got = run_client(browsers("page"), 1.5, ANSWERS["site"], STREAMS["edge-once"],
                     options='{edge: "http://edge.test:9"}')
    assert [s[1:] for s in got["sources"]] == [["http://edge.test:9/Poll/inbox", True]] * 2, got
    assert len(got["polls"]) == 1 and got["states"] == ["edge"], got
    assert got["shown"] == [["inbox", {"unread": 2}]], got      # the edge's first event was the site's answer


def test_an_edge_refusal_with_the_site_saying_401_ends(browsers):  # noqa: F811
    got = run_client(browsers("page"), 1.5, ANSWERS["logged-out"], STREAMS["edge-refuses"],
                     options='{edge: "http://edge.test:9"}')
    assert len(got["sources"]) == 1 and len(got["polls"]) == 1, got
    assert got["states"] == ["edge", "ended"], got


def test_a_stream_that_fails_falls_back_to_long_polls_and_comes_back(browsers):  # noqa: F811
    got = run_client(browsers("page"), 7.5, ANSWERS["held"], STREAMS["fails"])
    polls, sources = got["polls"], got["sources"]
    assert got["states"][:2] == ["stream", "long"], got
    # below the stream, a long-poll holds only until the stream is due again (5 s)
    assert polls[0][1:] == ["/Poll/inbox", None, "wait=5"] and polls[0][0] - sources[0][0] < 300, got
    # 5 s after it failed, an answer from fastpath (HIT) brings the stream back
    assert got["states"] == ["stream", "long", "stream"] and len(sources) == 2, got
    assert 4900 <= sources[1][0] - sources[0][0] <= 6800, got
    assert got["shown"] == [["inbox", {"unread": 1}]], got       # the stream's first event was the poll's


def test_a_stream_that_fails_at_the_last_transport_asks_the_site_whose_401_ends_it(browsers):  # noqa: F811
    # streams only: the stream fails (logged out: its 401, which EventSource does not tell)
    got = run_client(browsers("page"), 1.5, ANSWERS["logged-out"], STREAMS["fails-all"],
                     options='{transports: ["stream"]}')
    assert len(got["sources"]) == 1 and [p[1:] for p in got["polls"]] == [["/Poll/inbox", None, None]], got
    assert got["states"] == ["stream", "ended"], got
    # the site answers: the same stream again, after a back-off (1-2 s), not at once
    got = run_client(browsers("page"), 2.5, ANSWERS["site"], STREAMS["fails-all"], options='{transports: ["stream"]}')
    sources, polls = got["sources"], got["polls"]
    assert len(sources) == 2 and len(polls) == 2 and 990 <= sources[1][0] - polls[0][0] <= 2100, got
    assert got["states"] == ["stream"] and got["shown"] == [["inbox", {"unread": 2}]], got


def test_django_one_event_streams_hand_over_to_long_polls(browsers):  # noqa: F811
    got = run_client(browsers("page"), 2.0, ANSWERS["django"], STREAMS["django"])
    assert len(got["sources"]) == 1 and got["states"] == ["stream", "long"], got
    # three connections ended at once: long-polls, sending the ETag the stream gave (a 304 from Django)
    assert got["polls"][0][2] == '"a"' and len(got["polls"]) == 1, got
    assert got["shown"] == [["inbox", {"unread": 1}]], got


def test_several_resources_are_one_stream_and_each_answer_is_given_once(browsers):  # noqa: F811
    got = run_client(browsers("page"), 1.0, stream=STREAMS["several"], resources='["count", "messages"]')
    assert [s[1] for s in got["sources"]] == ["/Poll/count,messages"], got
    assert got["shown"] == [["count", {"n": 1}], ["messages", {"empty": True}], ["count", {"n": 2}]], got


def test_a_per_object_path_streams_as_is_and_bad_arguments_are_one_clear_error(browsers):  # noqa: F811
    driver = browsers("page")
    got = run_client(driver, 0.5, stream="(es, n) => {}", resources='"/Poll/board/7?cap=c1.x"')
    assert [s[1] for s in got["sources"]] == ["/Poll/board/7?cap=c1.x"], got
    errors = driver.execute_script("""
        const errors = [];
        for (const args of [[["a", "/Poll/board/7?cap=x"]], [[]], [["a,b"]], ["/elsewhere/7"],
                            [["a"], null], [["a"], () => 0, {transports: ["edge"]}]]) {
          try { fastpoll.subscribe(args[0], args.length > 1 ? args[1] : () => 0, args[2]); errors.push(null); }
          catch (e) { errors.push(e.message); }
        }
        return errors;""")
    assert all(e and e.startswith("fastpoll.subscribe: ") for e in errors), errors
    assert "options.edge" in errors[-1] and "options.prefix" in errors[3], errors


# -- wake() and onWire (what a page's own writes and its counters need) ----------------------------

def test_wake_asks_a_held_poll_again_at_once_without_its_etag(browsers):  # noqa: F811
    # fastpath: the answer "a", then holds of 3 s; the page wakes the client 0.5 s in
    answers = """n => n === 1 || n === 3
        ? [200, {"ETag": '"a"', "Preference-Applied": "wait=25", "X-Cache": "HIT"}, '{"unread": 1}', 5]
        : [304, {"ETag": '"a"', "Preference-Applied": "wait=25", "X-Cache": "HIT"}, null, 3000]"""
    got = run_client(browsers("page"), 1.5, answers, options='{transports: ["long"]}',
                     script="setTimeout(() => window.__sub.wake(), 500);")
    polls = got["polls"]
    # the held poll (with the ETag) is dropped; at once a poll without it, then held again with it
    assert [p[2] for p in polls] == [None, '"a"', None, '"a"'], polls
    assert 480 <= polls[2][0] <= 700 and polls[3][0] - polls[2][0] < 300, polls
    # the same answer is given again: it is the current one, which the page asked for
    assert got["shown"] == [["inbox", {"unread": 1}]] * 2 and got["states"] == ["long"], got


def test_wake_opens_the_stream_again_and_gives_its_first_event_again(browsers):  # noqa: F811
    stream = """(es, n) => setTimeout(() => { es.open(); es.emit("inbox", '{"unread": 1}', '"a"'); }, 10)"""
    got = run_client(browsers("page"), 1.0, stream=stream, script="""
        setTimeout(() => window.__sub.wake(), 300);
        setTimeout(() => { window.__sub.close(); window.__sub.wake(); }, 600);""")
    assert [s[1] for s in got["sources"]] == ["/Poll/inbox"] * 2 and got["polls"] == [], got
    assert 290 <= got["sources"][1][0] <= 500, got
    assert got["shown"] == [["inbox", {"unread": 1}]] * 2, got
    assert got["states"] == ["stream", "closed"], got          # nothing after close(), wake() or not


def test_a_finished_poll_keeps_no_abortcontroller_nor_timer(browsers):  # noqa: F811
    # 20 answers fastpath held (each asked again at once), then 304s fastpath did not hold (2 s
    # apart); 4.5 s in, wake() ends the transport: it aborts the polls under way (none: the
    # client waits) and clears its waiting timer, not every one since it began (~43,000 a day)
    answers = """n => n <= 20 ? [200, {"ETag": `"${n}"`, "Preference-Applied": "wait=25", "X-Cache": "HIT"}, '{}', 5]
                              : [304, {"ETag": '"20"', "Preference-Applied": "wait=0", "X-Cache": "HIT"}, null, 5]"""
    driver = browsers("page")
    got = run_client(driver, 4.8, answers, options='{transports: ["long"]}', script="""
        setTimeout(() => {
          const aborted = window.__aborted, cleared = window.__cleared;
          window.__sub.wake();
          window.__woken = [window.__aborted - aborted, window.__cleared - cleared];
        }, 4500);""")
    assert len(got["polls"]) >= 23 and len(got["shown"]) == 20, got["polls"]
    assert driver.execute_script("return window.__woken") == [0, 1], got["polls"]


def test_on_wire_tells_each_poll(browsers):  # noqa: F811
    # fastpath's answer, then its held 304, then the network fails (a MISS: the stream test below)
    answers = """n => n === 1 ? [200, {"ETag": '"a"', "Preference-Applied": "wait=25", "X-Cache": "HIT"}, '{"unread": 1}', 5]
                     : n === 2 ? [304, {"ETag": '"a"', "Preference-Applied": "wait=25", "X-Cache": "HIT"}, null, 1200]
                     : [0, {}, null, 5]"""
    got = run_client(browsers("page"), 1.6, answers, options='{transports: ["long"]}')
    poll = lambda status, cache, held: {"type": "poll", "resource": "inbox", "status": status,  # noqa: E731
                                        "cache": cache, "held": held}
    assert got["wire"] == [poll(200, "HIT", True), poll(304, "HIT", True), poll(0, None, False)], got


def test_on_wire_tells_each_stream_its_events_and_its_misses(browsers):  # noqa: F811
    got = run_client(browsers("page"), 1.5, ANSWERS["site"], STREAMS["miss"])
    opened = {"type": "open", "transport": "stream", "source": "/Poll/inbox"}
    event = {"type": "event", "transport": "stream", "resource": "inbox"}
    site = {"type": "poll", "resource": "inbox", "status": 200, "cache": "MISS", "held": False}
    # the reopened stream's first event is told though its answer (the site's) is not given again
    assert got["wire"] == [opened, event, {"type": "miss", "transport": "stream"}, site,
                           opened, event, event], got
    # the edge's refusal taken for a miss is told as one
    got = run_client(browsers("page"), 1.5, ANSWERS["site"], STREAMS["edge-once"],
                     options='{edge: "http://edge.test:9"}')
    assert [(w["type"], w.get("transport")) for w in got["wire"]] == [
        ("open", "edge"), ("miss", "edge"), ("poll", None), ("open", "edge"), ("event", "edge")], got


# -- the header's usage example (docs/integrate.md section 5) --------------------------------------

def test_the_header_example_is_a_static_file_reading_data_attributes_as_the_docs_show():
    """An inline <script> dies under the CSP the edge needs (default-src 'self'): the header shows
    what docs/integrate.md section 5 shows, the page's script a file, the template's data- attributes."""
    with open(FASTPOLL_JS) as fh:
        header = fh.read().split("*/", 1)[0]
    with open(os.path.join(repo_root(), "docs", "integrate.md")) as fh:
        docs = fh.read()
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", header, re.S)
    assert len(scripts) == 2 and all("src=" in attrs and not body.strip() for attrs, body in scripts), scripts
    body = '<body data-edge-url="{{ edge_url }}" data-poll-prefix="{{ fastpoll_prefix }}">'
    assert body in header and body in docs
    for use in ("document.body.dataset", "edge: page.edgeUrl, prefix: page.pollPrefix"):
        assert use in header and use in docs, use
