"""Page shells: the templates render without touching the database, so a page never fails
because the API is busy; app.js fills them in from /api and /Poll."""
from django.conf import settings
from django.shortcuts import render as django_render
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_safe

import fastpoll


POLL_MODES = ("long", "short")
# The pages load one script and one stylesheet from here, and nothing inline: a second line of
# defence should an injection ever slip past app.js's text-only rendering.
CONTENT_SECURITY_POLICY = ("default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                           "frame-ancestors 'none'")


def poll_mode(request):
    """How the page polls (app.js): ``long`` (held by fastpath, the default) or ``short`` (every
    2 s, for comparison); ``?poll=short`` overrides settings.PLURKWEB_POLL_MODE for one page."""
    mode = request.GET.get("poll") or getattr(settings, "PLURKWEB_POLL_MODE", "long")
    return mode if mode in POLL_MODES else "long"


def content_security_policy(edge_url):
    """The pages' policy; with an edge, its origin may be fetched too (polls, EventSource)."""
    if not edge_url:
        return CONTENT_SECURITY_POLICY
    return f"{CONTENT_SECURITY_POLICY}; connect-src 'self' {edge_url}"


def render(request, template, context):
    # <body data-edge-url>: where app.js polls first ("" : the site only); fastpoll.edge_url
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
