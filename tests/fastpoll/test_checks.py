"""System checks for settings.FASTPOLL: each problem has its own id, through the registry."""
import datetime
import io

import pytest
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.core import checks
from django.core.management import CommandError, call_command
from django.http import HttpResponse
from django.test import override_settings
from django.urls import include, path, re_path
from django.utils import timezone

from fastpoll import checks as fastpoll_checks
from fastpoll import checks_site, commandline, views
from fastpoll import resources as registry
from fastpoll.models import PendingChange, StaleKey, SuspectServer
from plurkcore import checks as plurk_checks

#: what a project's settings name besides the test settings' FASTPOLL (W003 wants a KEY_PREFIX)
GOOD_SERVERS = {"MEMCACHED_SERVERS": ["127.0.0.1:11211"], "KEY_PREFIX": "checks"}
PATH_MSG = ("FASTPOLL['PATH_PREFIX'] must be a path of one or more segments that starts and ends with / "
            "(such as '/Poll/'), at most 64 bytes, got {!r}.")
SERVERS_MSG = "FASTPOLL['MEMCACHED_SERVERS'] must be a non-empty list of 'host:port' strings, got {!r}."


def reported(tags=(fastpoll_checks.TAG,)):
    """What ``manage.py check`` reports of ``tags``: the messages SILENCED_SYSTEM_CHECKS does not
    name (the test settings' site silences fastpoll.W007)."""
    return [e for e in checks.run_checks(tags=list(tags)) if not e.is_silenced()]


def run(plurkcore=None, **overrides):
    """(id, message) of every plurkcore check result, run through Django's check registry."""
    if plurkcore is None:
        plurkcore = {**settings.FASTPOLL, **GOOD_SERVERS}
    with override_settings(FASTPOLL=plurkcore, **overrides):
        return sorted((e.id, e.msg) for e in reported([fastpoll_checks.TAG, "plurkcore"]))


@pytest.mark.parametrize("overrides,expected", [
    ({}, []),
    ({"NOPE": 1, "ALSO": 2}, [("fastpoll.W001", "FASTPOLL has unknown keys: ALSO, NOPE.")]),
    ({"MEMCACHED_SERVERS": []}, [("fastpoll.E002", SERVERS_MSG.format([]))]),
    ({"MEMCACHED_SERVERS": ["nohost"]}, [("fastpoll.E002", SERVERS_MSG.format(["nohost"]))]),
    ({"MEMCACHED_SERVERS": ["a:1", "a:1"]},
     [("fastpoll.E007", "FASTPOLL['MEMCACHED_SERVERS'] lists a server twice.")]),
    ({"MEMCACHED_TIMEOUT": 0, "REPAIR_INTERVAL": "1"},
     [("fastpoll.E003", "FASTPOLL['MEMCACHED_TIMEOUT'] must be a positive number of seconds, got 0."),
      ("fastpoll.E003", "FASTPOLL['REPAIR_INTERVAL'] must be a positive number of seconds, got '1'.")]),
    ({"MEMCACHED_TIMEOUT": 5},
     [("fastpoll.W002", "FASTPOLL['MEMCACHED_TIMEOUT'] is above one second: a dead memcached server "
                         "will slow every write down by that much.")]),
    ({"TOKEN_TTL": "1d", "BATCH_SIZE": True},
     [("fastpoll.E004", "FASTPOLL['BATCH_SIZE'] must be a positive integer, got True."),
      ("fastpoll.E004", "FASTPOLL['TOKEN_TTL'] must be a positive integer, got '1d'.")]),
    ({"CACHE_TTL": 40 * 24 * 3600},
     [("fastpoll.E008", "FASTPOLL['CACHE_TTL'] must be at most 30 days (memcached reads larger values "
                         "as a Unix timestamp).")]),
    ({"SECRET_FILE": None}, [("fastpoll.E005", "FASTPOLL['SECRET_FILE'] is not set.")]),
    ({"REVOKE_ON_LOGOUT": False}, []),
    ({"REVOKE_ON_LOGOUT": "no"},
     [("fastpoll.E014", "FASTPOLL['REVOKE_ON_LOGOUT'] must be True or False, got 'no'.")]),
    ({"COOKIE_NAME": "to k"},
     [("fastpoll.E012", "FASTPOLL['COOKIE_NAME'] must be 1-64 cookie-name characters (RFC 6265), got 'to k'.")]),
    ({"KEY_PREFIX": "p:1", "PATH_PREFIX": "Poll/"},
     [("fastpoll.E012", "FASTPOLL['KEY_PREFIX'] must be 1-16 of A-Z a-z 0-9 - _, got 'p:1'."),
      ("fastpoll.E012", PATH_MSG.format("Poll/"))]),
    # "/" would route the whole site to fastpath
    ({"PATH_PREFIX": "/"}, [("fastpoll.E012", PATH_MSG.format("/"))]),
    ({"PATH_PREFIX": "//"}, [("fastpoll.E012", PATH_MSG.format("//"))]),
    ({"NOTIFY_DIRS": ["/run/n"], "NOTIFY_BACKEND": "fastpoll.notify.NullNotifier"}, []),
    ({"NOTIFY_DIRS": [], "LONGPOLL_MAX_WAIT": 0}, []),                     # never holds: nothing to wake
    ({"NOTIFY_DIRS": [], "NOTIFY_UDP": ["10.77.0.21:9100"], "NOTIFY_BACKEND": "fastpoll.notify.UdpNotifier"}, []),
    ({"NOTIFY_DIRS": []},
     [("fastpoll.W004", "FASTPOLL['NOTIFY_DIRS'] is empty while LONGPOLL_MAX_WAIT (55) holds long-polls: a held "
                         "poll is answered only when fastpath re-reads its key (every 5 s), not at the commit.")]),
    ({"NOTIFY_DIRS": "/run/n"},
     [("fastpoll.E009", "FASTPOLL['NOTIFY_DIRS'] must be a list of directory paths, got '/run/n'.")]),
    ({"NOTIFY_DIRS": ["/run/n", ""]},
     [("fastpoll.E009", "FASTPOLL['NOTIFY_DIRS'] must be a list of directory paths, got ['/run/n', ''].")]),
    ({"NOTIFY_UDP": ["10.77.0.21:9100", "[::1]:9101"], "NOTIFY_BACKEND": "fastpoll.notify.UdpNotifier"}, []),
    ({"NOTIFY_UDP": "10.77.0.21:9100"},
     [("fastpoll.E011", "FASTPOLL['NOTIFY_UDP'] must be a list of host:port strings, got '10.77.0.21:9100'.")]),
    ({"NOTIFY_UDP": ["10.77.0.21:9100", "10.77.0.22"]},
     [("fastpoll.E011", "FASTPOLL['NOTIFY_UDP'] must be a list of host:port strings, got "
                         "['10.77.0.21:9100', '10.77.0.22'].")]),
    ({"NOTIFY_BACKEND": "fastpoll.notify.Nope"},
     [("fastpoll.E010", "FASTPOLL['NOTIFY_BACKEND'] must be the dotted path of a class, got "
                         "'fastpoll.notify.Nope'.")]),
    ({"NOTIFY_BACKEND": "fastpoll.notify.stats"},
     [("fastpoll.E010", "FASTPOLL['NOTIFY_BACKEND'] must be the dotted path of a class, got "
                         "'fastpoll.notify.stats'.")]),
])
def test_each_problem_has_its_id_and_message(overrides, expected):
    assert run({**settings.FASTPOLL, **GOOD_SERVERS, **overrides}) == expected


class PollsAtV2:
    """A project's URLconf that mounts fastpoll's poll view itself, at PATH_PREFIX /poll/v2/ (the
    test settings' URLconf mounts fastpoll.urls, read at /Poll/ when it was imported)."""
    urlpatterns = [re_path(r"^poll/v2/(?P<resource>[A-Za-z0-9_]{1,32})\Z", views.poll),
                   re_path(r"^poll/v2/(?P<resource>[A-Za-z0-9_]{1,32})/(?P<obj>[A-Za-z0-9_-]{1,64})\Z", views.poll)]


def test_other_names_are_no_problem():
    assert run({**settings.FASTPOLL, **GOOD_SERVERS, "COOKIE_NAME": "tok", "KEY_PREFIX": "k2",
                "PATH_PREFIX": "/poll/v2/"}, ROOT_URLCONF=PollsAtV2) == []


def not_the_poll(request, **kwargs):
    return HttpResponse("the site's page")


class NoPolls:
    urlpatterns = [path("admin/", admin.site.urls)]


class PollsUnderApi:
    """The reviewer's project: fastpoll.urls under api/, so /api/Poll/<name> while polls ask /Poll/<name>."""
    urlpatterns = [path("admin/", admin.site.urls), path("api/", include("fastpoll.urls"))]


class SiteFirst:
    """A catch-all of the site's before fastpoll.urls: /Poll/<name> is the site's page."""
    urlpatterns = [re_path(r"^(?P<page>.*)$", not_the_poll), path("", include("fastpoll.urls"))]


@pytest.mark.parametrize("urlconf, found, gets", [
    (NoPolls, "does not resolve in ROOT_URLCONF", "the site's 404 page"),
    (PollsUnderApi, "does not resolve in ROOT_URLCONF", "the site's 404 page"),
    (SiteFirst, "resolves to tests.fastpoll.test_checks.not_the_poll in ROOT_URLCONF, not to fastpoll's poll view",
     "tests.fastpoll.test_checks.not_the_poll's answer, not a poll's"),
], ids=["not-included", "under-api", "site-first"])
def test_a_urlconf_that_does_not_route_polls_to_fastpoll_is_a_warning(urlconf, found, gets):
    """A Warning, not an Error (which would stop migrate and runserver): a site that picks its
    URLconf per request (request.urlconf: django-hosts, tenants) routes polls by another URLconf
    than the one the check reads, and its hint says how to silence it."""
    name = sorted(registry.names(per="user"))[0]
    with override_settings(FASTPOLL={**settings.FASTPOLL, **GOOD_SERVERS}, ROOT_URLCONF=urlconf):
        [warning] = reported()
    assert warning.id == "fastpoll.W014" and warning.level == checks.WARNING
    assert warning.msg == (f"The poll path /Poll/{name} {found} ({urlconf}): a poll fastpath misses that Django "
                           f"routes by ROOT_URLCONF gets {gets}, and fastpoll.js stops polling.")
    assert warning.hint.startswith(f'Add path("", include("fastpoll.urls")) to {urlconf}\'s urlpatterns')
    assert warning.hint.endswith('(request.urlconf: django-hosts, tenants) and mounts fastpoll.urls in those may '
                                 'silence this: SILENCED_SYSTEM_CHECKS = ["fastpoll.W014"].')
    with override_settings(FASTPOLL={**settings.FASTPOLL, **GOOD_SERVERS}, ROOT_URLCONF=urlconf,
                           SILENCED_SYSTEM_CHECKS=[*settings.SILENCED_SYSTEM_CHECKS, "fastpoll.W014"]):
        assert reported() == []


def test_a_urlconf_that_routes_only_per_user_polls_is_a_warning():
    """A per-object poll is a path of its own (``<PATH_PREFIX><name>/<object>``)."""
    class UsersOnly:
        urlpatterns = PollsAtV2.urlpatterns[:1]

    with override_settings(FASTPOLL={**settings.FASTPOLL, **GOOD_SERVERS, "PATH_PREFIX": "/poll/v2/"},
                           ROOT_URLCONF=UsersOnly):
        [warning] = reported()
    assert warning.id == "fastpoll.W014"
    assert warning.msg.startswith(f"The poll path /poll/v2/{sorted(registry.names(per='object'))[0]}/0 does not "
                                  f"resolve")


LOCALE = "django.middleware.locale.LocaleMiddleware"


@pytest.mark.parametrize("prefix_default_language", [True, False])
@pytest.mark.parametrize("locale", [True, False], ids=["locale-middleware", "no-locale-middleware"])
def test_fastpoll_urls_under_i18n_patterns_is_named_for_what_a_miss_gets(prefix_default_language, locale):
    """Under i18n_patterns(prefix_default_language=True) LocaleMiddleware redirects a missed poll
    to /<language>/Poll/...: it does reach fastpoll's view, a redirect later (no 404 page).  Without
    LocaleMiddleware it is the site's 404; without the default language's prefix it resolves."""
    from django.conf.urls.i18n import i18n_patterns

    name = sorted(registry.names(per="user"))[0]
    middleware = [*settings.MIDDLEWARE, LOCALE] if locale else [m for m in settings.MIDDLEWARE if m != LOCALE]
    with override_settings(USE_I18N=True, LANGUAGE_CODE="en-us"):
        class InLanguages:
            urlpatterns = i18n_patterns(path("", include("fastpoll.urls")),
                                        prefix_default_language=prefix_default_language)

        with override_settings(FASTPOLL={**settings.FASTPOLL, **GOOD_SERVERS}, ROOT_URLCONF=InLanguages,
                               MIDDLEWARE=middleware):
            found = [(e.id, e.msg, e.hint) for e in reported()]
    if not prefix_default_language:
        assert found == []
    elif locale:
        assert found == [("fastpoll.W014",
                          f"The poll path /Poll/{name} reaches fastpoll's poll view only as /en-us/Poll/{name}, under "
                          f"i18n_patterns in ROOT_URLCONF ({InLanguages}): mount fastpoll.urls outside i18n_patterns: "
                          f"each miss is a redirect (LocaleMiddleware's) before Django answers it.",
                          f'Move path("", include("fastpoll.urls")) out of i18n_patterns(...) into {InLanguages}\'s '
                          f'plain urlpatterns.')]
    else:
        [(check_id, msg, _)] = found
        assert check_id == "fastpoll.W014" and "does not resolve in ROOT_URLCONF" in msg and "404" in msg


def test_no_urlconf_is_no_url_error():
    """A project's library tests may run without any URLconf: nothing to route then."""
    with override_settings(FASTPOLL={**settings.FASTPOLL, **GOOD_SERVERS}):
        del settings.ROOT_URLCONF
        assert reported() == []


PYMEMCACHE = "django.core.cache.backends.memcached.PyMemcacheCache"
SHARED_MSG = ("FASTPOLL['MEMCACHED_SERVERS'] shares 127.0.0.1:11211 with CACHES['default']: fastpoll's repair empties "
              "a memcached server that was away (flush_all), and with it this cache{}.")


@pytest.mark.parametrize("caches, sessions, message", [
    ({"BACKEND": PYMEMCACHE, "LOCATION": "127.0.0.1:11211"}, False, SHARED_MSG.format("")),
    ({"BACKEND": PYMEMCACHE, "LOCATION": "127.0.0.1:11211"}, "cache",
     SHARED_MSG.format(" and the sessions it holds (everyone logged out)")),
    ({"BACKEND": PYMEMCACHE, "LOCATION": "127.0.0.1:11211"}, "cached_db",
     SHARED_MSG.format(" and the sessions' cached copies (they survive in the database: each is read from it once "
                       "more)")),
    ({"BACKEND": "django.core.cache.backends.memcached.PyLibMCCache", "LOCATION": "localhost:11211"}, False,
     SHARED_MSG.format("")),
    ({"BACKEND": PYMEMCACHE, "LOCATION": "127.0.0.1"}, False, SHARED_MSG.format("")),     # memcached's port
    ({"BACKEND": PYMEMCACHE, "LOCATION": ["10.0.0.7:11211", "[::1]:11211"]}, False, SHARED_MSG.format("")),
    ({"BACKEND": PYMEMCACHE, "LOCATION": "10.0.0.7:11211;127.0.0.1:11211"}, False, SHARED_MSG.format("")),
    ({"BACKEND": PYMEMCACHE, "LOCATION": "127.0.0.1:11212"}, "cache", None),
    ({"BACKEND": PYMEMCACHE, "LOCATION": "unix:/run/memcached.sock"}, False, None),
    ({"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "127.0.0.1:11211"}, False, None),
], ids=["same", "sessions", "cached-db-sessions", "localhost", "no-port", "list", "string-list", "other-port", "unix", "not-memcached"])
def test_a_memcached_shared_with_the_sites_cache_is_warned_of(caches, sessions, message):
    """fastpoll's repair flushes a server that was away: a cache (or the sessions) on it go too;
    cached_db sessions lose only their cached copies."""
    engine = f"django.contrib.sessions.backends.{sessions or 'db'}"
    with override_settings(FASTPOLL={**settings.FASTPOLL, **GOOD_SERVERS}, CACHES={"default": caches},
                           SESSION_ENGINE=engine):
        found = [(e.id, e.msg, e.hint) for e in reported()]
    if message is None:
        assert found == []
    else:
        assert found == [("fastpoll.W008", message, "Give fastpoll memcached servers of its own (another port or "
                                                    "host); KEY_PREFIX does not keep a flush_all off other keys.")]


def w009(databases=("default",)):
    return [e for e in checks.run_checks(tags=[fastpoll_checks.TAG], include_deployment_checks=True,
                                         databases=databases) if e.id == "fastpoll.W009"]


@pytest.mark.django_db
def test_debts_no_repair_pass_paid_ask_whether_the_repairer_runs():
    """The outbox's rows older than 10 graces and stale keys older than 20 repair intervals are
    what a running ``repaircache --loop`` would have paid; fresh ones are its next pass's."""
    now = timezone.now()
    with override_settings(FASTPOLL={**settings.FASTPOLL, **GOOD_SERVERS, "OUTBOX_GRACE": 3, "REPAIR_INTERVAL": 2}):
        PendingChange.objects.create(change="{}")
        StaleKey.objects.create(key="checks:getMessages:1:0", since=now - datetime.timedelta(seconds=39))
        assert w009() == []                                  # young debts: the next pass pays them
        old = PendingChange.objects.create(change="{}")
        PendingChange.objects.filter(pk=old.pk).update(created=now - datetime.timedelta(seconds=31))
        [warning] = w009()
        assert warning.level == checks.WARNING
        assert warning.msg == ("The database holds 1 outbox change(s) older than 30 s (10 x OUTBOX_GRACE): no repair "
                               "pass has written their answers, so polls get stale answers until CACHE_TTL. Is "
                               "`manage.py repaircache --loop` running?")
        assert "`manage.py repaircache --loop` as a service" in warning.hint
        StaleKey.objects.create(key="checks:getMessages:2:0", since=now - datetime.timedelta(seconds=41))
        [warning] = w009()
        assert warning.msg.startswith("The database holds 1 outbox change(s) older than 30 s (10 x OUTBOX_GRACE) and "
                                      "1 stale key(s) older than 40 s (20 x REPAIR_INTERVAL): ")
        # a memcached server a write failed on, which no repair pass has flushed since
        StaleKey.objects.all().delete()
        PendingChange.objects.all().delete()
        SuspectServer.objects.create(server="127.0.0.1:11211", since=now - datetime.timedelta(seconds=39))
        assert w009() == []
        SuspectServer.objects.create(server="127.0.0.1:11212", since=now - datetime.timedelta(seconds=41))
        [warning] = w009()
        assert warning.msg.startswith("The database holds 1 memcached server(s) to flush older than 40 s (20 x "
                                      "REPAIR_INTERVAL): no repair pass")
        # it queries: only `check --database <alias>` runs it, and only a deployment check
        assert w009(databases=None) == []
        assert [e for e in checks.run_checks(tags=[fastpoll_checks.TAG], databases=["default"])
                if e.id == "fastpoll.W009"] == []


def test_a_missing_key_prefix_is_warned_of_with_the_fix():
    """The default prefix is every site's: two sites (or a site and its tests) on one memcached
    would serve each other's answers.  Setting it, even to the default's value, is a choice."""
    without = {k: v for k, v in {**settings.FASTPOLL, **GOOD_SERVERS}.items() if k != "KEY_PREFIX"}
    with override_settings(FASTPOLL=without):
        [warning] = reported()
    assert warning.id == "fastpoll.W003" and warning.level == checks.WARNING
    assert warning.msg.startswith("FASTPOLL['KEY_PREFIX'] is not set: every site using the default ('p1')")
    assert warning.hint == ("Set FASTPOLL['KEY_PREFIX'] to a name of this site (1-16 of A-Z a-z 0-9 - _), "
                            "and a different one in the settings your tests run with.")
    assert run({**without, "KEY_PREFIX": "p1"}) == []


def test_no_notice_directory_hint_names_the_setting():
    with override_settings(FASTPOLL={**settings.FASTPOLL, **GOOD_SERVERS, "NOTIFY_DIRS": []}):
        [warning] = reported()
    assert warning.level == checks.WARNING and warning.hint == (
        "Set FASTPOLL['NOTIFY_DIRS'] to [the directory of fastpath's notice sockets] (fastpoll_fastpath passes "
        "it as --notify-dir), or LONGPOLL_MAX_WAIT to 0 to never hold.")


#: a value of each setting only the renderers read that they refuse, and the line they refuse it with
RENDERED_BAD = [
    ("FASTPATH_ADDRESS", "localhost", "FASTPOLL['FASTPATH_ADDRESS'] = 'localhost': expected host:port, [v6]:port "
                                      "or unix:/path, for example 127.0.0.1:8001"),
    ("FASTPATH_ADDRESS", "unix:run/fp.sock", "FASTPOLL['FASTPATH_ADDRESS'] = 'unix:run/fp.sock': give "
                                             "unix:/absolute/path (nginx and fastpath resolve a relative one differently)"),
    ("FASTPATH_ADMIN", "10.0.0.1:8002", "FASTPOLL['FASTPATH_ADMIN']: fastpath --admin 10.0.0.1:8002 must be a "
                                        "loopback address (stats are not public)"),
    ("FASTPATH_WORKERS", 999, "FASTPOLL['FASTPATH_WORKERS']: fastpath --workers must be in 0..256, got 999"),
    ("FASTPATH_IDLE_TIMEOUT", 0, "FASTPOLL['FASTPATH_IDLE_TIMEOUT'] must be a whole number from 1 to 3600, got 0"),
    ("LONGPOLL_MAX_WAIT", "55", "FASTPOLL['LONGPOLL_MAX_WAIT'] must be a whole number from 0 to 86400, got '55'"),
    ("STREAM_HEARTBEAT", 0, "FASTPOLL['STREAM_HEARTBEAT'] must be a whole number from 1 to 3600, got 0"),
    ("STREAM_MAX", 0, "FASTPOLL['STREAM_MAX']: fastpath --max-stream must be in 1..86400, got 0"),
    ("DJANGO_UPSTREAM", "127.0.0.1:8000; deny all", "FASTPOLL['DJANGO_UPSTREAM'] = '127.0.0.1:8000; deny all': give "
                                                    "what follows http:// in proxy_pass: an upstream name, host:port or "
                                                    "unix:/path:"),
    ("NGINX_NAME", "My App", "FASTPOLL['NGINX_NAME'] must be 1-32 of a-z 0-9 _, got 'My App'"),
    ("NGINX_UPSTREAM_KEEPALIVE", 0, "FASTPOLL['NGINX_UPSTREAM_KEEPALIVE'] must be a whole number from 1 to 1048576, "
                                    "got 0"),
    ("MEMCACHED_TIMEOUT", 120, "FASTPOLL['MEMCACHED_TIMEOUT'] must be seconds in (0, 60], got 120"),
    # E012's rule takes it, fastpath's does not
    ("PATH_PREFIX", "/a!b/", "FASTPOLL['PATH_PREFIX']: fastpath bad --path-prefix '/a!b/': at most 64 characters, "
                             "starting and ending with /, one or more segments of letters, digits, . _ ~ - (not . or ..), "
                             "for example /Poll/ (not / alone: the whole site would be polls)"),
]


@pytest.mark.parametrize("key, value, line", RENDERED_BAD, ids=[f"{k}={v!r}" for k, v, _ in RENDERED_BAD])
def test_check_refuses_what_the_renderers_refuse_with_their_line(key, value, line):
    """fastpoll.E015: `check` reports the settings only fastpoll_nginx / fastpoll_fastpath read,
    in the words those commands use (one function judges both: commandline.setting_error)."""
    config = {**settings.FASTPOLL, **GOOD_SERVERS, key: value}
    with override_settings(FASTPOLL=config):
        found = [(e.id, e.msg, e.hint) for e in reported() if e.level >= checks.ERROR]
        assert [f[:2] for f in found] == [("fastpoll.E015", line + ".")]
        assert found[0][2] == f"For example {fastpoll_checks._RENDERED_EXAMPLES[key]}."
        with pytest.raises(CommandError) as refused:
            try:
                call_command("fastpoll_nginx", stdout=io.StringIO())
            except CommandError as exc:
                assert str(exc) == line
                raise
            call_command("fastpoll_fastpath", stdout=io.StringIO())
        assert str(refused.value) == line


def test_every_bad_rendered_setting_is_reported_at_once():
    bad = {key: value for key, value, _ in RENDERED_BAD[2:8]}
    found = run({**settings.FASTPOLL, **GOOD_SERVERS, **bad})
    assert [i for i, _ in found] == ["fastpoll.E015"] * len(bad)
    assert {m.split("]")[0] + "]" for _, m in found} == {f"FASTPOLL['{k}']" for k in bad}
    assert set(commandline.RENDERED_SETTINGS) == {key for key, _, _ in RENDERED_BAD}


def test_a_value_another_check_refuses_is_not_reported_twice():
    assert [i for i, _ in run({**settings.FASTPOLL, **GOOD_SERVERS, "MEMCACHED_TIMEOUT": -1})] == ["fastpoll.E003"]
    assert [i for i, _ in run({**settings.FASTPOLL, **GOOD_SERVERS, "PATH_PREFIX": "/"})] == ["fastpoll.E012"]


def test_unreadable_secret_file():
    [(check_id, message)] = run({**settings.FASTPOLL, **GOOD_SERVERS, "SECRET_FILE": "/nonexistent/secret"})
    assert check_id == "fastpoll.E006" and "/nonexistent/secret" in message


@pytest.mark.parametrize("value", [["x"], [], "MEMCACHED_SERVERS"])
def test_not_a_dict_is_the_only_problem_reported(value):
    assert run(value) == [("fastpoll.E001", "FASTPOLL must be a dict.")]


def test_csrf_middleware_missing():
    middleware = [m for m in settings.MIDDLEWARE if m != "django.middleware.csrf.CsrfViewMiddleware"]
    assert run(MIDDLEWARE=middleware) == [
        ("plurkcore.W004", "CsrfViewMiddleware is not installed: signup/login cannot set the csrftoken cookie.")]


def test_every_check_is_registered():
    registered = checks.registry.registry.get_checks()
    assert all(check in registered for check in fastpoll_checks.CHECKS)
    assert all(check in registered for check in checks_site.CHECKS)
    # a plain `manage.py check` (no tags) runs them
    with override_settings(FASTPOLL={**settings.FASTPOLL, **GOOD_SERVERS, "MEMCACHED_TIMEOUT": -1}):
        assert "fastpoll.E003" in {e.id for e in checks.run_checks()}


SESSIONS = "django.contrib.sessions.middleware.SessionMiddleware"
AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"
POLL = "fastpoll.middleware.PollTokenMiddleware"


class SiteAuthenticationMiddleware(AuthenticationMiddleware):
    """A project's own authentication middleware, a subclass of Django's (counts as it)."""


@pytest.mark.parametrize("middleware, expected", [
    ([SESSIONS, AUTH, POLL], []),
    # no poll middleware: session users get no poll cookie (a warning: a site that hands out tokens itself
    # silences it, as the test settings' site does)
    ([SESSIONS, AUTH],
     [("fastpoll.W007", f"MIDDLEWARE has AuthenticationMiddleware (with django.contrib.sessions) but not {POLL}: a "
                        f"user logged in with Django's sessions gets no poll cookie, so every poll of theirs is 401.",
       f"Add '{POLL}' to MIDDLEWARE after '{AUTH}'; a site whose clients poll only with tokens it hands out itself "
       f"(fastpoll.issue_token) silences this: SILENCED_SYSTEM_CHECKS = [\"fastpoll.W007\"].")]),
    ([SESSIONS], []),                           # no authentication middleware: no session users
    ([SESSIONS, POLL, AUTH],
     [("fastpoll.E013", f"{POLL} is listed before {AUTH} in MIDDLEWARE.", f"Move '{POLL}' after '{AUTH}'.")]),
    ([POLL, SESSIONS, AUTH],
     [("fastpoll.E013", f"{POLL} is listed before {AUTH} in MIDDLEWARE.", f"Move '{POLL}' after '{AUTH}'."),
      ("fastpoll.E013", f"{POLL} is listed before {SESSIONS} in MIDDLEWARE.", f"Move '{POLL}' after '{SESSIONS}'.")]),
    ([SESSIONS, POLL],
     [("fastpoll.E013", f"{POLL} needs {AUTH}, which MIDDLEWARE does not list.",
       f"Add '{AUTH}' to MIDDLEWARE before '{POLL}', or remove the latter.")]),
    ([AUTH, POLL],
     [("fastpoll.E013", f"{POLL} needs {SESSIONS}, which MIDDLEWARE does not list.",
       f"Add '{SESSIONS}' to MIDDLEWARE before '{POLL}', or remove the latter.")]),
    ([SESSIONS, "tests.fastpoll.test_checks.SiteAuthenticationMiddleware", POLL], []),
])
def test_the_poll_middleware_comes_after_sessions_and_authentication(middleware, expected):
    with override_settings(MIDDLEWARE=middleware, FASTPOLL={**settings.FASTPOLL, **GOOD_SERVERS}):
        found = [(e.id, e.msg, e.hint) for e in checks.run_checks(tags=[fastpoll_checks.TAG])]
    assert sorted(found) == sorted(expected)
