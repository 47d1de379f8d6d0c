"""Every page renders (without the database) with its landmarks; static files are served."""
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
