"""System checks for ``settings.FASTPOLL``: one function per concern, one id per problem.  The
table lists every fastpoll id, those of fastpoll/checks_site.py (the URLconf, MIDDLEWARE, CACHES
and the repairer) and fastpoll/checks_fastpath.py (the running fastpath) too.

| id | problem |
|---|---|
| E001 | FASTPOLL is not a dict |
| W001 | FASTPOLL has unknown keys |
| E002 | MEMCACHED_SERVERS is not a non-empty list of host:port strings |
| E007 | MEMCACHED_SERVERS lists a server twice |
| E003 | a duration (MEMCACHED_TIMEOUT, MEMCACHED_RETRY_INTERVAL, REPAIR_INTERVAL, OUTBOX_GRACE) is not positive |
| W002 | MEMCACHED_TIMEOUT is above one second |
| E004 | a count or size (TOKEN_TTL, CACHE_TTL, CAS_ATTEMPTS, BATCH_SIZE, FANOUT_IN_REQUEST, CAPABILITY_TTL) is not a positive integer |
| E008 | CACHE_TTL is above 30 days |
| E005 | SECRET_FILE is not set |
| E006 | SECRET_FILE cannot be read as a secret |
| E012 | COOKIE_NAME, KEY_PREFIX or PATH_PREFIX is not one fastpath can take |
| W008 | a MEMCACHED_SERVERS server is the LOCATION of a memcached cache of CACHES: the repair's flush_all empties it (fastpoll/checks_site.py) |
| W009 | outbox rows older than 10 x OUTBOX_GRACE, or stale keys or suspect memcached servers (never flushed) older than 20 x REPAIR_INTERVAL: is `repaircache --loop` running? (`check --deploy --database default`; fastpoll/checks_site.py) |
| W014 | `<PATH_PREFIX><resource>` does not resolve to fastpoll's poll view in ROOT_URLCONF (`fastpoll.urls` not included, under another path, or under i18n_patterns: each miss a redirect); silence it on a site that picks its URLconf per request (request.urlconf; fastpoll/checks_site.py) |
| E019 | retired: was W014's problem as an Error, which blocked migrate and runserver on sites it misjudged (request.urlconf, i18n_patterns); never reported |
| W010 | a running fastpath does not serve a registered resource, per-user or per-object (`check --deploy`; fastpoll/checks_fastpath.py) |
| W011 | a running fastpath refuses a token signed with SECRET_FILE's secret (401 bad signature: another --secret-file; `check --deploy`) |
| W012 | a running fastpath does not read the cookie COOKIE_NAME (401 authentication required: another --cookie-name; `check --deploy`) |
| W013 | a running fastpath does not serve an answer Django wrote (404 MISS: another --key-prefix or --memcached; `check --deploy`) |
| E009 | NOTIFY_DIRS is not a list of non-empty directory paths |
| E010 | NOTIFY_BACKEND is not the dotted path of an importable class |
| E011 | NOTIFY_UDP is not a list of host:port strings |
| E013 | PollTokenMiddleware is listed before AuthenticationMiddleware, or without it or SessionMiddleware |
| W007 | sessions and AuthenticationMiddleware without PollTokenMiddleware: session users get no poll cookie (silence it on a site that hands out tokens itself; fastpoll/checks_site.py) |
| E014 | a switch (REVOKE_ON_LOGOUT) is not True or False |
| E015 | a setting fastpoll_nginx or fastpoll_fastpath cannot render (FASTPATH_*, LONGPOLL_MAX_WAIT, DJANGO_UPSTREAM, NGINX_*, ...; fastpoll/commandline.py RENDERED_SETTINGS) |
| E016 | an edge setting (EDGE_ADDRESS, EDGE_URL, EDGE_ORIGINS, EDGE_MAX_*, MAX_HELD_PER_USER, EDGE_HEADER_TIMEOUT) is not valid, alone or with the others (fastpoll_fastpath refuses it with the same line) |
| E017 | COOKIE_DOMAIN is not None or a domain name, or the poll cookie's Domain (COOKIE_DOMAIN, else SESSION_COOKIE_DOMAIN) is a single label ('.com') |
| E018 | with an edge: the poll cookie's Domain does not cover the host of an EDGE_ORIGINS page (a browser drops it there) |
| W006 | with an edge: the poll cookie set on an EDGE_ORIGINS page's host is not sent to the edge's host (host-only on another host, or a Domain without it) |
| W005 | the edge listens on a non-loopback address with no per-user cap (MAX_HELD_PER_USER 0) |
| W003 | KEY_PREFIX is not set: every site (and test suite) on the same memcached shares the default's keys |
| W004 | NOTIFY_DIRS (and NOTIFY_UDP) is empty while LONGPOLL_MAX_WAIT holds polls: they wake only on fastpath's re-read |

When FASTPOLL is not a dict only E001 is reported: the other checks would judge the defaults.
"""
import numbers
import os
import re
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string
from fastpath.options import is_loopback, parse_address

from . import commandline, conf, keys
from .edge import loopback_edge_host
from .cache import parse_server
from .notify import parse_udp_destination
from .secret import SecretFileError, read_secret

TAG = "fastpoll"

DURATIONS = ("MEMCACHED_TIMEOUT", "MEMCACHED_RETRY_INTERVAL", "REPAIR_INTERVAL", "OUTBOX_GRACE")
SWITCHES = ("REVOKE_ON_LOGOUT",)
COUNTS = ("TOKEN_TTL", "CACHE_TTL", "CAS_ATTEMPTS", "BATCH_SIZE", "FANOUT_IN_REQUEST", "CAPABILITY_TTL")
MAX_CACHE_TTL = 30 * 24 * 3600     # memcached reads a larger expiry as a Unix timestamp


def _malformed():
    user = getattr(settings, "FASTPOLL", None)
    return user is not None and not isinstance(user, dict)


def _of_config(check):
    """Register-ready ``check(config)``: run on the effective configuration, and not at all when
    FASTPOLL itself is malformed (E001 says it all; the defaults are not what was meant)."""
    def run(app_configs=None, **kwargs):
        return [] if _malformed() else check(conf.get_config())

    # not functools.wraps: Django checks the signature, which __wrapped__ would hide
    run.__name__, run.__qualname__, run.__doc__ = check.__name__, check.__qualname__, check.__doc__
    return run


def _is_positive_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0


def _is_positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _each_must_be(config, names, valid, what, check_id, above=None):
    """One error ``check_id`` per setting of ``names`` whose value ``valid`` refuses ("must be
    ``what``, got" the value); ``above`` = (name, limit, message) adds ``message`` when that
    setting is valid and above ``limit``."""
    errors = [checks.Error(f"FASTPOLL['{name}'] must be {what}, got {config[name]!r}.", id=check_id)
              for name in names if not valid(config[name])]
    if above is not None:
        name, limit, message = above
        if valid(config[name]) and config[name] > limit:
            errors.append(message)
    return errors


def check_type(app_configs=None, **kwargs):
    if _malformed():
        return [checks.Error("FASTPOLL must be a dict.", hint="See DEFAULTS in fastpoll/conf.py.",
                             id="fastpoll.E001")]
    unknown = sorted(set(getattr(settings, "FASTPOLL", None) or {}) - set(conf.DEFAULTS))
    if unknown:
        return [checks.Warning(f"FASTPOLL has unknown keys: {', '.join(unknown)}.",
                               hint="Check the spelling against fastpoll.conf.DEFAULTS.",
                               id="fastpoll.W001")]
    return []


@_of_config
def check_memcached_servers(config):
    servers = config["MEMCACHED_SERVERS"]
    if (not isinstance(servers, (list, tuple)) or not servers
            or not all(isinstance(s, str) and _valid_server(s) for s in servers)):
        return [checks.Error(f"FASTPOLL['MEMCACHED_SERVERS'] must be a non-empty list of 'host:port' "
                             f"strings, got {servers!r}.", id="fastpoll.E002")]
    if len(set(servers)) != len(servers):
        return [checks.Error("FASTPOLL['MEMCACHED_SERVERS'] lists a server twice.", id="fastpoll.E007")]
    return []


@_of_config
def check_durations(config):
    return _each_must_be(config, DURATIONS, _is_positive_number, "a positive number of seconds",
                         "fastpoll.E003", above=("MEMCACHED_TIMEOUT", 1, checks.Warning(
                             "FASTPOLL['MEMCACHED_TIMEOUT'] is above one second: a dead memcached "
                             "server will slow every write down by that much.", id="fastpoll.W002")))


@_of_config
def check_counts(config):
    return _each_must_be(config, COUNTS, _is_positive_int, "a positive integer", "fastpoll.E004",
                         above=("CACHE_TTL", MAX_CACHE_TTL, checks.Error(
                             "FASTPOLL['CACHE_TTL'] must be at most 30 days (memcached reads larger "
                             "values as a Unix timestamp).", id="fastpoll.E008")))


@_of_config
def check_switches(config):
    return _each_must_be(config, SWITCHES, lambda value: isinstance(value, bool), "True or False",
                         "fastpoll.E014")


@_of_config
def check_secret_file(config):
    path = config["SECRET_FILE"]
    if not path or not isinstance(path, str):
        return [checks.Error("FASTPOLL['SECRET_FILE'] is not set.",
                             hint="Set it to the path of the secret shared with fastpath, then create the "
                                  "file with `manage.py fastpoll_secret`.", id="fastpoll.E005")]
    try:
        read_secret(path)
    except SecretFileError as exc:
        hint = ("Create it with `manage.py fastpoll_secret`, and give fastpath the same file."
                if not os.path.lexists(path) else
                "Make it readable by this user, or write a new secret with `manage.py fastpoll_secret "
                "--force` (every poll token signed with the old one stops working).")
        return [checks.Error(str(exc), hint=hint, id="fastpoll.E006")]
    return []


#: what fastpath takes (fastpath/options.py): a cookie name of RFC 6265 token characters (the
#: path: conf.PATH_PREFIX_RE)
_COOKIE_RE = re.compile(r"\A[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,64}\Z")


@_of_config
def check_names(config):
    errors = []
    for name, valid, what in (("COOKIE_NAME", _COOKIE_RE, "1-64 cookie-name characters (RFC 6265)"),
                              ("KEY_PREFIX", keys.PREFIX_RE, "1-16 of A-Z a-z 0-9 - _"),
                              ("PATH_PREFIX", conf.PATH_PREFIX_RE, conf.PATH_PREFIX_RULE)):
        value = config[name]
        if not isinstance(value, str) or valid.match(value) is None or len(value) > 64:
            errors.append(checks.Error(f"FASTPOLL['{name}'] must be {what}, got {value!r}.", id="fastpoll.E012"))
    return errors


def check_key_prefix(app_configs=None, **kwargs):
    """Two projects, or a project and its own test run, on one memcached with the default prefix
    read and overwrite each other's answers (user 1 of one is user 1 of the other), silently."""
    user = getattr(settings, "FASTPOLL", None)
    if not isinstance(user, dict) or "KEY_PREFIX" in user:
        return []
    return [checks.Warning(
        f"FASTPOLL['KEY_PREFIX'] is not set: every site using the default ({conf.DEFAULTS['KEY_PREFIX']!r}) "
        f"on the same memcached serves and overwrites this site's answers.",
        hint="Set FASTPOLL['KEY_PREFIX'] to a name of this site (1-16 of A-Z a-z 0-9 - _), and a different "
             "one in the settings your tests run with.", id="fastpoll.W003")]


@_of_config
def check_notify(config):
    errors = []
    dirs = config["NOTIFY_DIRS"]
    if not isinstance(dirs, (list, tuple)) or not all(isinstance(d, str) and d for d in dirs):
        errors.append(checks.Error(f"FASTPOLL['NOTIFY_DIRS'] must be a list of directory paths, got {dirs!r}.",
                                   hint="fastpath's --notify-dir; [] sends no notices.", id="fastpoll.E009"))
    udp = config["NOTIFY_UDP"]
    try:
        if not isinstance(udp, (list, tuple)) or not all(isinstance(d, str) for d in udp):
            raise ValueError
        for entry in udp:
            parse_udp_destination(entry)
    except ValueError:
        errors.append(checks.Error(f"FASTPOLL['NOTIFY_UDP'] must be a list of host:port strings, got {udp!r}.",
                                   hint="One entry per fastpath worker port (--notify-udp); [] sends none.",
                                   id="fastpoll.E011"))
    wait = config["LONGPOLL_MAX_WAIT"]
    if isinstance(dirs, (list, tuple)) and not dirs and isinstance(udp, (list, tuple)) and not udp \
            and _is_positive_int(wait):
        # nothing tells fastpath of a commit: a held poll sees it at its next re-read (5 s)
        errors.append(checks.Warning(
            f"FASTPOLL['NOTIFY_DIRS'] is empty while LONGPOLL_MAX_WAIT ({wait}) holds long-polls: a held "
            f"poll is answered only when fastpath re-reads its key (every 5 s), not at the commit.",
            hint="Set FASTPOLL['NOTIFY_DIRS'] to [the directory of fastpath's notice sockets] "
                 "(fastpoll_fastpath passes it as --notify-dir), or LONGPOLL_MAX_WAIT to 0 to never hold.",
            id="fastpoll.W004"))
    backend = config["NOTIFY_BACKEND"]
    try:
        if not isinstance(backend, str):
            raise ImportError
        ok = isinstance(import_string(backend), type)
    except ImportError:
        ok = False
    if not ok:
        errors.append(checks.Error(f"FASTPOLL['NOTIFY_BACKEND'] must be the dotted path of a class, got "
                                   f"{backend!r}.", hint="The default is fastpoll.notify.UnixDatagramNotifier.",
                                   id="fastpoll.E010"))
    return errors


#: the example E015's hint gives of each rendered setting
_RENDERED_EXAMPLES = {
    "FASTPATH_ADDRESS": "'127.0.0.1:8001' or 'unix:/run/myproject/fastpath.sock'",
    "FASTPATH_ADMIN": "None or a loopback '127.0.0.1:8002'",
    "FASTPATH_WORKERS": "0 (one per CPU) to 256",
    "FASTPATH_IDLE_TIMEOUT": "10 (seconds, 1 to 3600)",
    "LONGPOLL_MAX_WAIT": "55 (seconds, 0 to 86400; 0 never holds)",
    "STREAM_HEARTBEAT": "25 (seconds, 1 to 3600)",
    "STREAM_MAX": "300 (seconds, 1 to 86400)",
    "DJANGO_UPSTREAM": "'127.0.0.1:8000', 'unix:/run/myproject/gunicorn.sock:' or an upstream name",
    "NGINX_NAME": "'fastpoll' (1-32 of a-z 0-9 _)",
    "NGINX_UPSTREAM_KEEPALIVE": "512",
    "MEMCACHED_TIMEOUT": "0.05 (seconds, at most 60)",
    "PATH_PREFIX": "'/Poll/'",
}
#: keys another check judges first: E015 says nothing of a value that check already refuses
_JUDGED_FIRST = {"MEMCACHED_TIMEOUT": _is_positive_number, "PATH_PREFIX": conf.is_path_prefix}


@_of_config
def check_rendered(config):
    """The settings only fastpath's command line and nginx's include use, judged by the very
    code of ``fastpoll_fastpath`` and ``fastpoll_nginx`` (commandline.setting_error), one by one."""
    errors = []
    for key in commandline.RENDERED_SETTINGS:
        if key in _JUDGED_FIRST and not _JUDGED_FIRST[key](config[key]):
            continue
        message = commandline.setting_error(key, config)
        if message is not None:
            errors.append(checks.Error(
                message if message.endswith(".") else message + ".",
                hint=f"For example {_RENDERED_EXAMPLES[key]}.",
                id="fastpoll.E015"))
    return errors


#: the example E016's hint gives of each edge setting
_EDGE_EXAMPLES = {
    "EDGE_ADDRESS": "None (no edge), '127.0.0.1:8003' or '0.0.0.0:8443' behind a TCP load balancer",
    "EDGE_URL": "None (derived for a loopback EDGE_ADDRESS) or 'https://poll.example.com'",
    "EDGE_ORIGINS": "['https://www.example.com']",
    "EDGE_MAX_CONNECTIONS": "2048 (1 to 1048576)",
    "EDGE_MAX_PER_ADDRESS": "64 (0: no cap)",
    "EDGE_MAX_CONNS_PER_ADDRESS": "None (twice EDGE_MAX_PER_ADDRESS) or 128 (0: no cap)",
    "MAX_HELD_PER_USER": "32 (0: no cap)",
    "EDGE_HEADER_TIMEOUT": "10 (seconds, 1 to 3600)",
}
_EDGE_HINT = "See \"The edge\" in docs/deploy.md."


@_of_config
def check_edge(config):
    """The edge settings, each alone by the very code of ``fastpoll_fastpath``
    (commandline.setting_error), then together (commandline.edge_error)."""
    errors = []
    for key in conf.EDGE_SETTINGS:
        message = commandline.setting_error(key, config)
        if message is not None:
            errors.append(checks.Error(message if message.endswith(".") else message + ".",
                                       hint=f"For example {_EDGE_EXAMPLES[key]}.", id="fastpoll.E016"))
    if errors:
        return errors
    message = commandline.edge_error(config)
    if message is not None:
        return [checks.Error(message + ".", hint=_EDGE_HINT, id="fastpoll.E016")]
    edge = config["EDGE_ADDRESS"]
    if edge is not None and not is_loopback(parse_address(edge)[0]) and config["MAX_HELD_PER_USER"] == 0:
        errors.append(checks.Warning(
            f"FASTPOLL['EDGE_ADDRESS'] = {edge!r} is not loopback and MAX_HELD_PER_USER is 0: one user's token "
            f"may hold as many long-polls as the edge's connections.",
            hint="Set FASTPOLL['MAX_HELD_PER_USER'] to a cap such as 32 (fastpath --max-held-per-user).",
            id="fastpoll.W005"))
    return errors


#: a cookie Domain attribute: a host name, an optional leading dot (RFC 6265 ignores it)
_DOMAIN_RE = re.compile(r"\A\.?(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\Z")


def _domain_match(host, domain):
    """A browser sends (and keeps) a cookie of Domain ``domain`` (no leading dot, lower case) on
    ``host``: the host is it or one of its subdomains (an IP address only itself), RFC 6265 5.1.3."""
    if host == domain:
        return True
    return host.endswith("." + domain) and not _is_ip(host)


def _is_ip(host):
    return host.startswith("[") or ":" in host or re.fullmatch(r"[0-9.]+", host) is not None


def _edge_host(config):
    """The host of the edge pages call (EDGE_URL's, or a loopback EDGE_ADDRESS's), or None when
    E016 judges the edge settings (no edge, or a bad one)."""
    if config["EDGE_ADDRESS"] is None or any(commandline.setting_error(key, config) is not None
                                             for key in conf.EDGE_SETTINGS):
        return None
    if commandline.edge_error(config) is not None:
        return None
    if config["EDGE_URL"]:
        return urlsplit(config["EDGE_URL"]).hostname
    host = parse_address(config["EDGE_ADDRESS"])[0].lower()
    return host.strip("[]")


@_of_config
def check_cookie_domain(config):
    """The poll cookie's Domain: a domain name of more than one label (E017), which covers the
    pages' hosts (E018: a browser drops a cookie whose Domain does not match the page's host),
    and sent from each page's host to the edge's (W006: without it the edge answers 401)."""
    domain = config["COOKIE_DOMAIN"]
    if domain is not None and not (isinstance(domain, str) and _DOMAIN_RE.match(domain)):
        return [checks.Error(f"FASTPOLL['COOKIE_DOMAIN'] must be None or a domain name such as '.example.com', "
                             f"got {domain!r}.",
                             hint="None uses SESSION_COOKIE_DOMAIN; a parent domain of the site's and the edge's "
                                  "host sends the poll cookie to both.", id="fastpoll.E017")]
    source = "FASTPOLL['COOKIE_DOMAIN']"
    if domain is None:
        domain, source = getattr(settings, "SESSION_COOKIE_DOMAIN", None), "SESSION_COOKIE_DOMAIN (COOKIE_DOMAIN is None)"
        if not (isinstance(domain, str) and _DOMAIN_RE.match(domain)):
            domain = None          # Django's own setting: Django judges it
    if domain is not None and "." not in domain.strip("."):
        return [checks.Error(f"The poll cookie's Domain {domain!r} ({source}) is a single label: browsers refuse "
                             f"a cookie for a top-level domain, so no page would keep the poll cookie.",
                             hint="Set FASTPOLL['COOKIE_DOMAIN'] to the site's registrable domain such as "
                                  "'.example.com', or None (host-only) for a single host such as localhost.",
                             id="fastpoll.E017")]
    edge_host = _edge_host(config)
    if edge_host is None:
        return []
    derived = not config["EDGE_URL"]
    errors = []
    bare = domain.lstrip(".").lower() if domain is not None else None
    for origin in config["EDGE_ORIGINS"]:
        host = urlsplit(origin).hostname
        if bare is not None and not _domain_match(host, bare):
            errors.append(checks.Error(
                f"The poll cookie's Domain {domain!r} ({source}) does not cover the host of EDGE_ORIGINS' {origin}: "
                f"a browser drops that cookie on its pages, so they get no poll cookie at all.",
                hint=f"Set FASTPOLL['COOKIE_DOMAIN'] to a parent domain of {host} and {edge_host}, or drop "
                     f"{origin} from EDGE_ORIGINS.", id="fastpoll.E018"))
            continue
        reached = edge_host
        if derived:
            reached = loopback_edge_host(edge_host, host)
            if reached is None:
                continue       # edge_url() gives that page no loopback edge: no cookie must reach it
        # host-only: the edge on the page's very host
        reaches = _domain_match(reached, bare) if bare is not None else host == reached
        if not reaches:
            scope = f"Domain {domain!r}" if bare is not None else "host-only (COOKIE_DOMAIN and SESSION_COOKIE_DOMAIN are None)"
            fix = (f"set FASTPOLL['COOKIE_DOMAIN'] to a parent domain of both, such as '.{_common(host, edge_host)}'"
                   if _common(host, edge_host) else
                   "put the edge on a subdomain of the site (a cross-site edge gets no cookie: only a client that "
                   "polls with fetch and an Authorization: Bearer token can use it, not fastpoll.js)")
            errors.append(checks.Warning(
                f"The poll cookie set on {host} (the page of EDGE_ORIGINS' {origin}) is {scope}: the browser does "
                f"not send it to the edge's host {edge_host}, which answers that page's polls 401 (the page falls "
                f"back to the site).", hint=f"To give it the edge, {fix}.", id="fastpoll.W006"))
    return errors


def _common(a, b):
    """The longest common parent domain of two host names with at least two labels, or ''."""
    if _is_ip(a) or _is_ip(b):
        return ""
    la, lb = a.split(".")[::-1], b.split(".")[::-1]
    common = []
    for x, y in zip(la, lb):
        if x != y:
            break
        common.append(x)
    return ".".join(common[::-1]) if len(common) >= 2 else ""


POLL_MIDDLEWARE = "fastpoll.middleware.PollTokenMiddleware"
SESSION_MIDDLEWARE = "django.contrib.sessions.middleware.SessionMiddleware"
AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"


def _position(middleware, path):
    """Index in ``middleware`` of ``path`` or of a subclass of it (as Django's admin checks), else None."""
    wanted = import_string(path)
    for index, entry in enumerate(middleware):
        try:
            found = import_string(entry)
        except ImportError:
            continue
        if isinstance(found, type) and issubclass(found, wanted):
            return index
    return None


def check_middleware(app_configs=None, **kwargs):
    """PollTokenMiddleware reads ``request.user``, which only AuthenticationMiddleware (over
    SessionMiddleware) sets: without them no session user ever gets a poll cookie, silently."""
    middleware = list(getattr(settings, "MIDDLEWARE", None) or ())
    poll = _position(middleware, POLL_MIDDLEWARE)
    if poll is None:
        return []
    errors = []
    for path, name in ((SESSION_MIDDLEWARE, "SessionMiddleware"), (AUTH_MIDDLEWARE, "AuthenticationMiddleware")):
        where = _position(middleware, path)
        if where is None:
            errors.append(checks.Error(
                f"{POLL_MIDDLEWARE} needs {path}, which MIDDLEWARE does not list.",
                hint=f"Add '{path}' to MIDDLEWARE before '{POLL_MIDDLEWARE}', or remove the latter.",
                id="fastpoll.E013"))
        elif where > poll:
            errors.append(checks.Error(
                f"{POLL_MIDDLEWARE} is listed before {path} in MIDDLEWARE.",
                hint=f"Move '{POLL_MIDDLEWARE}' after '{path}'.", id="fastpoll.E013"))
    return errors


def _valid_server(spec):
    try:
        parse_server(spec)
    except ValueError:
        return False
    return True


CHECKS = (check_type, check_memcached_servers, check_durations, check_counts, check_switches, check_secret_file,
          check_names, check_key_prefix, check_notify, check_rendered, check_edge, check_cookie_domain,
          check_middleware)


def register():
    for check in CHECKS:
        checks.register(check, TAG, checks.Tags.compatibility)
