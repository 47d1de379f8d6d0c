"""Page shells: the templates render without touching the database, so a page never fails
because the API is busy; app.js fills them in from /api and /Poll."""
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_safe


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
