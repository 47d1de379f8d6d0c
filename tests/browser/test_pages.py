"""Every page renders (without the database) with its landmarks; static files are served."""
import re

import pytest


@pytest.mark.parametrize("url, marker", [
    ("/", b'id="post-content"'), ("/login", b'id="auth-form"'), ("/signup", b'data-action="signup"'),
    ("/u/someone", b'data-username="someone"'),
])
def test_page_renders(client, url, marker):
    resp = client.get(url)
    assert resp.status_code == 200
    body = resp.content
    assert marker in body
    for landmark in (b'role="banner"', b'<main id="main">', b'role="status"', b'name="viewport"'):
        assert landmark in body
    assert "csrftoken" in resp.cookies
    # nothing inline on the pages, so the strict policy costs nothing (the browser tests run under it)
    policy = resp["Content-Security-Policy"]
    assert policy.startswith("default-src 'self';") and "frame-ancestors 'none'" in policy


def test_user_page_escapes_the_name(client):
    resp = client.get("/u/%3Cscript%3E")
    assert b"<script>" not in resp.content.split(b"</head>", 1)[1]


@pytest.mark.parametrize("path, kind", [("/static/plurkweb/app.js", "javascript"),
                                        ("/static/plurkweb/app.css", "css")])
def test_static_files(client, path, kind):
    resp = client.get(path)
    assert resp.status_code == 200 and kind in resp["Content-Type"]


def test_pages_refuse_post(client):
    assert client.post("/").status_code == 405


def test_accessible_markup(client):
    body = client.get("/").content.decode()
    # the badge's number stays in the link's name ("Timeline 3 unread"): no aria-label replacing it
    badge = re.search(r'<span id="badge"[^>]*>(.*?)</a>', body).group(0)
    assert "aria-label" not in badge and '<span class="visually-hidden"> unread</span>' in badge
    # nothing announces every keystroke or the 20 plurks of a page load
    assert not re.search(r'<span id="post-counter"[^>]*aria-live', body)
    assert not re.search(r'<ol id="timeline"[^>]*aria-live', body)
    assert re.search(r'<p id="live-status"[^>]*role="status"', body)
    # the browser's maxlength counts UTF-16 units; the server counts characters (app.js checks)
    assert "maxlength" not in re.search(r"<textarea[^>]*>", body).group(0)


@pytest.mark.parametrize("query, setting, mode", [
    ("", None, "stream"), ("?poll=short", None, "short"), ("?poll=nonsense", None, "stream"),
    ("?poll=long", None, "long"), ("", "short", "short"), ("", "long", "long"),
    ("?poll=long", "short", "long"), ("?poll=stream", "short", "stream"),
])
def test_the_page_streams_unless_told_to_poll(client, settings, query, setting, mode):
    if setting:
        settings.PLURKWEB_POLL_MODE = setting
    assert f'data-poll-mode="{mode}"'.encode() in client.get("/" + query).content


@pytest.mark.parametrize("edge_url, connect", [
    ("http://127.0.0.1:8081", "http://127.0.0.1:8081"),
    ("https://poll.example.com/", "https://poll.example.com"),
    ("https://poll.example.com:8443/Poll/?x=1#y", "https://poll.example.com:8443"),
    ("", None), (None, None), ("javascript:alert(1)", None), ("//poll.example.com", None),
    ("poll.example.com", None),
])
def test_the_policy_lets_the_page_connect_to_its_edge(edge_url, connect):
    from plurkweb.views import CONTENT_SECURITY_POLICY, content_security_policy

    policy = content_security_policy(edge_url)
    if connect is None:
        assert policy == CONTENT_SECURITY_POLICY
    else:
        assert policy == f"{CONTENT_SECURITY_POLICY}; connect-src 'self' {connect}"
