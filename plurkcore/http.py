"""JSON plumbing shared by the API and poll views: errors are always ``{"error": "..."}``."""
import functools
import json
import logging

from django.conf import settings
from django.core.exceptions import BadRequest, PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.db import OperationalError
from django.http import Http404, HttpResponse, StreamingHttpResponse, UnreadablePostError
from django.http.multipartparser import MultiPartParserError
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

import fastpoll

logger = logging.getLogger("plurkcore.api")


class ApiError(Exception):
    def __init__(self, status, message, headers=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def json_response(obj, status=200, headers=None):
    response = HttpResponse(fastpoll.dumps(obj), status=status, content_type="application/json")
    response["Cache-Control"] = "no-store"
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def no_content():
    """A 204 with no Content-Type and no Content-Length (RFC 9110, 8.6)."""
    response = StreamingHttpResponse((), status=204)
    del response["Content-Type"]
    response["Cache-Control"] = "no-store"
    return response


class _CsrfCheck(CsrfViewMiddleware):
    """Django's CSRF checks, returning the failure reason instead of an HTML page."""

    def _reject(self, request, reason):
        return reason


def _require_csrf(request):
    """Django's CSRF checks for this request; ApiError 403 with the reason when they fail."""
    reason = _CsrfCheck(lambda r: None).process_view(request, None, (), {})
    if isinstance(reason, str):
        raise ApiError(403, f"CSRF check failed: {reason}")


def read_json(request):
    """The request body as a JSON object (dict); ApiError 400/413 otherwise."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2621440
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(400, "bad Content-Length") from None
    if length > limit:
        raise ApiError(413, f"request body too large (limit {limit} bytes)")
    try:
        body = request.body
    except RequestDataTooBig:
        raise ApiError(413, f"request body too large (limit {limit} bytes)") from None
    if len(body) > limit:
        raise ApiError(413, f"request body too large (limit {limit} bytes)")
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ApiError(400, "the body must be a JSON object") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    return data


def is_storable_text(value):
    """False for text no database column should get: NUL (PostgreSQL refuses it) or lone
    surrogates (not encodable as UTF-8)."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def field(data, name, kind=str):
    value = data.get(name)
    if kind is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ApiError(400, f"'{name}' must be an integer")
    elif not isinstance(value, kind):
        raise ApiError(400, f"'{name}' must be a {'string' if kind is str else kind.__name__}")
    elif kind is str and not is_storable_text(value):
        raise ApiError(400, f"'{name}' contains characters that cannot be stored")
    return value


def _from_a_browser(request):
    """A browser says where a request comes from (Origin on every cross-origin and every fetch
    POST, Sec-Fetch-Site on all of them); API clients send neither."""
    return "HTTP_ORIGIN" in request.META or "HTTP_SEC_FETCH_SITE" in request.META


def api_view(methods, auth=True, logs_in=False):
    """Wrap a JSON view: method check, authentication, CSRF for cookie-authenticated writes, and
    every failure (including unexpected ones) turned into a JSON error response.

    methods: the methods served (HEAD goes with GET, as HTTP requires), or None for any.
    logs_in: the view sets the login cookie (signup, login).  A browser's request to it passes
    Django's CSRF check like a cookie write, so that another site cannot log a visitor into an
    account of its choosing (login CSRF); API clients, which send no Origin, need no token."""
    if methods is not None:
        methods = [m.upper() for m in methods]
        if "GET" in methods and "HEAD" not in methods:
            methods.insert(methods.index("GET") + 1, "HEAD")

    def decorator(view):
        @functools.wraps(view)
        def wrapper(request, *args, **kwargs):
            try:
                if methods is not None and request.method not in methods:
                    raise ApiError(405, f"method {request.method} not allowed",
                                   {"Allow": ", ".join(methods)})
                if logs_in and _from_a_browser(request):
                    _require_csrf(request)
                if auth:
                    try:
                        request.plurk_user, source = fastpoll.authenticate(request)
                    except fastpoll.AuthError as exc:
                        raise ApiError(401, str(exc)) from None
                    request.plurk_auth_source = source
                    if source == "cookie" and request.method not in ("GET", "HEAD", "OPTIONS", "TRACE"):
                        _require_csrf(request)
                return view(request, *args, **kwargs)
            except ApiError as exc:
                return fastpoll.error_response(exc.status, exc.message, exc.headers)
            except Http404 as exc:
                return fastpoll.error_response(404, str(exc) or "not found")
            except PermissionDenied:
                return fastpoll.error_response(403, "permission denied")
            except RequestDataTooBig:
                return fastpoll.error_response(413, "request body too large")
            except (MultiPartParserError, UnreadablePostError, BadRequest) as exc:
                # e.g. a multipart body without a boundary, read by the CSRF check's request.POST
                return fastpoll.error_response(400, f"malformed request body: {exc}"[:200])
            except SuspiciousOperation as exc:
                logger.warning("suspicious request: %s", exc)
                return fastpoll.error_response(400, "bad request")
            except OperationalError as exc:
                # the database is overloaded or away (SQLite "database is locked" after its
                # timeout, a lost PostgreSQL connection): the client should retry, not give up
                logger.error("database unavailable in %s: %s", view.__name__, exc)
                return fastpoll.error_response(503, "database busy, retry shortly", {"Retry-After": "1"})
            except Exception:
                logger.exception("unexpected error in %s", view.__name__)
                return fastpoll.error_response(500, "internal error")

        return csrf_exempt(wrapper)

    return decorator
