"""The Django side of /Poll/<resource>: answer from the database, then fill the cache.

fastpath serves hits; nginx sends misses (and everything when fastpath or memcached is down) here.
Headers follow docs/contract.md, section 6; ETag and If-None-Match section 7.  This view never
holds a request: ``Prefer: wait`` is fastpath's alone, Django answers at once.
"""
import logging

from django.db import OperationalError
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt

from fastpoll import keys
from . import _testhooks, answers, publish
from .auth import AuthError, authenticate_token, token_from_request
from .http import answer_etag, bodiless, error_response, none_match, not_modified

logger = logging.getLogger("plurkcore.poll")
POLL_METHODS = ("GET", "HEAD", "POST")        # a poll is a read, whatever its method


def poll_response(body, cache_status, request=None):
    """The 200/204 answer for ``body`` with its ETag, or a 304 when ``request``'s If-None-Match
    matches that ETag."""
    etag = answer_etag(body)
    if request is not None and none_match(request, etag):
        response = not_modified(etag)
        response["X-Cache"] = cache_status
        return response
    if body:
        response = HttpResponse(body, content_type="application/json")
    else:
        response = bodiless(204)
    response["ETag"] = etag
    response["X-Cache"] = cache_status
    response["Cache-Control"] = "no-store"
    return response


@csrf_exempt
def poll(request, resource):
    """GET or POST /Poll/<resource> (the body of a POST is ignored)."""
    try:
        if request.method not in POLL_METHODS:
            return error_response(405, f"method {request.method} not allowed", {"Allow": ", ".join(POLL_METHODS)})
        poll_resource = answers.get_resource(resource)
        if poll_resource is None:
            return error_response(404, f"unknown poll resource {resource!r}"[:200])
        token, _ = token_from_request(request)
        try:
            user, epoch = authenticate_token(token)
        except AuthError as exc:
            return error_response(401, str(exc))
        body = poll_resource.compute([user.pk]).get(user.pk, b"")
        _testhooks.fire("fill.after_read", resource=resource, uid=user.pk, epoch=epoch)
        try:
            publish.fill(keys.answer_key(resource, user.pk, epoch), body, user.pk, epoch)
        except Exception:
            logger.exception("filling the cache for %s failed", resource)
        return poll_response(body, "MISS", request)
    except OperationalError as exc:
        # the database is busy or away: like the API, ask the poller to come back shortly
        logger.error("poll %s: database unavailable: %s", resource, exc)
        return error_response(503, "database busy, retry shortly", {"Retry-After": "1"})
    except Exception:
        logger.exception("poll %s failed", resource)
        return error_response(500, "internal error")
