"""fastpath's command line, built from ``settings.FASTPOLL`` (``manage.py fastpoll_fastpath``).

fastpath never reads Django's settings: what both must agree on (the memcached servers, the
secret, the resources, the notice directory, the longest hold, the listen address nginx proxies
to) reaches it as flags, rendered here from the one configuration.  A resource missing from
``--resources`` would silently send every poll of it to Django.

:func:`fastpath_options` maps a FASTPOLL-like mapping to fastpath's option values;
:func:`fastpath_argv` is the whole ``python -m fastpath ...`` argv.  The demo's runner
(plurksite.services) builds its fastpath through the same two functions.
"""
import json
import shlex
import sys
from urllib.parse import urlsplit

from fastpath.errors import ConfigurationError
from fastpath.options import OPTIONS, Options, check_admin_apart, command_line, is_loopback, parse_address, parse_listen

from . import conf, nginx
from . import resources as registry

FORMATS = ("shell", "json", "args")


class CommandLineError(ValueError):
    """The settings cannot make a command line; the message is one line naming the fix."""


def _notify_dir(config):
    dirs = config["NOTIFY_DIRS"]
    if not isinstance(dirs, (list, tuple)) or not all(isinstance(d, str) and d for d in dirs):
        raise CommandLineError(f"FASTPOLL['NOTIFY_DIRS'] must be a list of directories, got {dirs!r}")
    if len(dirs) > 1:
        raise CommandLineError(f"FASTPOLL['NOTIFY_DIRS'] lists {len(dirs)} directories; name this "
                               f"fastpath's with --notify-dir DIR")
    return dirs[0] if dirs else None


def _timeout_ms(config):
    seconds = config["MEMCACHED_TIMEOUT"]
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 60:
        raise CommandLineError(f"FASTPOLL['MEMCACHED_TIMEOUT'] must be seconds in (0, 60], got {seconds!r}")
    return max(1, round(seconds * 1000))


def _edge_origins(config):
    origins = config["EDGE_ORIGINS"]
    if isinstance(origins, str) or not isinstance(origins, (list, tuple)):
        raise CommandLineError(f"FASTPOLL['EDGE_ORIGINS'] must be a list of origins such as "
                               f"['https://www.example.com'], got {origins!r}")
    return list(origins) or None


def edge_url_error(url):
    """Why ``url`` cannot be FASTPOLL['EDGE_URL'] (an origin: http(s)://host[:port], no path),
    or None."""
    if url is None:
        return None
    try:
        parts = urlsplit(url) if isinstance(url, str) else None
        parts and parts.port
    except ValueError:
        parts = None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.username
            or parts.password or parts.path or parts.query or parts.fragment or url != url.strip()):
        return (f"FASTPOLL['EDGE_URL'] must be the URL browsers reach the edge by, http(s)://host[:port] "
                f"without a path, such as 'https://poll.example.com', got {url!r}")
    return None


def fastpath_options(config=None, resources=None, object_resources=(), **overrides):
    """fastpath's option values (``fastpath.Options`` names) for the FASTPOLL-like ``config``
    (None: the project's settings).  ``resources``: the per-user resource names, as given (None:
    none; fastpath has no default list); ``object_resources``: the per-object ones.  ``overrides`` (Options
    names) replace or add values: what only the host knows (``notify_udp``, ``max_body``...).

    Returns the values for :func:`fastpath.options.command_line`."""
    config = nginx.settings_of(config)
    values = {
        "listen": nginx.fastpath_address(config),
        "admin": config["FASTPATH_ADMIN"],
        "memcached": list(config["MEMCACHED_SERVERS"]),
        "secret_file": config["SECRET_FILE"],
        "workers": config["FASTPATH_WORKERS"],
        "timeout_ms": _timeout_ms(config),
        "idle_timeout": config["FASTPATH_IDLE_TIMEOUT"],
        "max_wait": config["LONGPOLL_MAX_WAIT"],
        "stream_heartbeat": config["STREAM_HEARTBEAT"],
        "max_stream": config["STREAM_MAX"],
        "resources": list(resources) if resources else None,   # none: --object-resources alone
        # the edge's: checked whatever EDGE_ADDRESS is, on the command line only with it
        "edge": config["EDGE_ADDRESS"],
        "edge_origins": _edge_origins(config),
        "edge_max_connections": config["EDGE_MAX_CONNECTIONS"],
        "edge_max_per_address": config["EDGE_MAX_PER_ADDRESS"],
        "edge_max_conns_per_address": config["EDGE_MAX_CONNS_PER_ADDRESS"],
        "edge_header_timeout": config["EDGE_HEADER_TIMEOUT"],
        "max_held_per_user": config["MAX_HELD_PER_USER"],
    }
    problem = edge_url_error(config["EDGE_URL"])
    if problem:
        raise CommandLineError(problem)
    if "notify_dir" not in overrides:
        values["notify_dir"] = _notify_dir(config)
    values.update(overrides)
    values.setdefault("cookie_name", config["COOKIE_NAME"])
    values.setdefault("path_prefix", config["PATH_PREFIX"])
    values.setdefault("key_prefix", config["KEY_PREFIX"])
    if object_resources:
        values.setdefault("object_resources", list(object_resources))
    return values


#: the FASTPOLL key each fastpath option is rendered from (what an error of the option names)
SETTING_OF_OPTION = {"listen": "FASTPATH_ADDRESS", "admin": "FASTPATH_ADMIN", "memcached": "MEMCACHED_SERVERS",
                     "secret_file": "SECRET_FILE", "workers": "FASTPATH_WORKERS", "timeout_ms": "MEMCACHED_TIMEOUT",
                     "idle_timeout": "FASTPATH_IDLE_TIMEOUT", "max_wait": "LONGPOLL_MAX_WAIT",
                     "stream_heartbeat": "STREAM_HEARTBEAT", "max_stream": "STREAM_MAX",
                     "notify_dir": "NOTIFY_DIRS", "cookie_name": "COOKIE_NAME", "path_prefix": "PATH_PREFIX",
                     "key_prefix": "KEY_PREFIX", "edge": "EDGE_ADDRESS", "edge_origins": "EDGE_ORIGINS",
                     "edge_max_connections": "EDGE_MAX_CONNECTIONS", "edge_max_per_address": "EDGE_MAX_PER_ADDRESS",
                     "edge_max_conns_per_address": "EDGE_MAX_CONNS_PER_ADDRESS",
                     "edge_header_timeout": "EDGE_HEADER_TIMEOUT", "max_held_per_user": "MAX_HELD_PER_USER"}
#: options that mean nothing without --edge: checked always, rendered only with it
EDGE_ONLY = ("edge_origins", "edge_max_connections", "edge_max_per_address", "edge_max_conns_per_address",
             "edge_header_timeout")


def _check_option(opt, value):
    """fastpath's own checks of one option's value (its table's type and range; --admin's
    address), before fastpath says it: ConfigurationError or TypeError."""
    value = opt.coerce(value)
    opt.check(value)
    if opt.attr == "listen":
        parse_listen(value)
    if opt.attr == "admin":
        host, _ = parse_address(value, "--admin")
        if not is_loopback(host):
            raise ConfigurationError(f"--admin {value} must be a loopback address (stats are not public)")
    if opt.attr == "edge":
        parse_address(value, "--edge")
    if opt.attr == "edge_origins":
        Options(edge_origins=value)._validate_edge()      # fastpath's own reading of each origin


def _check_values(values, overrides):
    for opt in OPTIONS:
        if values.get(opt.attr) is None:
            continue
        try:
            _check_option(opt, values[opt.attr])
        except (TypeError, ConfigurationError) as exc:      # a value of the wrong type or range
            key = SETTING_OF_OPTION.get(opt.attr)
            if key is None or opt.attr in overrides:
                raise CommandLineError(f"fastpath {exc}") from None
            raise CommandLineError(f"FASTPOLL['{key}']: fastpath {exc}") from None


def edge_error(config=None):
    """The line refusing the edge settings *together* (each alone is judged by
    :func:`setting_error`), or None: an edge needs the origins it answers, a URL browsers reach it
    by (derived only for a loopback address) and a port of its own."""
    config = nginx.settings_of(config)
    edge = config["EDGE_ADDRESS"]
    if edge is None:
        return None
    if not config["EDGE_ORIGINS"]:
        return (f"FASTPOLL['EDGE_ADDRESS'] is set but FASTPOLL['EDGE_ORIGINS'] is empty: list the site origins "
                f"whose pages poll the edge, such as ['https://www.example.com']")
    edge_addr = parse_address(edge, "--edge")
    if config["EDGE_URL"] is None and not is_loopback(edge_addr[0]):
        return (f"FASTPOLL['EDGE_ADDRESS'] = {edge!r} is not a loopback address: set FASTPOLL['EDGE_URL'] to the "
                f"URL browsers reach the edge by, such as 'https://poll.example.com'")
    try:
        listen = nginx.fastpath_address(config)
        check_admin_apart(parse_listen(listen), edge_addr, listen, edge, "--edge")
        if config["FASTPATH_ADMIN"]:
            admin = config["FASTPATH_ADMIN"]
            check_admin_apart(parse_address(admin, "--admin"), edge_addr, admin, edge, "--edge", "--admin")
    except ConfigurationError as exc:
        return f"FASTPOLL['EDGE_ADDRESS']: fastpath {exc}"
    except (nginx.RenderError, TypeError):
        return None                    # FASTPATH_ADDRESS / FASTPATH_ADMIN: their own line says it
    django = config.get("DJANGO_UPSTREAM")
    try:
        django_addr = parse_address(django, "DJANGO_UPSTREAM") if isinstance(django, str) else None
    except ConfigurationError:
        django_addr = None             # an upstream name or a unix socket: no port to share
    if django_addr is not None and django_addr[1] == edge_addr[1] and \
            (django_addr[0] == edge_addr[0] or edge_addr[0] in ("0.0.0.0", "::")):
        return (f"FASTPOLL['EDGE_ADDRESS'] = {edge!r} is where nginx sends Django's requests "
                f"(DJANGO_UPSTREAM {django!r}): give the edge a port of its own")
    return None


def fastpath_argv(config=None, resources=None, object_resources=(), python=None, **overrides):
    """``[python, "-m", "fastpath", flags...]`` for ``config`` (see :func:`fastpath_options`).
    A value fastpath would refuse is a :class:`CommandLineError` naming its FASTPOLL key, and so
    is no resource at all (fastpath's --resources is required: pass the registry's,
    ``registered("user")``)."""
    if not resources and not object_resources:
        raise CommandLineError("fastpath needs its per-user poll resources (--resources has no default): "
                               "pass fastpath_argv the registry's, commandline.registered('user')")
    values = fastpath_options(config, resources, object_resources, **overrides)
    _check_values(values, overrides)
    problem = edge_error(config)
    if problem:
        raise CommandLineError(problem)
    if values.get("edge") is None:
        values = {attr: value for attr, value in values.items() if attr not in EDGE_ONLY}
        if values.get("max_held_per_user") == 0:          # fastpath's default: the command line stays as it was
            del values["max_held_per_user"]
    return [python or sys.executable, "-m", "fastpath", *command_line(**values)]


#: the settings only the renderers read (the other checks of fastpoll.checks judge the rest):
#: ``manage.py check`` (fastpoll.E015) asks :func:`setting_error` of each
RENDERED_SETTINGS = ("FASTPATH_ADDRESS", "FASTPATH_ADMIN", "FASTPATH_WORKERS", "FASTPATH_IDLE_TIMEOUT",
                     "LONGPOLL_MAX_WAIT", "STREAM_HEARTBEAT", "STREAM_MAX", "DJANGO_UPSTREAM", "NGINX_NAME", "NGINX_UPSTREAM_KEEPALIVE",
                     "MEMCACHED_TIMEOUT", "PATH_PREFIX")


def setting_error(key, config=None):
    """The line ``manage.py fastpoll_nginx`` or ``fastpoll_fastpath`` refuses ``FASTPOLL[key]``
    with, or None when both take it.  The value is judged alone, every other key at its default,
    by the renderers' own code (so the line names ``key``, and ``check`` says what they say)."""
    config = nginx.settings_of(config)
    alone = {**conf.DEFAULTS, key: config[key]}
    try:
        nginx.context(alone)
        _check_values(fastpath_options(alone), {})
    except (nginx.RenderError, CommandLineError) as exc:
        return str(exc)
    return None


def registered(per):
    """The registry's resource names of ``per`` ("user" or "object"), sorted: a stable text."""
    return sorted(registry.names(per=per))


def format_argv(argv, fmt):
    """``argv`` as ``shell`` (one quoted line), ``json`` (an array) or ``args`` (the arguments
    after ``-m fastpath``, one a line, for ``mapfile -t``)."""
    if fmt == "shell":
        return shlex.join(argv)
    if fmt == "json":
        return json.dumps(argv)
    if fmt == "args":
        return "\n".join(argv[3:])
    raise CommandLineError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")

