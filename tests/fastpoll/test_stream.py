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


# ---- several resources in one stream ------------------------------------------------------

BOTH = "getUnreadCount,getMessages"


def _answers(client):
    """The two answers as Django computes them (short polls: the same bodies)."""
    u = client.get("/Poll/getUnreadCount", HTTP_AUTHORIZATION=f"Bearer {client.token}")
    m = client.get("/Poll/getMessages", HTTP_AUTHORIZATION=f"Bearer {client.token}")
    return tuple(b"" if r.status_code == 204 else r.content for r in (u, m))


def test_a_stream_of_two_is_one_event_each_ids_composite(signup):
    a, b = signup("a"), signup("b")
    b.call("POST", "/api/follow", {"username": "a"})
    a.call("POST", "/api/plurks", {"content": "x"})
    u, m = _answers(b)
    resp = stream(b, BOTH)
    assert resp.status_code == 200 and resp["Content-Type"] == ES and resp["X-Cache"] == "MISS"
    tu, tm = answer_etag(u), answer_etag(m)
    assert resp.content == (b"retry: %d\n\n" % STREAM_RETRY_MS +
                            event_bytes(f'{tu},""', "getUnreadCount", u) +
                            event_bytes(f"{tu},{tm}", "getMessages", m))


@pytest.mark.parametrize("have, sent", [
    (("u", "m"), []), (("u", None), ["getMessages"]), ((None, "m"), ["getUnreadCount"]),
    (("old", "old"), ["getUnreadCount", "getMessages"]),
])
def test_last_event_id_skips_the_resources_the_client_has(signup, have, sent):
    client = signup()
    u, m = _answers(client)
    tags = {"u": answer_etag(u), "m": answer_etag(m), "old": '"00000000000000000000000000000000"', None: '""'}
    resp = stream(client, BOTH, HTTP_LAST_EVENT_ID=",".join(tags[h] for h in have))
    names = [line[7:] for line in resp.content.decode().split("\n") if line.startswith("event: ")]
    assert names == sent
    if sent:
        assert f"id: {answer_etag(u)},{answer_etag(m)}\n" in resp.content.decode().split("\n\n")[-2] + "\n"


def test_an_unreadable_last_event_id_sends_every_resource(signup):
    client = signup()
    u, _ = _answers(client)
    for last in [answer_etag(u), "garbage", answer_etag(u) + ";" + answer_etag(u)]:
        resp = stream(client, BOTH, HTTP_LAST_EVENT_ID=last)
        assert resp.content.count(b"event: ") == 2, last


@pytest.mark.parametrize("names", [
    "getUnreadCount,nope", "getMessages,getMessages",
    "getUnreadCount,getMessages,getUnreadCount,getMessages,getUnreadCount",
])
def test_unknown_repeated_or_too_many_names_are_a_json_404(signup, names):
    resp = stream(signup(), names)
    assert resp.status_code == 404 and resp["Content-Type"] == "application/json" and "error" in resp.json()


@pytest.mark.parametrize("kwargs", [{"accept": "application/json"}, {"method": "post"}, {"method": "head"}])
def test_several_resources_are_only_a_stream(signup, kwargs):
    resp = stream(signup(), BOTH, **kwargs)
    assert resp.status_code == 404


def test_a_stream_of_two_unauthenticated_is_a_json_401(signup):
    client = signup()
    client.token = "nope"
    resp = stream(client, BOTH)
    assert resp.status_code == 401 and resp["Content-Type"] == "application/json"


# ---- the shared vectors (tests/vectors/contract.json "streams"; fastpath reads the same ones in
# tests/fastpath/test_stream.py) -------------------------------------------------------------

def _vectors():
    import json
    import os
    with open(os.path.join(os.path.dirname(__file__), "..", "vectors", "contract.json")) as fh:
        return json.load(fh)["streams"]


STREAM_VECTORS = _vectors()


@pytest.mark.django_db(False)
@pytest.mark.parametrize("v", STREAM_VECTORS["accept"], ids=lambda v: f"{v['method']} {v['accept']!r}")
def test_the_vectors_accept_header_says_what_a_stream_request_is(rf, v):
    from fastpoll.http import wants_event_stream
    extra = {} if v["accept"] is None else {"HTTP_ACCEPT": v["accept"]}
    assert wants_event_stream(rf.generic(v["method"], "/Poll/getMessages", **extra)) == v["stream"]


@pytest.mark.django_db(False)
@pytest.mark.parametrize("v", STREAM_VECTORS["events"], ids=lambda v: f"{v['name']} {v['body']!r}")
def test_the_vectors_events_are_djangos_bytes(v):
    body = v["body"].encode("utf-8")
    assert event_bytes(answer_etag(body), v["name"], body).decode("utf-8") == v["bytes"]


@pytest.mark.django_db(False)
@pytest.mark.parametrize("v", STREAM_VECTORS["several"], ids=lambda v: v["why"])
def test_the_vectors_several_resources_open_as_written(rf, v):
    from fastpoll.http import streams_response
    extra = {} if v["last_event_id"] is None else {"HTTP_LAST_EVENT_ID": v["last_event_id"]}
    request = rf.get("/Poll/" + ",".join(v["names"]), HTTP_ACCEPT=ES, **extra)
    resp = streams_response([(n, b.encode("utf-8")) for n, b in zip(v["names"], v["bodies"])], request)
    assert resp.content.decode("utf-8") == v["opening"]


@pytest.mark.django_db(False)
def test_the_vectors_prefix_is_djangos_first_bytes():
    """fastpath's side: tests/fastpath/test_stream.py reads the same prefix first on every stream."""
    from fastpoll.http import STREAM_PREFIX
    assert STREAM_PREFIX.decode("ascii") == STREAM_VECTORS["prefix"] == f"retry: {STREAM_RETRY_MS}\n\n"
