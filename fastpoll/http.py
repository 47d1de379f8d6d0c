"""HTTP plumbing of the poll view: JSON errors (``{"error": "..."}``), bodiless answers, ETags."""
import hashlib
import json

from django.http import HttpResponse, StreamingHttpResponse
from django.utils.http import parse_etags


def dumps(obj):
    """The one JSON encoding of the contract (docs/contract.md, section 5): compact, UTF-8."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


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
