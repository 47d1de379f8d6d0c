"""Page shells: the templates render without touching the database, so a page never fails
because the API is busy; app.js fills them in from /api and /Poll."""
from urllib.parse import urlsplit

from django.conf import settings
from django.shortcuts import render as django_render
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_safe

import fastpoll


POLL_MODES = ("stream", "long", "short")
# The pages load two scripts (fastpoll's client and app.js) and one stylesheet from here, and
# nothing inline: a second line of defence should an injection ever slip past app.js's text-only
# rendering.
CONTENT_SECURITY_POLICY = ("default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                           "frame-ancestors 'none'")


def content_security_policy(edge_url=""):
    """The pages' policy; with an edge (``<body data-edge-url>``, another origin) app.js also
    connects there, so ``connect-src`` names the edge's origin (scheme, host, port; nothing else)."""
    parts = urlsplit(edge_url or "")
    if not (parts.scheme in ("http", "https") and parts.netloc):
        return CONTENT_SECURITY_POLICY
    return f"{CONTENT_SECURITY_POLICY}; connect-src 'self' {parts.scheme}://{parts.netloc}"


def poll_mode(request):
    """How the page gets its updates (app.js, docs/web.md): ``stream`` (Server-Sent Events on the
    edge, then through nginx, falling back to long and short polls; the default), ``long``
    (long-polls held by fastpath, falling back to short polls) or ``short`` (every 2 s, for
    comparison); ``?poll=short`` overrides settings.PLURKWEB_POLL_MODE for one page."""
    mode = request.GET.get("poll") or getattr(settings, "PLURKWEB_POLL_MODE", POLL_MODES[0])
    return mode if mode in POLL_MODES else POLL_MODES[0]


def render(request, template, context):
    # <body data-edge-url>: where app.js streams first ("" : the site only); fastpoll.edge_url
    edge_url = fastpoll.edge_url(request)
    response = django_render(request, template, {**context, "poll_mode": poll_mode(request), "edge_url": edge_url})
    response["Content-Security-Policy"] = content_security_policy(edge_url)
    return response


@require_safe
@ensure_csrf_cookie
def timeline(request):
    return render(request, "plurkweb/timeline.html", {"page": "timeline"})


@require_safe
@ensure_csrf_cookie
def login(request):
    return render(request, "plurkweb/auth.html", {"page": "login", "title": "Log in"})


@require_safe
@ensure_csrf_cookie
def signup(request):
    return render(request, "plurkweb/auth.html", {"page": "signup", "title": "Sign up"})


@require_safe
@ensure_csrf_cookie
def user_page(request, username):
    return render(request, "plurkweb/user.html", {"page": "user", "profile": username[:150]})
