"""The Django side of the polls: answer from the database, then fill the cache.

``<PATH_PREFIX><resource>`` for a per-user resource, ``<PATH_PREFIX><resource>/<object>?cap=...``
for a per-object one.  fastpath serves hits; nginx sends misses (and everything when fastpath or
memcached is down) here.  Headers follow docs/contract.md, section 6; ETag and If-None-Match
section 7.  This view never holds a request: ``Prefer: wait`` is fastpath's alone, Django
answers at once.  A stream (a GET with ``Accept: text/event-stream``, section 9) is answered with
one event and ``retry:``, then ends: the browser's EventSource comes back, to fastpath.
``<PATH_PREFIX><resource>,<resource>`` (2 to 4 per-user resources) is only ever a stream: one
event per resource, the ids composite (``poll_several``).
"""
import logging

from django.db import OperationalError
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt

from . import _testhooks, capability, keys, publish, resources
from .auth import AuthError, authenticate_token, token_from_request
from .http import (STREAM_PARTS_MAX, answer_etag, bodiless, error_response, none_match, not_modified, stream_response,
                   streams_response, wants_event_stream)

logger = logging.getLogger("fastpoll.poll")
POLL_METHODS = ("GET", "HEAD", "POST")        # a poll is a read, whatever its method


def poll_response(body, cache_status, request=None, name=None):
    """The 200/204 answer for ``body`` with its ETag, or a 304 when ``request``'s If-None-Match
    matches that ETag; for a stream request, the one-event stream of the resource ``name``."""
    if request is not None and name is not None and wants_event_stream(request):
        return stream_response(body, name, request)
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
def poll(request, resource, obj=None):
    """GET or POST a poll (the body of a POST is ignored)."""
    try:
        if request.method not in POLL_METHODS:
            return error_response(405, f"method {request.method} not allowed", {"Allow": ", ".join(POLL_METHODS)})
        found = resources.get(resource)
        if found is None:
            return error_response(404, f"unknown poll resource {resource!r}"[:200])
        if found.per != ("user" if obj is None else "object"):
            return error_response(404, f"{resource!r} is a per-{found.per} resource: "
                                  + ("its path has no object" if found.per == "user" else "its path ends in the object's id"))
        token, _ = token_from_request(request)
        try:
            user, epoch = authenticate_token(token)
        except AuthError as exc:
            return error_response(401, str(exc))
        if obj is None:
            return _user_answer(request, found, user, epoch)
        return _object_answer(request, found, obj, user, epoch)
    except OperationalError as exc:
        # the database is busy or away: like the API, ask the poller to come back shortly
        logger.error("poll %s: database unavailable: %s", resource, exc)
        return error_response(503, "database busy, retry shortly", {"Retry-After": "1"})
    except resources.ResourceError as exc:
        logger.error("poll %s failed: %s", resource, exc)          # the project's bug, in one line
        return error_response(500, "internal error")
    except Exception:
        logger.exception("poll %s failed", resource)
        return error_response(500, "internal error")


@csrf_exempt
def poll_several(request, names):
    """A stream of several per-user resources of one user (docs/contract.md section 9): their
    events in path order, each id the ETags the client has, then ``retry:``'s end.  Anything but
    a stream naming them, or names that are unknown, repeated, per-object or more than
    STREAM_PARTS_MAX, is the 404 of a path that names no resource."""
    label = names[:200]
    try:
        if request.method not in POLL_METHODS:
            return error_response(405, f"method {request.method} not allowed", {"Allow": ", ".join(POLL_METHODS)})
        parts = names.split(",")
        if not wants_event_stream(request):
            return error_response(404, f"unknown poll resource {label!r}: several resources are only a stream")
        if len(parts) > STREAM_PARTS_MAX or len(set(parts)) != len(parts):
            return error_response(404, f"unknown poll resource {label!r}: a stream carries 2 to "
                                  f"{STREAM_PARTS_MAX} resources, none twice")
        found = [resources.get(name) for name in parts]
        for name, resource in zip(parts, found):
            if resource is None or resource.per != "user":
                return error_response(404, f"unknown poll resource {name!r}: a stream of several "
                                      "carries per-user resources"[:200])
        token, _ = token_from_request(request)
        try:
            user, epoch = authenticate_token(token)
        except AuthError as exc:
            return error_response(401, str(exc))
        answers = []
        for resource in found:
            body = resource.answers([user.pk]).get(user.pk, b"")
            _fill(keys.answer_key(resource.name, user.pk, epoch), body, user.pk, epoch)
            answers.append((resource.name, body))
        return streams_response(answers, request)
    except OperationalError as exc:
        logger.error("poll %s: database unavailable: %s", label, exc)
        return error_response(503, "database busy, retry shortly", {"Retry-After": "1"})
    except resources.ResourceError as exc:
        logger.error("poll %s failed: %s", label, exc)
        return error_response(500, "internal error")
    except Exception:
        logger.exception("poll %s failed", label)
        return error_response(500, "internal error")


@csrf_exempt
def not_a_poll(request):
    return error_response(404, "no poll resource at this path: <prefix><resource> or <prefix><resource>/<object>")


def _user_answer(request, resource, user, epoch):
    body = resource.answers([user.pk]).get(user.pk, b"")
    _testhooks.fire("fill.after_read", resource=resource.name, uid=user.pk, epoch=epoch)
    _fill(keys.answer_key(resource.name, user.pk, epoch), body, user.pk, epoch)
    return poll_response(body, "MISS", request, resource.name)


def _object_answer(request, resource, obj, user, epoch):
    try:
        capability.check(request.GET.get("cap"), resource.name, obj, user)
    except capability.CapabilityError as exc:
        return error_response(403, str(exc))
    ident = keys.object_id(obj)
    body = resource.answers([ident]).get(ident, b"")
    _fill(keys.object_key(resource.name, obj), body)
    _fill(keys.marker_key(user.pk, epoch), b"", user.pk, epoch)
    return poll_response(body, "MISS", request, resource.name)


def _fill(key, body, uid=None, epoch=None):
    try:
        publish.fill(key, body, uid, epoch)
    except Exception:
        logger.exception("filling the cache key %s failed", key)
