"""plurkcore's own system checks (fastpoll checks its settings itself).

| id | problem |
|---|---|
| W004 | CsrfViewMiddleware is not installed |
"""
from django.conf import settings
from django.core import checks


def check_csrf_middleware(app_configs=None, **kwargs):
    if "django.middleware.csrf.CsrfViewMiddleware" in settings.MIDDLEWARE:
        return []
    return [checks.Warning(
        "CsrfViewMiddleware is not installed: signup/login cannot set the csrftoken cookie.",
        id="plurkcore.W004")]


def register():
    checks.register(check_csrf_middleware, "plurkcore", checks.Tags.security)
