"""System checks of how the project wires fastpoll in, beyond ``settings.FASTPOLL``
(fastpoll/checks.py's table lists their ids):

- W014: ``<PATH_PREFIX><resource>`` does not resolve to fastpoll's poll view in ROOT_URLCONF
  (``fastpoll.urls`` not included, or included under another prefix): every poll fastpath
  misses that Django routes by ROOT_URLCONF gets the site's HTML 404, and fastpoll.js gives up
  ("refused").  Under ``i18n_patterns(prefix_default_language=True)`` with LocaleMiddleware a
  miss is redirected to ``/<language><PATH_PREFIX>...`` first: it says so.  A Warning (it was
  the Error E019): a site that picks its URLconf per request (``request.urlconf``) silences it.
- W007: the site logs users in with Django's sessions (``django.contrib.sessions`` installed,
  AuthenticationMiddleware in MIDDLEWARE) but MIDDLEWARE lacks PollTokenMiddleware: no session
  user gets a poll cookie, so each of their polls is 401.  A site whose clients poll with tokens
  of its own (``fastpoll.issue_token``, ``Authorization: Bearer``) silences it.
- W008: a MEMCACHED_SERVERS server is the LOCATION of a memcached cache of CACHES: fastpoll's
  repair flushes a server that was away (``flush_all``, fastpoll/repair.py), which empties the
  site's cache with it: its sessions too with SESSION_ENGINE ``cache`` (everyone logged out),
  only their cached copies with ``cached_db``.
- W009 (``check --deploy --database <alias>``: it queries, Django's ``databases`` convention):
  outbox rows older than OUTBOX_AGE_GRACES x OUTBOX_GRACE, or stale keys or suspect memcached
  servers (never flushed) older than STALE_AGE_INTERVALS x REPAIR_INTERVAL: no repair pass has
  paid them, so their answers stay
  stale until CACHE_TTL (docs/consistency.md: ``repaircache --loop`` is required).

``register_checks()`` is what ``FastpollConfig.ready()`` calls.
"""
import datetime
import inspect
import os
import re

from django.apps import apps
from django.conf import settings
from django.conf.urls.i18n import is_language_prefix_patterns_used
from django.core import checks
from django.db import DatabaseError, router
from django.db.models.functions import Now
from django.urls import Resolver404, resolve
from django.utils import timezone, translation

from . import commandline, conf, resources, views
from .cache import parse_server
from .checks import AUTH_MIDDLEWARE, POLL_MIDDLEWARE, _is_positive_number, _malformed, _position
from .models import PendingChange, StaleKey, SuspectServer

TAG = "fastpoll"
#: the object id of the per-object path W014 resolves (fastpoll.urls takes any object id)
URL_OBJECT = "0"


def _config():
    """The effective FASTPOLL, or None when it is malformed (fastpoll.E001 says so)."""
    return None if _malformed() else conf.get_config()


def _poll_paths(prefix):
    """A path of the first registered per-user and per-object resource: what polls ask for."""
    users, objects = sorted(resources.names(per="user")), sorted(resources.names(per="object"))
    return [prefix + name for name in users[:1]] + [f"{prefix}{name}/{URL_OBJECT}" for name in objects[:1]]


#: Django's middleware that redirects a path a language prefix makes valid (i18n_patterns)
LOCALE_MIDDLEWARE = "django.middleware.locale.LocaleMiddleware"


def _is_poll_view(match):
    return match is not None and inspect.unwrap(match.func) is inspect.unwrap(views.poll)


def _resolve(path):
    try:
        return resolve(path)
    except Resolver404:
        return None


def _language_prefixed(path):
    """``path`` under the default language's prefix when ROOT_URLCONF uses
    ``i18n_patterns(prefix_default_language=True)`` and that path is fastpoll's poll view, else None."""
    used, prefixed = is_language_prefix_patterns_used(settings.ROOT_URLCONF)
    if not (used and prefixed):
        return None
    with translation.override(settings.LANGUAGE_CODE):
        language = translation.get_language()
        there = f"/{language}{path}"
        return there if _is_poll_view(_resolve(there)) else None


def check_urls(app_configs=None, **kwargs):
    """fastpath misses are Django's to answer at the very path of the poll, by fastpoll's view.
    A Warning, not an Error: a site that picks its URLconf per request (``request.urlconf``:
    django-hosts, tenants) routes polls by another URLconf than ROOT_URLCONF, which no check sees."""
    config = _config()
    if config is None or not getattr(settings, "ROOT_URLCONF", None):
        return []                      # E001, or no URLconf at all (a project's library tests)
    if not conf.is_path_prefix(config["PATH_PREFIX"]) or commandline.setting_error("PATH_PREFIX", config):
        return []                      # E012 / E015 say what is wrong with it
    urlconf = settings.ROOT_URLCONF
    for path in _poll_paths(config["PATH_PREFIX"]):
        try:
            match = _resolve(path)
            if _is_poll_view(match):
                continue
            prefixed = _language_prefixed(path) if match is None else None
        except Exception:
            return []                  # the URLconf itself fails: Django says so at every request
        if prefixed is not None and _position(list(getattr(settings, "MIDDLEWARE", None) or ()),
                                              LOCALE_MIDDLEWARE) is not None:
            return [checks.Warning(
                f"The poll path {path} reaches fastpoll's poll view only as {prefixed}, under i18n_patterns in "
                f"ROOT_URLCONF ({urlconf}): mount fastpoll.urls outside i18n_patterns: each miss is a redirect "
                f"(LocaleMiddleware's) before Django answers it.",
                hint=f"Move path(\"\", include(\"fastpoll.urls\")) out of i18n_patterns(...) into {urlconf}'s "
                     f"plain urlpatterns.", id="fastpoll.W014")]
        if match is None:
            what = "does not resolve in ROOT_URLCONF"
            gets = "the site's 404 page"
        else:
            what = f"resolves to {match._func_path} in ROOT_URLCONF, not to fastpoll's poll view"
            gets = f"{match._func_path}'s answer, not a poll's"
        return [checks.Warning(
            f"The poll path {path} {what} ({urlconf}): a poll fastpath misses that Django routes by "
            f"ROOT_URLCONF gets {gets}, and fastpoll.js stops polling.",
            hint=f"Add path(\"\", include(\"fastpoll.urls\")) to {urlconf}'s urlpatterns (its paths start with "
                 f"PATH_PREFIX {config['PATH_PREFIX']!r}; not under another path). A site that picks its URLconf "
                 f"per request (request.urlconf: django-hosts, tenants) and mounts fastpoll.urls in those may "
                 f"silence this: SILENCED_SYSTEM_CHECKS = [\"fastpoll.W014\"].",
            id="fastpoll.W014")]
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


#: memcached's port when a LOCATION names none (pymemcache's and libmemcached's default)
MEMCACHED_PORT = 11211
_LOOPBACK = ("localhost", "::1")
#: what a flush_all of the cache does to the sessions of each engine that keeps them there
_SESSIONS_LOST = {
    "django.contrib.sessions.backends.cache": " and the sessions it holds (everyone logged out)",
    "django.contrib.sessions.backends.cached_db": " and the sessions' cached copies (they survive in the database: "
                                                  "each is read from it once more)",
}


def _server(spec):
    """A memcached address, normalised: ("unix", path) or (host, port), the loopback names one host."""
    spec = spec.strip()
    for scheme in ("unix://", "unix:"):
        if spec.startswith(scheme):
            return "unix", os.path.normpath(spec[len(scheme):])
    if spec.startswith("/"):
        return "unix", os.path.normpath(spec)
    try:
        host, port = parse_server(spec)
    except ValueError:
        host, port = spec, MEMCACHED_PORT
    host = host.strip("[]").lower()
    if host in _LOOPBACK or re.fullmatch(r"127(\.[0-9]{1,3}){3}", host):
        host = "loopback"
    return host, port


def _is_memcached(backend):
    """Django's memcached backends, or one of a module named after memcached (django_pylibmc's, ...)."""
    if not isinstance(backend, str):
        return False
    module, _, name = backend.rpartition(".")
    return "memcache" in module.lower() or name in ("PyMemcacheCache", "PyLibMCCache", "MemcachedCache")


def _locations(location):
    """The servers of a cache's LOCATION: a list, or a string of them split at ';' or ',' (Django's reading)."""
    if isinstance(location, str):
        location = re.split(r"[;,]", location)
    if not isinstance(location, (list, tuple)):
        return []
    return [entry for entry in location if isinstance(entry, str) and entry.strip()]


def check_shared_memcached(app_configs=None, **kwargs):
    """fastpoll's memcached servers are its own: its repair empties one that was away."""
    config = _config()
    servers = config["MEMCACHED_SERVERS"] if config is not None else None
    if not isinstance(servers, (list, tuple)):
        return []                      # E001 / E002
    ours = {_server(spec): spec for spec in servers if isinstance(spec, str)}
    caches = getattr(settings, "CACHES", None)
    warnings = []
    for alias, cache in (caches.items() if isinstance(caches, dict) else ()):
        backend = cache.get("BACKEND") if isinstance(cache, dict) else None
        if not _is_memcached(backend):
            continue
        shared = sorted({ours[_server(spec)] for spec in _locations(cache.get("LOCATION")) if _server(spec) in ours})
        if not shared:
            continue
        engine = getattr(settings, "SESSION_ENGINE", "")
        sessions = (_SESSIONS_LOST.get(engine, "") if isinstance(engine, str)
                    and getattr(settings, "SESSION_CACHE_ALIAS", "default") == alias else "")
        warnings.append(checks.Warning(
            f"FASTPOLL['MEMCACHED_SERVERS'] shares {', '.join(shared)} with CACHES[{alias!r}]: fastpoll's repair "
            f"empties a memcached server that was away (flush_all), and with it this cache{sessions}.",
            hint="Give fastpoll memcached servers of its own (another port or host); KEY_PREFIX does not keep a "
                 "flush_all off other keys.", id="fastpoll.W008"))
    return warnings


#: an outbox row is the repair service's once OUTBOX_GRACE old (its writer died or failed), and
#: paid by its next pass, every REPAIR_INTERVAL: one this many graces old has outlived them all
OUTBOX_AGE_GRACES = 10
#: a stale key is paid by the next pass (the service's, or a publish's quick one)
STALE_AGE_INTERVALS = 20


def _age(seconds):
    return f"{seconds:g} s"


def _debts(grace, interval):
    """(model, its timestamp field, now as that field is written, age past which a row is owed
    too long, what a row is, the bound's name): each table a repair pass pays."""
    stale_age, stale_bound = STALE_AGE_INTERVALS * interval, f"{STALE_AGE_INTERVALS} x REPAIR_INTERVAL"
    return (
        # the database stamps an outbox row (db_default=Now()): compare with its clock
        (PendingChange, "created", Now(), OUTBOX_AGE_GRACES * grace, "outbox change(s)",
         f"{OUTBOX_AGE_GRACES} x OUTBOX_GRACE"),
        (StaleKey, "since", timezone.now(), stale_age, "stale key(s)", stale_bound),
        (SuspectServer, "since", timezone.now(), stale_age, "memcached server(s) to flush", stale_bound),
    )


def check_repairer(app_configs=None, databases=None, **kwargs):
    """Debts no repair pass pays: ``manage.py repaircache --loop`` is not running (or cannot)."""
    config = _config()
    if not databases or config is None:
        return []                      # it queries: only when asked to (check --database)
    grace, interval = config["OUTBOX_GRACE"], config["REPAIR_INTERVAL"]
    if not (_is_positive_number(grace) and _is_positive_number(interval)):
        return []                      # E003
    owed = []
    try:
        for model, field, now, age, what, bound in _debts(grace, interval):
            if router.db_for_write(model) not in databases:
                continue
            count = model.objects.filter(**{f"{field}__lt": now - datetime.timedelta(seconds=age)}).count()
            if count:
                owed.append(f"{count} {what} older than {_age(age)} ({bound})")
    except DatabaseError:
        return []                      # fastpoll's tables are not migrated yet: migrate says so
    if not owed:
        return []
    return [checks.Warning(
        f"The database holds {' and '.join(owed)}: no repair pass has written their answers, so polls get stale "
        f"answers until CACHE_TTL. Is `manage.py repaircache --loop` running?",
        hint="Run `manage.py repaircache --loop` as a service beside Django (docs/consistency.md); if it runs, "
             "its log says what it cannot pay (a memcached server away).", id="fastpoll.W009")]


CHECKS = (check_urls, check_poll_middleware, check_shared_memcached)


def register_checks():
    """Register the checks above (``FastpollConfig.ready()`` calls this once)."""
    checks.register(check_urls, TAG, checks.Tags.urls)
    checks.register(check_poll_middleware, TAG, checks.Tags.compatibility)
    checks.register(check_shared_memcached, TAG, checks.Tags.caches)
    checks.register(check_repairer, TAG, checks.Tags.database, deploy=True)
