"""HTTP plumbing of the poll view: JSON errors (``{"error": "..."}``), bodiless answers, ETags,
and the one-event stream (docs/contract.md section 9)."""
import hashlib
import re

from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponse, StreamingHttpResponse
from django.utils.functional import Promise
from django.utils.http import parse_etags


class _Encoder(DjangoJSONEncoder):
    """Django's encoder without lazy text: a lazy translation string is written in the language
    active where the write runs (the committing request's, the background writer's, the repair
    pass's), so one cached answer, and its ETag, would change with whoever wrote it."""

    def default(self, o):
        if isinstance(o, Promise):
            raise TypeError("fastpoll.dumps: a lazy translation string has no one language in a cached answer "
                            "(it would be written in whichever language is active where the write runs); "
                            "translate it in compute for the reader (with translation.override(<language>): "
                            "str(text)) or store plain str")
        return super().default(o)


#: compact, non-ASCII as itself, no NaN or Infinity (not JSON); Django's encoder adds what a
#: model's fields hold (UUID, datetime, date, time, timedelta, Decimal) as Django's own JSON
#: responses write them
_ENCODER = _Encoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(obj):
    """The one JSON encoding of the contract (docs/contract.md, section 5): compact, UTF-8, with
    Django's ``DjangoJSONEncoder`` for UUIDs, datetimes and Decimals (a UUID user id in an answer).
    TypeError for lazy translation text; ValueError for NaN or Infinity, and for a lone surrogate
    (text that is not UTF-8)."""
    try:
        text = _ENCODER.encode(obj)
    except ValueError as exc:
        if not str(exc).startswith("Out of range float"):
            raise
        raise ValueError("fastpoll.dumps: NaN and Infinity are not JSON (docs/contract.md, section 5); "
                         "store None or a string for them") from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"fastpoll.dumps: a lone surrogate {text[exc.start:exc.end]!r} in the answer "
                         f"(near {text[max(0, exc.start - 20):exc.start]!r}) is not UTF-8; fix the text "
                         "where it is made (a str decoded with errors='surrogateescape' or "
                         "'surrogatepass')") from None


def json_response(obj, status=200, headers=None):
    response = HttpResponse(dumps(obj), status=status, content_type="application/json")
    response["Cache-Control"] = "no-store"
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def error_response(status, message, headers=None):
    return json_response({"error": message}, status=status, headers=headers)


def bodiless(status):
    """A 204 or 304: no body, no Content-Type and no Content-Length.  Streaming only so that
    CommonMiddleware adds no ``Content-Length: 0``, which RFC 9110 (8.6) forbids on a 204 and on
    a 304 of a non-empty answer."""
    response = StreamingHttpResponse((), status=status)
    del response["Content-Type"]
    return response


def answer_etag(body):
    """The poll answer's ETag (docs/contract.md, section 7): the first 32 lowercase hex digits of
    SHA-256 of the exact body bytes, quoted; fastpath computes the same with OpenSSL."""
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def none_match(request, etag):
    """True if the request's If-None-Match matches ``etag``: Django's own reading
    (``django.utils.cache.get_conditional_response``: ``parse_etags``, ``*``, weak comparison),
    applied to POST as well since a poll is a read whatever its method."""
    tags = parse_etags(request.META.get("HTTP_IF_NONE_MATCH", ""))
    if tags == ["*"]:
        return True
    return etag.removeprefix("W/") in (tag.removeprefix("W/") for tag in tags)


def not_modified(etag):
    """304 with no body, Content-Type or Content-Length."""
    response = bodiless(304)
    response["ETag"] = etag
    response["Cache-Control"] = "no-store"
    return response


#: the ``retry:`` of Django's one-event stream, ms: how soon a browser's EventSource comes back
#: (to fastpath, now that Django filled the cache)
STREAM_RETRY_MS = 1000
#: every stream's first bytes, Django's and fastpath's alike (fp_reply.c STREAM_RETRY; the shared
#: vectors' "streams" "prefix" pins both)
STREAM_PREFIX = b"retry: %d\n\n" % STREAM_RETRY_MS
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


def wants_event_stream(request):
    """True for a GET whose Accept lists ``text/event-stream`` (any case; parameters, q= included,
    are not read): fastpath's fp_accept_event_stream, element for element, so that both sides
    agree on what a stream request is."""
    if request.method != "GET":
        return False
    accept = request.META.get("HTTP_ACCEPT", "")
    return any(part.split(";", 1)[0].strip(" \t").lower() == "text/event-stream" for part in accept.split(","))


def event_bytes(etag, name, body):
    """One Server-Sent Event of an answer: ``id:`` its ETag, ``event:`` the resource, ``data:``
    each line of the body (split at CRLF, CR or LF; the empty body is one empty data line)."""
    data = b"".join(b"data: " + line + b"\n" for line in _LINE_BREAK.split(body))
    return b"id: " + etag.encode("ascii") + b"\nevent: " + name.encode("ascii") + b"\n" + data + b"\n"


#: resources one stream may carry (fastpath's FP_STREAM_PARTS_MAX)
STREAM_PARTS_MAX = 4
_ETAG_LEN = 34                       # a quoted 32-hex ETag


def composite_event_id(tags):
    """The id of an event of a stream of several resources: every resource's ETag as the client
    has it after the event, in path order, joined by ``,`` (``""`` for one it has none of)."""
    return ",".join(tag if tag else '""' for tag in tags)


def read_composite_event_id(value, n):
    """The ``n`` ETags of a Last-Event-ID that composite_event_id wrote (None for ``""``), as
    fastpath reads it (fp_stream.c _set_last_event_id); anything else is n Nones: all is sent."""
    v, tags, pos = value.strip(" \t"), [], 0
    for i in range(n):
        if i > 0:
            if v[pos:pos + 1] != ",":
                return [None] * n
            pos += 1
        if v[pos:pos + 2] == '""':
            tags.append(None)
            pos += 2
        elif len(v) - pos >= _ETAG_LEN and v[pos] == '"' and v[pos + _ETAG_LEN - 1] == '"':
            tags.append(v[pos:pos + _ETAG_LEN])
            pos += _ETAG_LEN
        else:
            return [None] * n
    return tags if pos == len(v) else [None] * n


def _stream(content):
    response = HttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"
    response["X-Cache"] = "MISS"
    return response


def streams_response(answers, request):
    """Django's answer to a stream of several resources (``answers``: (name, body) in path order):
    ``retry:``, then an event for each answer the client's composite Last-Event-ID does not name,
    each id what the client has after it (composite_event_id), then the end."""
    have = read_composite_event_id(request.META.get("HTTP_LAST_EVENT_ID", ""), len(answers))
    content = STREAM_PREFIX
    for i, (name, body) in enumerate(answers):
        etag = answer_etag(body)
        if have[i] != etag:
            have[i] = etag
            content += event_bytes(composite_event_id(have), name, body)
    return _stream(content)


def stream_response(body, name, request):
    """Django's answer to a stream: ``retry:``, then the answer's event (none when Last-Event-ID
    is its ETag), then the end, so that EventSource reconnects by itself and finds fastpath."""
    etag = answer_etag(body)
    content = STREAM_PREFIX
    if request.META.get("HTTP_LAST_EVENT_ID", "").strip(" \t") != etag:
        content += event_bytes(etag, name, body)
    return _stream(content)
