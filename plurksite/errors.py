"""Project-wide error views (``handler400`` & co. in plurksite.urls).

Django answers some failures before any view runs -- a ``Host`` header outside ``ALLOWED_HOSTS``,
a CSRF failure, a URL that matches nothing -- with its HTML error pages.  The API promises JSON
``{"error": ...}`` for every error, so requests for the API and the poll resources (and clients
that do not ask for HTML) get JSON; the pages keep Django's HTML.
"""
from django.views import defaults

from fastpoll import error_response

JSON_PREFIXES = ("/api/", "/Poll/")


def wants_json(request):
    path = request.path_info or ""
    if path.startswith(JSON_PREFIXES) or path in ("/api", "/Poll"):
        return True
    return "text/html" not in request.META.get("HTTP_ACCEPT", "")


def bad_request(request, exception=None):
    if wants_json(request):
        return error_response(400, "bad request")
    return defaults.bad_request(request, exception)


def permission_denied(request, exception=None):
    if wants_json(request):
        return error_response(403, "permission denied")
    return defaults.permission_denied(request, exception)


def page_not_found(request, exception=None):
    if wants_json(request):
        return error_response(404, "not found")
    return defaults.page_not_found(request, exception)


def server_error(request):
    if wants_json(request):
        return error_response(500, "internal error")
    return defaults.server_error(request)
