"""The inbox example's client loop (examples/inbox/inbox/static/inbox/poll.js) in headless
Chromium, against a stub ``fetch`` that answers as fastpath, Django or a failing nginx would
(docs/contract.md, "The answer"): it re-polls at once only after an answer fastpath held
(``Preference-Applied``), waits the short-poll interval after Django's (fastpath or memcached
down: Django answers at once, so re-polling at once spins), and backs off on errors.  The real
stack's polls are tests/examples/test_inbox_stack.py's."""
import os
import time

import pytest

from tests.browser.test_live_updates import browsers  # noqa: F401  (the Chromium fixture)
from tests.support.servers import repo_root

pytestmark = [pytest.mark.browser, pytest.mark.slow]

POLL_JS = os.path.join(repo_root(), "examples", "inbox", "inbox", "static", "inbox", "poll.js")

# window.__answer(n) -> [status, headers, body or null, delay ms] of the n-th poll (1-based);
# every poll's start time (ms since the loop began) and If-None-Match go to window.__polls
STUB_FETCH = """
window.__polls = [];
window.__shown = [];
window.fetch = function (url, opts) {
  const n = window.__polls.length + 1;
  window.__polls.push([performance.now() - window.__began, opts.headers["If-None-Match"] || null,
                       opts.headers["Prefer"] || null]);
  const [status, headers, body, delay] = window.__answer(n);
  return new Promise(ok => setTimeout(() => ok(new Response(body, {status, headers})), delay));
};
"""

ANSWERS = {
    # fastpath (or memcached) down: Django answers every poll at once, never Preference-Applied
    "django": """n => n === 1 ? [200, {"ETag": '"a"'}, '{"unread": 1}', 5] : [304, {"ETag": '"a"'}, null, 5]""",
    # nginx: fastpath and Django unreachable
    "503": """n => [503, {"Content-Type": "application/json"}, '{"error": "backend unavailable"}', 5]""",
    # fastpath: a changed answer at once, then holds of 1.2 s that end in a 304
    "held": """n => n === 1 ? [200, {"ETag": '"a"', "Preference-Applied": "wait=25"}, '{"unread": 1}', 5]
                            : [304, {"ETag": '"a"', "Preference-Applied": "wait=25"}, null, 1200]""",
    # fastpath --max-wait 0: Preference-Applied, but a 304 at once (not held)
    "max-wait-0": """n => n === 1 ? [200, {"ETag": '"a"', "Preference-Applied": "wait=0"}, '{"unread": 1}', 5]
                                  : [304, {"ETag": '"a"', "Preference-Applied": "wait=0"}, null, 5]""",
}


def polls_in(driver, answers, seconds):
    """Run poll.js's longPoll for ``seconds`` against ``answers``: the polls' [start ms,
    If-None-Match, Prefer] and what it showed."""
    driver.get("about:blank")
    with open(POLL_JS) as fh:
        driver.execute_script(STUB_FETCH + f"window.__answer = {answers};\n" + fh.read()
                              + "\nwindow.__began = performance.now();"
                              + "\nlongPoll('/Poll/inbox', {unread: 0}, a => window.__shown.push(a));")
    time.sleep(seconds)
    return driver.execute_script("return [window.__polls, window.__shown];")




def test_django_answers_wait_the_short_poll_interval(browsers):  # noqa: F811
    polls, shown = polls_in(browsers("page"), ANSWERS["django"], 3.5)
    # at 0 and after the 2 s interval: the loop that re-polled at once made 641 polls in 2 s
    assert len(polls) == 2, polls
    assert polls[1][0] - polls[0][0] >= 1990 and polls[1][1:] == ['"a"', "wait=25"], polls
    assert shown == [{"unread": 1}]


def test_errors_back_off_with_jitter(browsers):  # noqa: F811
    polls, shown = polls_in(browsers("page"), ANSWERS["503"], 4.5)
    gaps = [b[0] - a[0] for a, b in zip(polls, polls[1:])]
    # 1-2 s, then 2-4 s, ...: at most 3 polls in 4.5 s (at once: thousands)
    assert 2 <= len(polls) <= 3 and 990 <= gaps[0] <= 2100, polls
    assert len(gaps) < 2 or gaps[1] >= 1990, polls
    assert shown == []


def test_a_held_answer_is_polled_again_at_once(browsers):  # noqa: F811
    polls, shown = polls_in(browsers("page"), ANSWERS["held"], 3.2)
    starts = [p[0] for p in polls]
    # 0, at once after the 200, then each 1.2 s hold followed at once by the next (not 2 s later)
    assert len(starts) >= 3 and starts[1] < 300, polls
    assert all(1190 <= b - a <= 1700 for a, b in zip(starts[1:], starts[2:])), polls
    assert [p[1] for p in polls] == [None] + ['"a"'] * (len(polls) - 1) and shown == [{"unread": 1}]


def test_a_304_fastpath_did_not_hold_waits_too(browsers):  # noqa: F811
    polls, _ = polls_in(browsers("page"), ANSWERS["max-wait-0"], 3.5)
    starts = [p[0] for p in polls]
    assert len(starts) == 3 and starts[1] < 300 and starts[2] - starts[1] >= 1990, polls
