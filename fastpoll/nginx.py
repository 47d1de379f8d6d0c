"""nginx's part of fastpoll, rendered from ``settings.FASTPOLL`` (``manage.py fastpoll_nginx``).

Two texts, both package data (``fastpoll/templates/fastpoll/``, read with importlib.resources, so
an installed wheel renders them too):

- :func:`render_server`: the ``location`` blocks an existing ``server {}`` block includes: the
  poll path (fastpath first, Django on a miss), the internal long-poll and stream locations, the
  fallback to Django and the JSON error locations they use;
- :func:`render_http`: what nginx allows at http level only: the ``map``s of ``Prefer: wait`` and
  of ``Accept: text/event-stream``, and the ``upstream`` of fastpath.

Every function takes a FASTPOLL-like mapping (missing keys: :data:`fastpoll.conf.DEFAULTS`;
None: the project's ``get_config()``), so a runner that is not Django (the demo's, plurksite)
renders the very same text.  A bad value raises :class:`RenderError` with one line naming the key.
"""
import importlib.resources
import re

from fastpath.options import is_decimal

from . import conf

TEMPLATES = ("nginx-http.conf", "nginx-server.conf")
LONGPOLL_READ_MARGIN_S = 15     # nginx's read timeout of a long-poll: fastpath's longest hold + this
KEEPALIVE_MARGIN_S = 2          # nginx drops an idle connection to fastpath this much sooner than it
STREAM_READ_MARGIN_S = 15       # nginx's read timeout of a stream: the heartbeat + this

#: nginx's own errors answered as JSON, one row each: (status, the statuses nginx sends to it,
#: the words of its body).  Rendered as the /_<name>_error/<code> locations, <code> the first
#: status sent there, and the error_page lines pointing at them, here and in the demo's templates
#: (plurksite.nginxconf).  497 is nginx's own code for plain HTTP sent to an ``ssl`` port (its
#: default answer an HTML 400 page): a 400 of its own that says what to do.
JSON_ERRORS = (
    (400, (400, 494), "bad request"),
    (400, (497,), "plain HTTP sent to the HTTPS port: use https://"),
    (404, (404,), "not found"),
    (405, (405,), "method not allowed"),
    (413, (413,), "request body too large"),
    (414, (414,), "request URI too long"),
    (429, (429,), "too many held connections"),
    (500, (500,), "internal error"),
    (501, (501,), "transfer coding not implemented"),
    (502, (502,), "backend unavailable"),
    (503, (503,), "service unavailable"),
    (504, (504,), "backend timed out"),
    (505, (505,), "HTTP version not supported"),
)
#: headers an error location adds to its answer: the cap on held connections (nginx's limit_conn
#: per client address, and fastpath's per user, which the hold locations intercept) says when to
#: come back, as fastpath's own 429 does
ERROR_HEADERS = {429: (("Retry-After", "5"),)}
#: the shared memory zone of limit_conn (per client address): ~16,000 addresses a megabyte
HELD_ZONE_MB = 10
#: what makes a request held, as nginx map patterns (fastpath and Django read them alike): a
#: long-poll's ``Prefer`` (RFC 7240 ``wait=``, whatever preferences share the header) and a
#: stream's ``$request_method:$http_accept`` (a GET listing text/event-stream, parameters not
#: read).  fastpoll's http part maps them; a balancer in front that caps held requests reads the
#: same ones (plurksite.nginxconf).
WAIT_PATTERN = r'"~*(^|,)\s*wait\s*="'
STREAM_PATTERN = r'"~*^GET:(.*,)?[ \t]*text/event-stream[ \t]*(;|,|$)"'
#: the error_page lines of fastpoll's own locations (a location's list replaces the server's):
#: what fastpath's answers leave to nginx, and the fallback's (Django down or slow)
POLL_ERRORS = (400, 413, 414, 500)
HOLD_ERRORS = (400, 413, 414, 429, 500, 504)
DJANGO_ERRORS = (500, 502, 503, 504)


def error_locations(name, indent=""):
    """The internal locations that answer nginx's own errors as JSON (URIs, not named
    locations: a named location cannot serve an error met while reading the request line)."""
    return "\n".join(f"{indent}location = /_{name}_error/{sent[0]} {{ internal; default_type application/json; "
                     + "".join(f"add_header {header} {value} always; " for header, value in ERROR_HEADERS.get(status, ()))
                     + f"return {status} '{{\"error\":\"{words}\"}}'; }}" for status, sent, words in JSON_ERRORS)


def error_pages(name, only=None, indent=""):
    """``error_page`` lines sending nginx's errors (``only`` these codes: the first each row
    sends) to those locations."""
    return "\n".join(f"{indent}error_page {' '.join(map(str, sent))} /_{name}_error/{sent[0]};"
                     for _, sent, _ in JSON_ERRORS if only is None or sent[0] in only)


_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")
_NAME_RE = re.compile(r"\A[a-z0-9_]{1,32}\Z")
_VARIABLE_RE = re.compile(r"\A\$[a-z_][a-z0-9_]{0,63}\Z")
# what follows http:// in proxy_pass: an upstream name, host:port, [v6]:port or unix:/path:
_UPSTREAM_RE = re.compile(r"\A(?:unix:/[^\s;{}'\"$]+:|[A-Za-z0-9_.\-]+(?::\d{1,5})?|\[[0-9A-Fa-f:.]+\]:\d{1,5})\Z")


class RenderError(ValueError):
    """A setting cannot be rendered; the message is one line naming the key and the fix."""


def template_text(name):
    """The text of the package's template ``name`` (one of :data:`TEMPLATES`)."""
    return importlib.resources.files(__package__).joinpath("templates", "fastpoll", name).read_text("utf-8")


def settings_of(config=None):
    """``config`` over DEFAULTS (the project's effective FASTPOLL when None)."""
    if config is None:
        return conf.get_config()
    return {**conf.DEFAULTS, **config}


def _integer(config, key, low, high):
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RenderError(f"FASTPOLL['{key}'] must be a whole number from {low} to {high}, got {value!r}")
    return value


def fastpath_address(config):
    """FASTPATH_ADDRESS as nginx's upstream server takes it: ``unix:/abs/path``, ``host:port`` or
    ``[v6]:port``."""
    value = config["FASTPATH_ADDRESS"]
    if isinstance(value, str) and value.startswith("unix:"):
        if value.startswith("unix:/") and not re.search(r"[\s;{}'\"]", value):
            return value
        raise RenderError(f"FASTPOLL['FASTPATH_ADDRESS'] = {value!r}: give unix:/absolute/path "
                          f"(nginx and fastpath resolve a relative one differently)")
    host, sep, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if (not sep or not host or not is_decimal(port) or not 0 < int(port) < 65536
            or _UPSTREAM_RE.match(value) is None):
        raise RenderError(f"FASTPOLL['FASTPATH_ADDRESS'] = {value!r}: expected host:port, [v6]:port "
                          f"or unix:/path, for example 127.0.0.1:8001")
    return value


def context(config=None):
    """The placeholder values of both templates, checked."""
    config = settings_of(config)
    name = config["NGINX_NAME"]
    if not isinstance(name, str) or _NAME_RE.match(name) is None:
        raise RenderError(f"FASTPOLL['NGINX_NAME'] must be 1-32 of a-z 0-9 _, got {name!r}")
    path = config["PATH_PREFIX"]
    if not conf.is_path_prefix(path):
        raise RenderError(f"FASTPOLL['PATH_PREFIX'] must be {conf.PATH_PREFIX_RULE}, got {path!r}")
    django = config["DJANGO_UPSTREAM"]
    if not isinstance(django, str) or _UPSTREAM_RE.match(django) is None:
        raise RenderError(f"FASTPOLL['DJANGO_UPSTREAM'] = {django!r}: give what follows http:// in "
                          f"proxy_pass: an upstream name, host:port or unix:/path:")
    max_wait = _integer(config, "LONGPOLL_MAX_WAIT", 0, 86400)
    heartbeat = _integer(config, "STREAM_HEARTBEAT", 1, 3600)
    idle = _integer(config, "FASTPATH_IDLE_TIMEOUT", 1, 3600)
    held = _integer(config, "NGINX_HELD_PER_ADDRESS", 0, 1 << 20)
    request_id = config["NGINX_REQUEST_ID"]
    if not isinstance(request_id, str) or _VARIABLE_RE.match(request_id) is None:
        raise RenderError(f"FASTPOLL['NGINX_REQUEST_ID'] must be an nginx variable such as '$request_id', "
                          f"got {request_id!r}")
    return {
        "name": name,
        "path_prefix": path,
        "django": django,
        "fastpath": fastpath_address(config),
        "upstream_keepalive": str(_integer(config, "NGINX_UPSTREAM_KEEPALIVE", 1, 1 << 20)),
        "fastpath_keepalive_timeout": f"{max(1, idle - KEEPALIVE_MARGIN_S)}s",
        "max_wait": str(max_wait),
        "longpoll_read_timeout": f"{max_wait + LONGPOLL_READ_MARGIN_S}s",
        "error_locations": error_locations(name),
        "poll_error_pages": error_pages(name, POLL_ERRORS, "    "),
        "hold_error_pages": error_pages(name, HOLD_ERRORS, "    "),
        "django_error_pages": error_pages(name, DJANGO_ERRORS, "    "),
        "wait_pattern": WAIT_PATTERN,
        "stream_pattern": STREAM_PATTERN,
        "held_zone": ("\n".join((
            f"geo ${name}_held_capped {{ default 1; 127.0.0.0/8 0; ::1 0; }}",
            f'map ${name}_held_capped ${name}_held_key {{ 0 ""; default $binary_remote_addr; }}',
            f"limit_conn_zone ${name}_held_key zone={name}_held:{HELD_ZONE_MB}m;")) if held else
                      "# no cap on held connections per client address (NGINX_HELD_PER_ADDRESS is 0)"),
        "held_limit": (f"    limit_conn {name}_held {held};\n    limit_conn_status 429;" if held else
                       "    # no cap per client address (NGINX_HELD_PER_ADDRESS is 0)"),
        "request_id": request_id,
        "stream_heartbeat": str(heartbeat),
        "stream_read_timeout": f"{heartbeat + STREAM_READ_MARGIN_S}s",
    }


def render_text(text, values, where="template"):
    """``{{ name }}`` -> ``values[name]``; nginx's ``$variables`` and braces pass through."""
    def substitute(match):
        key = match.group(1)
        if key not in values:
            raise KeyError(f"{where}: unknown placeholder {{{{ {key} }}}}")
        return values[key]

    return _PLACEHOLDER.sub(substitute, text)


def render_http(config=None):
    """The http-level part: the ``map`` of ``Prefer: wait`` and the ``upstream`` of fastpath."""
    return render_text(template_text("nginx-http.conf"), context(config), "nginx-http.conf")


def render_server(config=None):
    """The server-level part: the poll locations, for an existing ``server {}`` block."""
    return render_text(template_text("nginx-server.conf"), context(config), "nginx-server.conf")


def indent(text, prefix="    "):
    """``text`` with ``prefix`` before each non-empty line (to inline a part in a block)."""
    return "\n".join(prefix + line if line else line for line in text.rstrip("\n").split("\n"))
