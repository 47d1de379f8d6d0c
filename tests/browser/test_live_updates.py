"""The web client in headless Chromium (Debian's chromium + chromium-driver, nothing downloaded)
against the real stack through nginx:

- two people in two windows: one posts, the other sees it arrive without a reload, the unread
  badge updates and clears, and every poll of the page after the first was a cache hit;
- a plurk that arrives while the page is marking read is still fetched and shown;
- a user's page (/u/<name>) shows the badge but never marks anything read;
- a response to a plurk that is not on the page is shown (with its plurk) before it is read;
- the page load retries with the offline notice when the API is unreachable;
- no horizontal overflow at 360 and 320 pixels;
- the page (?poll=long) long-polls (one getUnreadCount in flight with Prefer: wait and the last
  ETag), and a plurk still arrives, by short polling through Django, while fastpath is stopped,
  and again once it is back;
- by default the count comes by a stream (EventSource) through nginx, on the timeline with the
  messages in the same stream: plurks arrive with no request to /Poll/ at all (none in nginx's
  access log either), while a user's page streams the count alone; with fastpath killed the page falls back (Django's one-event stream, then
  long-polls through Django) and comes back to the stream once fastpath is; plurks posted all
  along are each shown once;
- an edge the page cannot reach (refused, or not in the CSP) falls back to the stream through
  nginx; the page streams from the stack's edge (the site's data-edge-url and CSP), and from an
  edge the test starts, with a miss there and fastpath killed and back.

Screenshots of each step, and of every window at the end of each test (also when it fails), go
to test-artifacts/browser/.  Without Chromium the tests skip, unless CI is set: then they fail.
"""
import os
import shutil
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARTIFACTS = os.path.join(ROOT, "test-artifacts", "browser")
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PASSWORD = "secret-pass-1"     # what stack.signup() uses
READ_AFTER_S = 3          # app.js READ_AFTER_MS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Records the X-Cache answer of every /Poll/ request the page makes from now on.
RECORD_POLLS_JS = """
window.__polls = [];
const original = window.fetch;
window.fetch = async function (url, opts) {
  const resp = await original.call(this, url, opts);
  if (String(url).startsWith("/Poll/")) window.__polls.push([String(url), resp.headers.get("X-Cache")]);
  return resp;
};
"""

# Records the Prefer and If-None-Match of every getUnreadCount and how many were in flight at once.
RECORD_LONG_POLLS_JS = """
window.__counts = [];
window.__inFlight = 0;
window.__maxInFlight = 0;
const original = window.fetch;
window.fetch = async function (url, opts) {
  if (String(url) !== "/Poll/getUnreadCount") return original.call(this, url, opts);
  const headers = (opts && opts.headers) || {};
  window.__counts.push([headers["Prefer"] || null, headers["If-None-Match"] || null]);
  window.__maxInFlight = Math.max(window.__maxInFlight, ++window.__inFlight);
  try { return await original.call(this, url, opts); } finally { window.__inFlight--; }
};
"""

# Posts a plurk as the writer (bearer token, no cookie) right before the page's first markRead
# request leaves: the plurk is newer than everything the page has shown but counted by markRead.
POST_BEFORE_MARK_READ_JS = """
const [token, content] = arguments;
const original = window.fetch;
let armed = true;
window.fetch = async function (url, opts) {
  if (armed && String(url) === "/api/markRead") {
    armed = false;
    const resp = await original("/api/plurks", {method: "POST", credentials: "omit",
      headers: {"Authorization": "Bearer " + token, "Content-Type": "application/json"},
      body: JSON.stringify({content})});
    window.__postedBeforeRead = resp.status;
  }
  return original.call(this, url, opts);
};
"""


def _missing_browser(reason):
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI is set, so the browser tests must run")
    pytest.skip(f"{reason} (make test installs them)")


@pytest.fixture
def browsers(request):
    """make(role, width=900, height=1000) -> a Chrome driver; every window is photographed at
    the end of the test (also on failure) and closed."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        _missing_browser("Debian chromium and chromium-driver are not installed")
    os.environ["SE_OFFLINE"] = "true"          # Selenium Manager must never download anything
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing_browser("selenium is not installed")

    drivers, dirs = [], []

    def make(role, width=900, height=1000):
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        profile = tempfile.mkdtemp(prefix="plurk-chrome-")
        dirs.append(profile)
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--no-first-run", f"--window-size={width},{height}", f"--user-data-dir={profile}"):
            opts.add_argument(arg)
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
        driver.set_page_load_timeout(30)
        drivers.append((role, driver))
        return driver

    os.makedirs(ARTIFACTS, exist_ok=True)
    try:
        yield make
    finally:
        for role, driver in drivers:
            try:
                driver.save_screenshot(os.path.join(ARTIFACTS, f"{request.node.name}-{role}-last.png"))
            except Exception:        # a crashed browser must not hide the test's own failure
                pass
            driver.quit()
        for path in dirs:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pair(stack):
    """(writer, reader): two new users, the reader following the writer; each (name, token)."""
    return stack.follower_pair()


def _shot(driver, name):
    driver.save_screenshot(os.path.join(ARTIFACTS, f"{name}.png"))


def _wait(predicate, timeout=15, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")


def _by_id(driver, element_id):
    from selenium.webdriver.common.by import By
    return driver.find_element(By.ID, element_id)


def _login(driver, base, username):
    from selenium.webdriver.common.by import By
    driver.get(base + "/login")
    _by_id(driver, "username").send_keys(username)
    _by_id(driver, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "#auth-form button").click()
    _wait(lambda: driver.current_url.rstrip("/") == base and _by_id(driver, "whoami").text == f"@{username}",
          what=f"{username} logged in")


def _polls_done(driver):
    """Answers of the count so far: polls (HIT or MISS) and stream events."""
    return driver.execute_script("const d = document.body.dataset;"
                                 "return Number(d.pollHits) + Number(d.pollMisses) + Number(d.streamEvents || 0);")


def _data(driver, name):
    """<body data-NAME> (app.js's counters and the current transport)."""
    return driver.execute_script("return document.body.dataset[arguments[0]] || ''", name)


def _datas(driver):
    """Every <body data-*> (for a failure's message)."""
    return driver.execute_script("return Object.assign({}, document.body.dataset)")


def _set_edge_url(driver, url):
    """From the next page load on, <body data-edge-url> is ``url`` before app.js reads it (this
    listener is registered before the deferred script registers its own)."""
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": (
        "document.addEventListener('DOMContentLoaded', () => {"
        f" document.body.dataset.edgeUrl = {url!r}; }});")})


def _badge(driver):
    """The badge's number, or 0 when it is hidden."""
    # one read in the page: two WebDriver calls could straddle the moment the badge is hidden
    return driver.execute_script(
        "const b = document.getElementById('badge');"
        "return b.hidden ? 0 : Number(document.getElementById('badge-count').textContent);")


def _server_unread(stack, token):
    resp = stack.poll("getUnreadCount", token)
    assert resp.status_code in (200, 204), resp.text
    return 0 if resp.status_code == 204 else resp.json()["count"]


def _post(stack, token, content):
    resp = stack.api("POST", "/api/plurks", token, json={"content": content})
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def _set_text(driver, element_id, text):
    """Type text the way an input method would (send_keys cannot send characters outside the BMP)."""
    driver.execute_script("const box = document.getElementById(arguments[0]); box.value = arguments[1];"
                          "box.dispatchEvent(new Event('input'));", element_id, text)


def _assert_no_horizontal_overflow(driver, what):
    width, inner = driver.execute_script(
        "return [document.documentElement.scrollWidth, window.innerWidth];")
    assert width <= inner, f"{what}: the page is {width}px wide in a {inner}px window"


def test_a_plurk_appears_for_a_follower_without_reload(stack, browsers, pair):
    base = stack.base_url
    (writer_name, _), (reader_name, reader_token) = pair
    writer, reader = browsers("writer"), browsers("reader")
    _login(writer, base, writer_name)
    _login(reader, base, reader_name)
    # short polling: this test counts polls (the page's long-poll mode has its own test below)
    reader.get(base + "/?poll=short")
    _shot(reader, "1-reader-before")
    _wait(lambda: _polls_done(reader) >= 1, what="the reader's first poll")
    reader.execute_script(RECORD_POLLS_JS)            # every poll after the first must be a cache hit

    # the counter counts characters as the server does (code points, after stripping)
    _set_text(writer, "post-content", "😀" * 200 + "  ")
    assert _by_id(writer, "post-counter").text == "160 characters left"
    assert writer.execute_script("return document.getElementById('post-content').validity.valid")
    _set_text(writer, "post-content", "x" * 361)
    assert _by_id(writer, "post-counter").text == "1 character over the limit"
    assert _by_id(writer, "post-alert").text == "1 character over the limit"   # announced once over
    assert not writer.execute_script("return document.getElementById('post-content').validity.valid")
    _set_text(writer, "post-content", "")

    text = f"hello from the browser test {time.time():.0f}"
    _by_id(writer, "post-content").send_keys(text)
    assert _by_id(writer, "post-counter").text == f"{360 - len(text)} characters left"
    assert _by_id(writer, "post-alert").text == ""                               # not every keystroke
    reader.execute_script("window.__noReload = 1")
    from selenium.webdriver.common.by import By
    writer.find_element(By.CSS_SELECTOR, "#post-form button").click()
    _wait(lambda: text in _by_id(writer, "timeline").text, what="the writer's own plurk")
    _shot(writer, "2-writer-posted")

    _wait(lambda: _badge(reader) == 1, timeout=10, what="the unread badge")
    _wait(lambda: text in _by_id(reader, "timeline").text, timeout=10, what="the plurk for the reader")
    _shot(reader, "3-reader-sees-it")
    assert reader.execute_script("return window.__noReload") == 1, "the reader's page was reloaded"
    assert _by_id(reader, "live-status").get_attribute("textContent") == "1 new plurk"
    # read after a few visible seconds: the badge clears, on the page and on the server
    _wait(lambda: _badge(reader) == 0, timeout=15, what="badge cleared")
    assert _server_unread(stack, reader_token) == 0
    _shot(reader, "4-reader-read")

    polls = reader.execute_script("return window.__polls")
    assert len(polls) >= 3, polls
    assert any(url == "/Poll/getMessages" for url, _ in polls), polls
    assert all(cache == "HIT" for _, cache in polls), polls          # through nginx, from fastpath
    assert int(reader.find_element(By.TAG_NAME, "body").get_attribute("data-poll-misses")) <= 1


def test_a_plurk_arriving_during_mark_read_is_fetched(stack, browsers, pair):
    """markRead answers a count that includes a plurk newer than anything shown: it must be fetched."""
    base = stack.base_url
    (_, writer_token), (reader_name, reader_token) = pair
    reader = browsers("reader")
    _login(reader, base, reader_name)
    _wait(lambda: _polls_done(reader) >= 1, what="the reader's first poll")
    second = f"arrived during markRead {time.time():.0f}"
    reader.execute_script(POST_BEFORE_MARK_READ_JS, writer_token, second)

    first = f"before markRead {time.time():.0f}"
    _post(stack, writer_token, first)
    _wait(lambda: first in _by_id(reader, "timeline").text, timeout=10, what="the first plurk")
    _wait(lambda: reader.execute_script("return window.__postedBeforeRead") == 201,
          timeout=READ_AFTER_S + 10, what="the markRead (and the plurk posted just before it)")
    _wait(lambda: second in _by_id(reader, "timeline").text, timeout=10, what="the plurk that arrived during markRead")
    _shot(reader, "5-arrived-during-mark-read")
    _wait(lambda: _badge(reader) == 0 and _server_unread(stack, reader_token) == 0, timeout=15,
          what="both plurks read")


def test_a_users_page_does_not_mark_read(stack, browsers, pair):
    base = stack.base_url
    (writer_name, writer_token), (reader_name, reader_token) = pair
    reader = browsers("reader")
    _login(reader, base, reader_name)
    reader.get(f"{base}/u/{writer_name}?poll=short")     # "still polling" counts polls
    _wait(lambda: "followers" in _by_id(reader, "profile-stats").text and _polls_done(reader) >= 1,
          what="the user's page and its first poll")

    text = f"posted while the reader looks at a profile {time.time():.0f}"
    _post(stack, writer_token, text)
    _wait(lambda: _badge(reader) == 1, timeout=10, what="the badge on the user's page")
    polls = _polls_done(reader)
    time.sleep(READ_AFTER_S + 3)                      # long enough for the timeline page to read
    assert _polls_done(reader) > polls               # still polling
    assert _badge(reader) == 1 and _server_unread(stack, reader_token) == 1
    _shot(reader, "6-user-page-unread")

    reader.get(base + "/")
    _wait(lambda: text in _by_id(reader, "timeline").text, timeout=10, what="the plurk on the timeline")
    _wait(lambda: _badge(reader) == 0 and _server_unread(stack, reader_token) == 0, timeout=15,
          what="read once shown")


def test_a_response_to_a_plurk_not_on_the_page_is_shown_before_read(stack, browsers, pair):
    base = stack.base_url
    (_, writer_token), (reader_name, reader_token) = pair
    old = _post(stack, writer_token, "an old plurk")
    newest = max(_post(stack, writer_token, f"filler {i}") for i in range(20))   # the page shows 20
    assert stack.api("POST", "/api/markRead", reader_token, json={"upto": newest}).status_code == 200
    reader = browsers("reader")
    _login(reader, base, reader_name)
    _wait(lambda: _polls_done(reader) >= 1, what="the reader's first poll")
    assert not reader.execute_script(f"return document.getElementById('plurk-{old}')")

    resp = stack.api("POST", f"/api/plurks/{old}/responses", writer_token, json={"content": "a late response"})
    assert resp.status_code == 201, resp.text
    _wait(lambda: "a late response" in reader.execute_script(
        f"const p = document.getElementById('plurk-{old}'); return p ? p.textContent : ''"),
        timeout=10, what="the response with its plurk")
    ids = [int(i) for i in reader.execute_script(
        "return [...document.querySelectorAll('#timeline > li')].map((li) => li.dataset.id)")]
    assert ids == sorted(ids, reverse=True)           # the timeline stays newest first
    _wait(lambda: _badge(reader) == 0 and _server_unread(stack, reader_token) == 0, timeout=15,
          what="the response read")
    # opening the plurk's responses lists the live one once, not twice
    reader.execute_script(f"document.querySelector('#plurk-{old} > button').click()")
    _wait(lambda: reader.execute_script(
        f"return document.querySelectorAll('#plurk-{old} .responses li').length") == 1,
        timeout=10, what="the responses list")
    texts = reader.execute_script(
        f"return [...document.querySelectorAll('#plurk-{old} .response')].map((n) => n.textContent)")
    assert sum("a late response" in t for t in texts) == 1, texts


def test_page_load_retries_while_the_api_is_unreachable(stack, browsers, pair):
    base = stack.base_url
    _, (reader_name, _) = pair
    reader = browsers("reader")
    _login(reader, base, reader_name)
    reader.execute_cdp_cmd("Network.enable", {})
    reader.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/api/me*"]})
    reader.refresh()
    _wait(lambda: _by_id(reader, "offline").is_displayed(), what="the offline notice")
    assert _by_id(reader, "whoami").text == ""
    _shot(reader, "7-offline-retrying")
    reader.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    _wait(lambda: _by_id(reader, "whoami").text == f"@{reader_name}", timeout=15, what="the page loaded on a retry")
    _wait(lambda: not _by_id(reader, "offline").is_displayed() and _polls_done(reader) >= 1,
          what="polling after the retry")


def test_narrow_screens_do_not_overflow(stack, browsers):
    base = stack.base_url
    name, token = stack.signup("a_rather_long_username_for_narrow_screens_")
    _post(stack, token, "unbroken" * 40)
    driver = browsers("narrow", 360, 800)
    _login(driver, base, name)
    _wait(lambda: "unbroken" in _by_id(driver, "timeline").text, what="the timeline")
    for width in (360, 320):
        driver.set_window_size(width, 800)
        for path in ("/", f"/u/{name}"):
            driver.get(base + path)
            _wait(lambda: "unbroken" in _by_id(driver, "main").text, what=f"{path} loaded")
            inner = driver.execute_script("return window.innerWidth")
            assert inner <= width, inner
            _assert_no_horizontal_overflow(driver, f"{path} at {width}px")
            _shot(driver, f"8-narrow-{width}-{'timeline' if path == '/' else 'user'}")


def _fastpath_holds():
    from fastpath.options import OPTIONS
    return any(opt.flag == "--max-wait" for opt in OPTIONS)


def test_the_page_long_polls_and_falls_back_to_short_polls_while_fastpath_is_stopped(private_stack, browsers):
    stack, base = private_stack, private_stack.base_url
    (writer_name, writer_token), (reader_name, reader_token) = stack.follower_pair()
    reader = browsers("reader")
    _login(reader, base, reader_name)
    reader.get(base + "/?poll=long")
    assert reader.execute_script("return document.body.dataset.pollMode") == "long"
    _wait(lambda: _polls_done(reader) >= 1, what="the reader's first poll")
    reader.execute_script(RECORD_LONG_POLLS_JS)

    def arrives(text):
        _post(stack, writer_token, text)
        _wait(lambda: text in _by_id(reader, "timeline").text, timeout=20, what=f"{text!r} for the reader")

    arrives(f"while fastpath holds {time.time():.0f}")
    counts = reader.execute_script("return window.__counts")
    assert counts and all(prefer == "wait=50" for prefer, _ in counts), counts
    if _fastpath_holds():              # fastpath answered with ETags and held the polls
        assert any(inm for _, inm in counts), counts
        assert int(reader.execute_script("return document.body.dataset.pollHeld")) >= 1

    # fastpath stopped (and kept down): nginx falls back to Django, which never holds; the page
    # waits the short-poll interval between polls instead of spinning
    fastpath = stack.service("fastpath")
    start = fastpath.start
    fastpath.start = lambda: fastpath
    try:
        fastpath.kill()
        misses = int(reader.execute_script("return document.body.dataset.pollMisses"))
        arrives(f"while fastpath is stopped {time.time():.0f}")
        assert int(reader.execute_script("return document.body.dataset.pollMisses")) > misses
        before = len(reader.execute_script("return window.__counts"))
        time.sleep(4)
        assert len(reader.execute_script("return window.__counts")) - before <= 6   # every 2 s, not a loop
        _shot(reader, "9-fastpath-stopped")
    finally:
        fastpath.start = start
        fastpath.start()
        fastpath.wait_ready()

    arrives(f"after fastpath is back {time.time():.0f}")
    assert reader.execute_script("return window.__maxInFlight") == 1        # one poll in flight at a time

    # A write while a poll is held (following someone who has posted nothing: the count stays, so
    # nothing else wakes the page): the held poll is woken and asks again at once without its ETag.
    # It used to run its course and end in a 304 that the page took for an error ("Offline").
    import requests
    from selenium.webdriver.common.by import By

    quiet = f"quiet{int(time.time() * 1000) % 10**9}"
    assert requests.post(f"{base}/api/signup", json={"username": quiet, "password": PASSWORD},
                         timeout=10).status_code == 201
    reader.get(f"{base}/u/{quiet}?poll=long")
    _wait(lambda: _by_id(reader, "follow").is_displayed(), what="the profile's follow button")
    _wait(lambda: _polls_done(reader) >= 1, what="the profile page's first poll")
    reader.execute_script(RECORD_LONG_POLLS_JS)
    reader.execute_script("pollNow()")      # the poll held before the recorder came is asked again
    held = "return window.__inFlight === 1 && window.__counts[window.__counts.length - 1][1] !== null"
    _wait(lambda: reader.execute_script(held), timeout=15, what="a poll held with the page's ETag")
    time.sleep(0.5)
    assert reader.execute_script(held)
    before = len(reader.execute_script("return window.__counts"))
    reader.find_element(By.ID, "follow").click()
    _wait(lambda: len(reader.execute_script("return window.__counts")) > before, timeout=3,
          what="a poll right after the reader's write (the held one woken)")
    assert reader.execute_script("return window.__counts")[before][1] is None       # without the ETag
    time.sleep(1)
    assert not _by_id(reader, "offline").is_displayed()


def _stream_url(driver):
    """The URL of the page's open EventSource ('' when none)."""
    return driver.execute_script("return live.stream ? live.stream.source.url : ''")


def _nginx_requests(stack, path):
    """Requests for ``path`` (its query aside) in nginx's access log so far (the log is flushed
    every second: wait that long after the requests to count)."""
    with open(os.path.join(stack.config.log_dir(), "nginx-access.log")) as fh:
        return sum(f'"GET {path} ' in line or f'"GET {path}?' in line for line in fh)


def _arrives(stack, driver, token, text, timeout=20):
    _post(stack, token, text)
    _wait(lambda: text in _by_id(driver, "timeline").text, timeout=timeout, what=f"{text!r} for the reader")


def test_a_plurk_arrives_by_the_stream_through_nginx(stack, browsers, pair):
    base = stack.base_url
    (_, writer_token), (reader_name, reader_token) = pair
    reader = browsers("reader")
    _set_edge_url(reader, "")                        # this test is about nginx's stream, not the edge
    _login(reader, base, reader_name)
    assert _data(reader, "pollMode") == "stream"
    _wait(lambda: _data(reader, "transport") == "stream" and _polls_done(reader) >= 1,
          what="the stream's first event")
    reader.execute_script(RECORD_POLLS_JS)
    # the timeline's one stream carries both resources
    assert _stream_url(reader) == f"{base}/Poll/getUnreadCount,getMessages"
    events, messages = int(_data(reader, "streamEvents")), int(_data(reader, "streamMessages"))
    time.sleep(1.5)                                  # nginx's access log is flushed every second
    fetched = _nginx_requests(stack, "/Poll/getMessages")

    text = f"by the stream {time.time():.0f}"
    _arrives(stack, reader, writer_token, text, timeout=10)
    _wait(lambda: _badge(reader) == 1, timeout=5, what="the unread badge")
    assert int(_data(reader, "streamEvents")) > events
    assert int(_data(reader, "streamMessages")) > messages          # the plurk came as an event
    assert _by_id(reader, "live-status").get_attribute("textContent") == "1 new plurk"
    _shot(reader, "10-stream-arrived")
    _wait(lambda: _badge(reader) == 0 and _server_unread(stack, reader_token) == 0, timeout=15,
          what="read once shown")
    # the count and the messages came by the stream: the page asked nothing of /Poll/, not even
    # after its markRead (the stream reopened: its first events are the current answers)
    assert int(_data(reader, "streamOpens")) >= 2
    assert reader.execute_script("return window.__polls") == []
    time.sleep(1.5)
    assert _nginx_requests(stack, "/Poll/getMessages") == fetched, "the page fetched /Poll/getMessages"
    assert _data(reader, "transport") == "stream"
    assert _data(reader, "pollHeld") == "0"

    # a page without the timeline streams the count alone, and its badge follows it
    (writer_name, _), _ = pair
    reader.get(f"{base}/u/{writer_name}")
    _wait(lambda: _data(reader, "transport") == "stream" and _polls_done(reader) >= 1,
          what="the user page's stream")
    assert _stream_url(reader) == f"{base}/Poll/getUnreadCount"
    _post(stack, writer_token, f"seen on a user page {time.time():.0f}")
    _wait(lambda: _badge(reader) == 1, timeout=10, what="the badge on the user page")
    assert _data(reader, "streamMessages") == ""


def test_the_stream_falls_back_while_fastpath_is_stopped_and_nothing_is_lost(private_stack, browsers):
    import threading

    stack, base = private_stack, private_stack.base_url
    (_, writer_token), (reader_name, _) = stack.follower_pair()
    reader = browsers("reader")
    _set_edge_url(reader, "")
    _login(reader, base, reader_name)
    _wait(lambda: _data(reader, "transport") == "stream" and _polls_done(reader) >= 1,
          what="the stream's first event")

    # a plurk a second all along: across the fall back and the return, each must be shown once
    posted, stop = [], threading.Event()

    def post_all_along():
        while not stop.is_set():
            at = time.time()
            text = f"all along {len(posted)} {at:.3f}"
            posted.append((_post(stack, writer_token, text), text, at))
            stop.wait(1.0)

    # the window fastpath was down in: (killed, started again)
    down = []
    posted_in = lambda a, b: any(a <= at < b for _, _, at in posted)  # noqa: E731

    poster = threading.Thread(target=post_all_along, daemon=True)
    poster.start()
    fastpath = stack.service("fastpath")
    start = fastpath.start
    fastpath.start = lambda: fastpath               # kept down until the test starts it
    try:
        _arrives(stack, reader, writer_token, f"on the stream {time.time():.0f}", timeout=10)
        fastpath.kill()
        down.append(time.time())
        _arrives(stack, reader, writer_token, f"as fastpath stops {time.time():.0f}")
        _wait(lambda: _data(reader, "transport") in ("long", "short"), timeout=20,
              what="the fall back from the stream")
        misses = int(_data(reader, "pollMisses"))
        _arrives(stack, reader, writer_token, f"while fastpath is stopped {time.time():.0f}")
        assert int(_data(reader, "pollMisses")) > misses            # Django answered the polls
        _shot(reader, "11-stream-fell-back")
        assert not _by_id(reader, "offline").is_displayed()
        _wait(lambda: posted_in(down[0], time.time()), timeout=5, what="a plurk posted while fastpath is down")
    finally:
        fastpath.start = start
        down.append(time.time())
        fastpath.start()
        fastpath.wait_ready()
    try:
        _arrives(stack, reader, writer_token, f"as fastpath is back {time.time():.0f}")
        _wait(lambda: _data(reader, "transport") == "stream", timeout=30, what="the stream again")
        events = int(_data(reader, "streamEvents"))
        _arrives(stack, reader, writer_token, f"on the stream again {time.time():.0f}", timeout=10)
        assert int(_data(reader, "streamEvents")) > events
        _wait(lambda: posted_in(down[1], time.time()), timeout=5, what="a plurk posted after fastpath is back")
    finally:
        stop.set()
        poster.join(15)
    _shot(reader, "12-stream-back")

    # everything posted is on the page, once: the reader follows only the writer
    shown = lambda: reader.execute_script(  # noqa: E731
        "return [...document.querySelectorAll('#timeline > li')].map((li) => Number(li.dataset.id))")
    expected = {pid for pid, _, _ in posted}
    _wait(lambda: expected <= set(shown()), timeout=15, what="every plurk posted all along")
    ids = shown()
    assert len(ids) == len(set(ids)), ids                          # nothing twice
    assert len(ids) == len(expected) + 5, (len(ids), len(expected))   # and the 5 _arrives() plurks
    # the plurks posted all along span the fall back and the return (the faster the client
    # falls back and comes back, the fewer there are: their number says nothing)
    assert posted_in(0, down[0]) and posted_in(down[0], down[1]) and posted_in(down[1], float("inf")), posted


def test_an_edge_the_page_cannot_use_falls_back_to_the_stream(stack, browsers, pair):
    """An edge the page cannot reach (nothing listens there, and the CSP does not name it): the
    first error is taken for a miss (one poll through the site), the second falls back to nginx's
    stream."""
    from plurksite.services import free_port

    base = stack.base_url
    (_, writer_token), (reader_name, _) = pair
    reader = browsers("reader")
    _set_edge_url(reader, f"http://127.0.0.1:{free_port()}")       # nothing listens there
    _login(reader, base, reader_name)
    _wait(lambda: _data(reader, "transport") == "stream" and _polls_done(reader) >= 1,
          what="the fall back to nginx's stream")
    assert _data(reader, "edgeUrl")
    assert int(_data(reader, "streamMisses")) == 1                 # asked the site once
    assert not _by_id(reader, "offline").is_displayed()
    _arrives(stack, reader, writer_token, f"after the edge failed {time.time():.0f}", timeout=10)
    _shot(reader, "13-edge-refused")


def _flush_memcached(stack):
    import socket

    for host, port in stack.config.memcached:
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(b"flush_all\r\n")
            assert sock.recv(64) == b"OK\r\n"


def test_the_page_streams_from_the_edge_and_falls_back_when_it_is_gone(private_stack, browsers):
    """The stack's fastpath restarted with an edge (another origin: another port of 127.0.0.1);
    the page is pointed at it (data-edge-url, and the CSP set aside: this test starts the edge
    itself, the site's is another).  The count comes from the edge; a miss there is one poll
    through the site and back to the edge; with fastpath killed the page goes down the transports
    to polls through Django, and comes back to the edge once fastpath is back."""
    from plurksite.services import free_port

    stack, base = private_stack, private_stack.base_url
    edge = f"127.0.0.1:{free_port()}"
    fastpath = stack.service("fastpath")
    fastpath.fastpath_argv += ["--edge", edge, "--edge-origins", base]
    fastpath.restart()
    fastpath.wait_ready()
    (_, writer_token), (reader_name, reader_token) = stack.follower_pair()
    reader = browsers("reader")
    reader.execute_cdp_cmd("Page.setBypassCSP", {"enabled": True})
    _set_edge_url(reader, f"http://{edge}")
    _login(reader, base, reader_name)
    _wait(lambda: _data(reader, "transport") == "edge" and _polls_done(reader) >= 1,
          what="the edge's first event")
    reader.execute_script(RECORD_POLLS_JS)
    events = int(_data(reader, "streamEvents"))
    assert _stream_url(reader) == f"http://{edge}/Poll/getUnreadCount,getMessages"
    _arrives(stack, reader, writer_token, f"from the edge {time.time():.0f}", timeout=10)
    assert int(_data(reader, "streamEvents")) > events
    assert reader.execute_script("return window.__polls") == []     # count and messages by the edge

    # a miss on the edge: the key goes while the page streams (fastpath reads held keys again
    # every few seconds, --reread-interval): the stream says `event: miss`, the page asks the site
    # once (Django answers and fills the cache), then streams from the edge again
    _wait(lambda: _badge(reader) == 0, timeout=15, what="the plurk read")   # its writes are done
    time.sleep(1)
    counts = lambda: [int(_data(reader, name) or 0)  # noqa: E731
                      for name in ("streamMisses", "pollMisses", "streamOpens")]
    misses, site_misses, opens = counts()
    _flush_memcached(stack)
    _wait(lambda: counts()[0] == misses + 1 and counts()[1] > site_misses and counts()[2] > opens
          and _data(reader, "transport") == "edge", timeout=15,
          what=lambda: f"the miss, one poll of the site, then the edge again: {_datas(reader)}")
    assert stack.poll("getUnreadCount", reader_token, base=stack.fastpath_url).headers["X-Cache"] == "HIT"
    _shot(reader, "14-edge")

    start = fastpath.start
    fastpath.start = lambda: fastpath
    try:
        fastpath.kill()
        _wait(lambda: _data(reader, "transport") in ("long", "short"), timeout=30,
              what=lambda: f"the fall back from the edge: {_datas(reader)}")
        _arrives(stack, reader, writer_token, f"while the edge is gone {time.time():.0f}")
        assert not _by_id(reader, "offline").is_displayed()
    finally:
        fastpath.start = start
        fastpath.start()
        fastpath.wait_ready()
    _wait(lambda: _data(reader, "transport") == "edge", timeout=30,
          what=lambda: f"the edge again: {_datas(reader)}")
    events = int(_data(reader, "streamEvents"))
    _arrives(stack, reader, writer_token, f"from the edge again {time.time():.0f}", timeout=10)
    assert int(_data(reader, "streamEvents")) > events


def test_the_page_on_the_stacks_edge_streams_from_it(stack, browsers, pair):
    """The site's own edge (data-edge-url and the CSP from the site's settings), when the stack
    starts one."""
    if not getattr(stack.config, "edge", None):
        pytest.skip("the test stack starts no edge (PLURK_EDGE is empty)")
    (_, writer_token), (reader_name, _) = pair
    reader = browsers("reader")
    _login(reader, stack.base_url, reader_name)
    host, port = stack.config.edge
    assert _data(reader, "edgeUrl") == f"http://{host}:{port}"
    _wait(lambda: _data(reader, "transport") == "edge" and _polls_done(reader) >= 1, timeout=10,
          what=lambda: f"the edge's first event: {_datas(reader)}")
    reader.execute_script(RECORD_POLLS_JS)
    _arrives(stack, reader, writer_token, f"from the site's edge {time.time():.0f}", timeout=10)
    assert _data(reader, "transport") == "edge"
    assert reader.execute_script("return window.__polls") == []     # count and messages by the edge
