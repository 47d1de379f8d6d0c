"""System checks of how the project wires fastpoll in, beyond ``settings.FASTPOLL``
(fastpoll/checks.py's table lists their ids):

- E019: ``<PATH_PREFIX><resource>`` does not resolve to fastpoll's poll view in ROOT_URLCONF
  (``fastpoll.urls`` not included, or included under another prefix): every poll fastpath
  misses gets the site's HTML 404, and fastpoll.js gives up ("refused").
- W007: the site logs users in with Django's sessions (``django.contrib.sessions`` installed,
  AuthenticationMiddleware in MIDDLEWARE) but MIDDLEWARE lacks PollTokenMiddleware: no session
  user gets a poll cookie, so each of their polls is 401.  A site whose clients poll with tokens
  of its own (``fastpoll.issue_token``, ``Authorization: Bearer``) silences it.

``register_checks()`` is what ``FastpollConfig.ready()`` calls.
"""
import inspect

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.urls import Resolver404, resolve

from . import commandline, conf, resources, views
from .checks import AUTH_MIDDLEWARE, POLL_MIDDLEWARE, _position

TAG = "fastpoll"
#: the object id of the per-object path E019 resolves (fastpoll.urls takes any object id)
URL_OBJECT = "0"


def _config():
    """The effective FASTPOLL, or None when it is malformed (fastpoll.E001 says so)."""
    user = getattr(settings, "FASTPOLL", None)
    return None if user is not None and not isinstance(user, dict) else conf.get_config()


def _poll_paths(prefix):
    """A path of the first registered per-user and per-object resource: what polls ask for."""
    users, objects = sorted(resources.names(per="user")), sorted(resources.names(per="object"))
    return [prefix + name for name in users[:1]] + [f"{prefix}{name}/{URL_OBJECT}" for name in objects[:1]]


def check_urls(app_configs=None, **kwargs):
    """fastpath misses are Django's to answer at the very path of the poll, by fastpoll's view."""
    config = _config()
    if config is None or not getattr(settings, "ROOT_URLCONF", None):
        return []                      # E001, or no URLconf at all (a project's library tests)
    if not conf.is_path_prefix(config["PATH_PREFIX"]) or commandline.setting_error("PATH_PREFIX", config):
        return []                      # E012 / E015 say what is wrong with it
    for path in _poll_paths(config["PATH_PREFIX"]):
        try:
            match = resolve(path)
        except Resolver404:
            match = None
        except Exception:
            return []                  # the URLconf itself fails: Django says so at every request
        if match is not None and inspect.unwrap(match.func) is inspect.unwrap(views.poll):
            continue
        found = "does not resolve" if match is None else f"resolves to {match._func_path}"
        return [checks.Error(
            f"The poll path {path} {found} in ROOT_URLCONF ({settings.ROOT_URLCONF}), not to fastpoll's poll view: "
            f"every poll fastpath misses gets the site's 404 page and fastpoll.js stops polling.",
            hint=f"Add path(\"\", include(\"fastpoll.urls\")) to {settings.ROOT_URLCONF}'s urlpatterns (its paths "
                 f"start with PATH_PREFIX {config['PATH_PREFIX']!r}; not under another path).",
            id="fastpoll.E019")]
    return []


def check_poll_middleware(app_configs=None, **kwargs):
    """Session users get the poll cookie only from PollTokenMiddleware (E013 judges its place)."""
    middleware = list(getattr(settings, "MIDDLEWARE", None) or ())
    if not apps.is_installed("django.contrib.sessions") or _position(middleware, AUTH_MIDDLEWARE) is None:
        return []
    if _position(middleware, POLL_MIDDLEWARE) is not None:
        return []
    return [checks.Warning(
        f"MIDDLEWARE has AuthenticationMiddleware (with django.contrib.sessions) but not {POLL_MIDDLEWARE}: a "
        f"user logged in with Django's sessions gets no poll cookie, so every poll of theirs is 401.",
        hint=f"Add '{POLL_MIDDLEWARE}' to MIDDLEWARE after '{AUTH_MIDDLEWARE}'; a site whose clients poll only "
             f"with tokens it hands out itself (fastpoll.issue_token) silences this: "
             f"SILENCED_SYSTEM_CHECKS = [\"fastpoll.W007\"].",
        id="fastpoll.W007")]


CHECKS = (check_urls, check_poll_middleware)


def register_checks():
    """Register the checks above (``FastpollConfig.ready()`` calls this once)."""
    checks.register(check_urls, TAG, checks.Tags.urls)
    checks.register(check_poll_middleware, TAG, checks.Tags.compatibility)
