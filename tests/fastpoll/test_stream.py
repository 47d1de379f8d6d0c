"""Django's side of a stream (docs/contract.md section 9): when nginx hands a GET with
``Accept: text/event-stream`` to Django (a miss, fastpath down), the answer is a stream of one
event and a ``retry:`` line that ends, so that the browser's EventSource reconnects by itself
and finds the answer in fastpath.  A 401 stays a JSON 401."""
import pytest

from fastpoll.http import STREAM_RETRY_MS, answer_etag, event_bytes

pytestmark = pytest.mark.django_db

ES = "text/event-stream"


def stream(client, resource="getUnreadCount", method="get", **headers):
    return getattr(client, method)(f"/Poll/{resource}", HTTP_AUTHORIZATION=f"Bearer {client.token}",
                                   HTTP_ACCEPT=headers.pop("accept", ES), **headers)


def test_one_event_and_retry_then_the_end(signup):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    a.call("POST", "/api/plurks", {"content": "x"})
    resp = stream(b)
    assert resp.status_code == 200
    assert resp["Content-Type"] == "text/event-stream"
    assert resp["Cache-Control"] == "no-store" and resp["X-Cache"] == "MISS"
    assert resp["X-Accel-Buffering"] == "no"
    tag = answer_etag(b'{"count":1}')
    assert resp.content == (b"retry: %d\n\n" % STREAM_RETRY_MS +
                            b"id: " + tag.encode() + b'\nevent: getUnreadCount\ndata: {"count":1}\n\n')


def test_the_empty_answer_is_an_event_with_an_empty_data_line(signup):
    resp = stream(signup())
    assert resp.content.endswith(b'"\nevent: getUnreadCount\ndata: \n\n')
    assert resp.content.startswith(b"retry: ")


def test_no_event_when_last_event_id_is_the_answers_etag(signup):
    resp = stream(signup(), HTTP_LAST_EVENT_ID=answer_etag(b""))
    assert resp.content == b"retry: %d\n\n" % STREAM_RETRY_MS
    resp = stream(signup(), HTTP_LAST_EVENT_ID='"00000000000000000000000000000000"')
    assert b"id: " in resp.content


def test_unauthenticated_stream_is_a_json_401(signup):
    client = signup()
    client.token = "nope"
    resp = stream(client)
    assert resp.status_code == 401 and resp["Content-Type"] == "application/json" and "error" in resp.json()


@pytest.mark.parametrize("accept, is_stream", [
    ("text/html, TEXT/Event-Stream;q=0.9", True), (" text/event-stream ", True),
    ("application/json", False), ("text/event-streams", False), ("", False),
])
def test_accept_is_read_as_fastpath_reads_it(signup, accept, is_stream):
    resp = stream(signup(), accept=accept)
    assert (resp.get("Content-Type") == ES) is is_stream


def test_post_and_head_are_polls(signup):
    client = signup()
    assert stream(client, method="post").status_code == 204
    assert stream(client, method="head").status_code == 204


def test_event_bytes_split_lines_as_eventsource_does():
    assert event_bytes('"t"', "r", b"a\r\nb\rc\nd") == b'id: "t"\nevent: r\ndata: a\ndata: b\ndata: c\ndata: d\n\n'
    assert event_bytes('"t"', "r", b"x\n") == b'id: "t"\nevent: r\ndata: x\ndata: \n\n'


# ---- nginx's stream location (fastpoll/templates/fastpoll/nginx-*.conf) -------------------------

def test_the_stream_location_is_unbuffered_with_a_read_timeout_above_the_heartbeat():
    from fastpath.options import OPTIONS
    from fastpoll import conf, nginx

    server, http = nginx.render_server({}), nginx.render_http({})
    location = server.split("location ^~ /_fastpoll_stream/ {", 1)[1].split("\n}", 1)[0]
    assert "proxy_buffering off;" in location
    assert "proxy_pass_header X-Accel-Buffering;" in location      # a balancer in front buffers nothing either
    heartbeat = next(opt.default for opt in OPTIONS if opt.flag == "--stream-heartbeat")
    assert heartbeat == conf.DEFAULTS["STREAM_HEARTBEAT"]          # fastpath alone agrees
    timeout = int(location.split("proxy_read_timeout ", 1)[1].split("s;", 1)[0])
    assert timeout > heartbeat
    quick = nginx.render_server({"STREAM_HEARTBEAT": 5})
    assert "proxy_read_timeout 20s;" in quick.split("location ^~ /_fastpoll_stream/ {", 1)[1].split("\n}", 1)[0]
    for header in ("Accept $http_accept", "Last-Event-ID $http_last_event_id"):
        assert f"proxy_set_header {header};" in location
    assert "error_page 404 502 503 = @fastpoll_django;" in location
    assert "map \"$request_method:$http_accept\" $fastpoll_stream" in http
    # the stream test comes before the long-poll one: a stream's Prefer means nothing
    poll = server.split("location /Poll/ {", 1)[1]
    assert poll.index("$fastpoll_stream") < poll.index("$fastpoll_wait")
