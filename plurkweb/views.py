"""Page shells: the templates render without touching the database, so a page never fails
because the API is busy; app.js fills them in from /api and /Poll."""
from django.conf import settings
from django.shortcuts import render as django_render
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_safe


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


def render(request, template, context):
    response = django_render(request, template, {**context, "poll_mode": poll_mode(request)})
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
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
