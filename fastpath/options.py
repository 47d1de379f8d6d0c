"""fastpath's options, declared once (pure Python: the runner imports it without the extension).

``OPTIONS`` is the table: one row per option with its flag, the ``Options`` attribute, its type,
default, range or choices, help text and the ``fp_config_t`` field it fills in C (``None``: it
stays in Python).  Generated from it: the CLI (``build_parser``), ``Options`` (defaults, types,
``validate()``), ``fastpath.serve(**kwargs)``, the runner's command line (``command_line``) and
the C configuration (``_server.run_worker`` sets each ``c_field`` through ``fp_config_set``).
tests/fastpath/test_options.py fails when the table and C's ``FP_CONFIG_SCALARS`` drift apart.

A new option is one row here; if it reaches C, also one ``X(type, field, default)`` row of
``FP_CONFIG_SCALARS`` in src/fp_server.h, with the same default.
"""
import argparse
import dataclasses
import ipaddress
import os
import re
import socket

from .errors import ConfigurationError, FastpathError

BACKENDS = ("epoll", "poll", "select")
_RESOURCE_RE = re.compile(r"\A[A-Za-z0-9_]{1,32}\Z")
_SECRET_MIN, _SECRET_MAX = 32, 1024
_SECRET_WRONG_LENGTH = "secret file {path} must hold {low}..{high} bytes, has {length}"
_SECRET_REQUIRED = ("--secret-file is required: the file of the secret shared with Django "
                    "(`manage.py fastpoll_fastpath` prints fastpath's whole command line)")
_RESOURCES_REQUIRED = ("--resources is required: the per-user poll resources to serve, e.g. the line "
                       "`manage.py fastpoll_fastpath` prints")
_SUN_PATH_MAX = 107               # bytes of a unix socket path: sun_path's 108 with the NUL
# an origin as a browser serializes it (lower case, no path): scheme "://" host [":" port]
_ORIGIN_RE = re.compile(r"\A(?=.{1,255}\Z)(https?)://([a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*"
                        r"|\[[0-9a-f:.]+\])(?::([0-9]{1,5}))?\Z")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_MAX_ORIGINS = 16


def is_decimal(text):
    """ASCII digits only: str.isdigit() alone is true of '²' (which int() refuses) and of other
    scripts' digits (which int() reads).  Every port, count and descriptor read from text uses it."""
    return text.isascii() and text.isdigit()


def origin(scheme, host, port=None):
    """The Origin a browser sends from a page at ``scheme``://``host``:``port`` (``port`` an int,
    or None): the host in lower case, an IPv6 address in brackets, and no port when it is the
    scheme's default, which a browser never sends (an origin list holding it would never match).
    --edge-origins takes an origin only as this writes it; a site's default origins are built
    with it (plurksite's PLURK_EDGE_ORIGINS)."""
    host = host.lower()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}" + ("" if port is None or port == _DEFAULT_PORTS[scheme] else f":{port}")


def comma_separated(text):
    """``"a, b,,c"`` -> ``("a", "b", "c")`` (the form of --memcached and --resources)."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


@dataclasses.dataclass(frozen=True)
class Option:
    flag: str
    attr: str
    type: object                 # int, str or comma_separated (a tuple of str)
    default: object
    help: str
    low: int = None              # inclusive range of an int option
    high: int = None
    choices: tuple = None
    c_field: str = None          # the fp_config_t scalar or text it fills; None: used in Python only
    pattern: object = None       # a str option's grammar (a compiled regex) ...
    grammar: str = None          # ... and how its error names it

    def coerce(self, value):
        """``value`` in this option's type, or TypeError (a serve() keyword of the wrong type
        is a programming error, as for any typed Python argument)."""
        if value is None and self.default is None:
            return None
        if self.type is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{self.attr} must be an int, not {type(value).__name__}")
            return value
        if self.type is comma_separated:
            if isinstance(value, str):
                return comma_separated(value)
            value = tuple(value)
            if not all(isinstance(v, str) for v in value):
                raise TypeError(f"{self.attr} must be a comma-separated str or a sequence of str")
            return value
        if not isinstance(value, str):
            raise TypeError(f"{self.attr} must be a str, not {type(value).__name__}")
        return value

    def check(self, value):
        """The range or choices of the table (anything more is in Options.validate)."""
        if self.low is not None and not self.low <= value <= self.high:
            raise ConfigurationError(f"{self.flag} must be in {self.low}..{self.high}, got {value}")
        if self.choices is not None and value is not None and value not in self.choices:
            raise ConfigurationError(f"{self.flag} must be one of {', '.join(self.choices)}")
        if self.pattern is not None and not self.pattern.match(value):
            raise ConfigurationError(f"bad {self.flag} {value!r}: {self.grammar}")

    def format(self, value):
        """``value`` as it is written on the command line."""
        return ",".join(value) if self.type is comma_separated else str(value)

    def help_text(self):
        extra = [] if self.default is None else [f"default {self.format(self.default)}"]
        if self.low is not None:
            extra.append(f"{self.low}..{self.high}")
        text = f"{self.help} [{', '.join(extra)}]" if extra else self.help
        return text.replace("%", "%%")             # argparse formats help with %


OPTIONS = (
    Option("--listen", "listen", str, "127.0.0.1:8001",
           "host:port to serve polls on, or unix:/path (nginx on this host)"),
    Option("--admin", "admin", str, None, "loopback host:port serving /metrics (Prometheus)"),
    Option("--memcached", "memcached", comma_separated, ("127.0.0.1:11211",),
           "comma-separated memcached host:port list, mapped as pymemcache's HashClient maps it; "
           "a host name is resolved once at start"),
    # required, no default: a path relative to wherever fastpath happens to start is a guess
    Option("--secret-file", "secret_file", str, None,
           "the file of the HMAC secret shared with Django (FASTPOLL['SECRET_FILE']); required. "
           "`manage.py fastpoll_fastpath` prints the whole command line from Django's settings"),
    Option("--workers", "workers", int, 1, "worker processes (0: one per CPU)", 0, 256),
    Option("--timeout-ms", "timeout_ms", int, 50,
           "memcached answer deadline, ms; past it a poll is answered 503 X-Cache: MISS on --listen "
           "(nginx hands it to Django), 409 {\"retry\":\"site\"} on --edge", 1, 60000, c_field="timeout_ms"),
    Option("--idle-timeout", "idle_timeout", int, 10,
           "seconds a request may take to arrive, a response to be read, or a keep-alive "
           "connection to stay idle", 1, 3600, c_field="idle_timeout_s"),
    Option("--drain-timeout", "drain_timeout", int, 5, "seconds SIGTERM waits for in-flight requests",
           0, 600, c_field="drain_timeout_s"),
    Option("--max-body", "max_body", int, 65536, "largest request body, bytes (413 beyond)",
           0, 1 << 24, c_field="max_body"),
    # nginx forwards a request line of up to 8 KiB and header lines of up to 8 KiB each
    # (large_client_header_buffers 4 8k): fastpath must never refuse what nginx forwards
    Option("--max-headers", "max_headers", int, 32768,
           "largest request head, bytes; a larger one is answered 404 X-Cache: MISS on --listen "
           "(nginx hands it to Django) and refused with 431 on --edge", 512, 1 << 20, c_field="max_headers"),
    Option("--max-connections", "max_connections", int, 16384,
           "open --listen connections per worker; more are closed at once so nginx falls back "
           "(the edge's: --edge-max-connections)",
           1, 1 << 20, c_field="max_connections"),
    Option("--max-wait", "max_wait", int, 55,
           "longest hold of a poll that asks Prefer: wait=N, seconds (each hold is jittered down "
           "by up to 10%); 0: never hold", 0, 86400, c_field="max_wait_s"),
    Option("--reread-interval", "reread_interval", int, 5,
           "a held poll's key is read again at least this often, seconds (lost notices cost at "
           "most this)", 1, 3600, c_field="reread_interval_s"),
    Option("--reread-rate", "reread_rate", int, 8000,
           "held keys read again per second at most, all workers together (each an equal "
           "share): past rate x --reread-interval held keys the sweep takes longer instead of "
           "costing more; notices are never limited", 50, 10000000, c_field="reread_rate"),
    Option("--stream-heartbeat", "stream_heartbeat", int, 25,
           "a stream (Accept: text/event-stream) gets a comment line this often, seconds (keep it "
           "below the proxy's read timeout)", 1, 3600, c_field="stream_heartbeat_s"),
    Option("--max-stream", "max_stream", int, 300,
           "longest stream, seconds (each is jittered down by up to 10%; the client reconnects "
           "with Last-Event-ID)", 1, 86400, c_field="max_stream_s"),
    Option("--notify-dir", "notify_dir", str, None,
           "directory of the notice sockets: each worker reads <dir>/<index>.sock (made if "
           "missing); unset: no notices, held polls rely on --reread-interval"),
    Option("--notify-udp", "notify_udp", str, None,
           "HOST:PORT (numeric, a private address): worker i also reads notices from other hosts "
           "on UDP HOST:PORT+i; may be used with --notify-dir"),
    Option("--resources", "resources", comma_separated, None,
           "required (unless --object-resources alone): the comma-separated per-user poll "
           "resources served, as `manage.py fastpoll_fastpath` passes them; another is answered "
           "404 X-Cache: MISS on --listen (nginx hands it to Django), 404 not found on --edge"),
    Option("--object-resources", "object_resources", comma_separated, None,
           "per-object poll resources (GET <path-prefix><resource>/<object>?cap=<capability>, "
           "docs/contract.md section 8); unset: none"),
    # the edge (docs/contract.md section 10): polls straight from clients, without nginx
    Option("--edge", "edge", str, None,
           "HOST:PORT of the edge listener: clients reach it without nginx, for GET/HEAD polls, "
           "long-polls, streams and CORS preflights only; a miss there sends the client to the "
           "site (409 {\"error\":...,\"retry\":\"site\"}; a stream: event: miss); unset: no edge"),
    Option("--edge-origins", "edge_origins", comma_separated, None,
           "comma-separated page origins (exact, e.g. https://www.example.com) whose scripts may "
           "read edge answers with credentials (CORS); unset: none"),
    Option("--edge-max-connections", "edge_max_connections", int, 2048,
           "open edge connections per worker; more are closed at once", 1, 1 << 20,
           c_field="edge_max_connections"),
    Option("--edge-max-per-address", "edge_max_per_address", int, 64,
           "held edge connections (long-polls and streams) per client address, per worker; "
           "beyond it 429 with Retry-After; 0: no cap", 0, 1 << 20, c_field="edge_max_per_address"),
    Option("--edge-max-conns-per-address", "edge_max_conns_per_address", int, None,
           "open edge connections per client address (IPv4, IPv6 /64), per worker; beyond it a "
           "new one is closed at once; 0: no cap; unset: 2 x --edge-max-per-address",
           0, 1 << 20, c_field="edge_max_conns_per_address"),
    Option("--max-held-per-user", "max_held_per_user", int, 0,
           "held connections (long-polls and streams) per user (the token's uid), per worker, on "
           "both listeners; beyond it 429 with Retry-After; 0: no cap (give one, e.g. 32, when "
           "--edge faces the internet)", 0, 1 << 20,
           c_field="max_held_per_user"),
    Option("--edge-header-timeout", "edge_header_timeout", int, 10,
           "seconds an edge request may take to arrive from its first byte (slowloris; silence "
           "is cut by --idle-timeout)", 1, 3600, c_field="edge_header_timeout_s"),
    Option("--backend", "backend", str, None, "libevent backend (default: libevent's best)",
           choices=BACKENDS),
    # the names a Django project chooses (docs/contract.md sections 2-3; fastpoll passes them)
    Option("--cookie-name", "cookie_name", str, "fastpoll_token",
           "the cookie that carries the token (when no Authorization: Bearer)", c_field="cookie_name",
           pattern=re.compile(r"\A[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}\Z"),
           grammar="1-64 RFC 6265 token characters (letters, digits, !#$%&'*+-.^_`|~)"),
    Option("--path-prefix", "path_prefix", str, "/Poll/",
           "polls are GET <prefix><resource>", c_field="path_prefix",
           pattern=re.compile(r"\A(?=.{1,64}\Z)/(?:(?!\.\.?/)[A-Za-z0-9._~-]+/)+\Z"),
           grammar="at most 64 characters, starting and ending with /, one or more segments of "
                   "letters, digits, . _ ~ - (not . or ..), for example /Poll/ (not / alone: "
                   "the whole site would be polls)"),
    Option("--key-prefix", "key_prefix", str, "p1",
           "memcached keys are <prefix>:<resource>:<uid>:<epoch>", c_field="key_prefix",
           pattern=re.compile(r"\A[A-Za-z0-9_-]{1,16}\Z"),
           grammar="1-16 letters, digits, _ or -"),
)
_BY_ATTR = {opt.attr: opt for opt in OPTIONS}


def build_parser():
    """The argparse parser of ``python -m fastpath``.  Only the flags given end up in the
    namespace, so ``Options(**vars(args))`` takes every default from the table."""
    p = argparse.ArgumentParser(
        prog="python -m fastpath", argument_default=argparse.SUPPRESS,
        description="Answer GET <path-prefix><resource> polls straight from memcached.  On --listen "
                    "(behind nginx) a poll left to Django (a miss, credentials or a head fastpath "
                    "does not read as Django would) is answered 404 X-Cache: MISS, or 503 X-Cache: "
                    "MISS when memcached fails, and nginx hands it to Django.  On --edge (clients "
                    "without nginx) such a poll is answered 409 {\"retry\":\"site\"} (the client "
                    "asks the site once, then the edge again), and a head fastpath cannot read is "
                    "refused (431, 400).")
    for opt in OPTIONS:
        p.add_argument(opt.flag, dest=opt.attr, type=opt.type, choices=opt.choices,
                       help=opt.help_text())
    return p


def command_line(**values):
    """The flags that run ``python -m fastpath`` with ``values`` (Options attribute names, as
    serve() takes them); a value of None is left out (fastpath's default applies)."""
    argv = []
    for attr in values:
        if attr not in _BY_ATTR:
            raise TypeError(f"command_line() got an unexpected keyword argument {attr!r}")
    for opt in OPTIONS:
        value = values.get(opt.attr)
        if value is not None:
            argv += [opt.flag, opt.format(opt.coerce(value))]
    return argv


def parse_address(text, what="address"):
    """``host:port`` / ``[v6]:port`` -> (host, port)."""
    text = text.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not host or not is_decimal(port) or not 0 < int(port) < 65536:
        raise ConfigurationError(f"bad {what} {text!r}: expected host:port")
    return host, int(port)


def parse_notify_udp(text, workers):
    """``--notify-udp HOST:PORT`` -> (host, port): a numeric address (every host of a cluster
    names it the same way), and a port range PORT..PORT+workers-1 that fits."""
    host, port = parse_address(text, "--notify-udp")
    if not _is_numeric(host):
        raise ConfigurationError(f"--notify-udp {text}: give a numeric address, for example 10.0.0.21:{port}")
    if port + workers - 1 > 65535:
        raise ConfigurationError(f"--notify-udp {text}: {workers} workers need ports {port}..{port + workers - 1}, "
                                 f"beyond 65535; give a lower port")
    return host, port


def parse_listen(text):
    """``host:port``, or ``unix:/path`` for a unix-domain socket (nginx on the same host)."""
    if text.startswith("unix:"):
        path = text[5:]
        usage = f"bad --listen {text!r}: unix:<path of at most {_SUN_PATH_MAX} bytes>"
        if not path:
            raise ConfigurationError(usage)
        # measured as it is bound: a relative path becomes absolute, and longer
        path = os.path.abspath(path)
        if len(os.fsencode(path)) > _SUN_PATH_MAX:
            raise ConfigurationError(f"{usage} (its absolute path has {len(os.fsencode(path))})")
        return ("unix", path)
    return parse_address(text, "--listen")


def check_notify_dir(path, workers):
    """Worker i binds ``<dir>/<i>.sock`` (fp_notify.c), as given: the longest must fit in
    sun_path, or every worker fails in C and the supervisor restarts them for nothing."""
    name = f"{workers - 1}.sock"
    size = len(os.fsencode(f"{path}/{name}"))
    if size > _SUN_PATH_MAX:
        raise ConfigurationError(f"--notify-dir {path}: worker {workers - 1}'s socket <dir>/{name} is "
                                 f"{size} bytes, over the {_SUN_PATH_MAX} of a unix socket path; "
                                 f"give a shorter directory")


def _bound_addresses(host, port):
    """The addresses a socket that binds (host, port) takes, as activation.tcp_listen_socket
    binds it (a name resolved in the family its spelling gives); empty if it does not resolve
    (binding says why)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return set()
    addrs = {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}
    return {getattr(a, "ipv4_mapped", None) or a for a in addrs}


def check_admin_apart(listen_addr, admin_addr, listen, admin, flag="--admin", other="--listen"):
    """--admin (or --edge: ``flag``) on --listen's (or ``other``'s) port and address: both bind
    with SO_REUSEPORT, so the kernel would share the connections out between the two listeners
    (polls answered 404)."""
    if listen_addr[0] == "unix" or listen_addr[1] != admin_addr[1]:
        return
    polls, stats = _bound_addresses(*listen_addr), _bound_addresses(*admin_addr)
    # a wildcard takes the port on every address of its family, and :: on IPv4's too (dual
    # stack); the kernel prefers the exact address, so polls sent to it would reach admin
    wildcard = any(p.is_unspecified and (p.version == 6 or s.version == 4) for p in polls for s in stats)
    if polls & stats or wildcard:
        raise ConfigurationError(f"{flag} {admin} is the address of {other} {listen}; "
                                 f"give {flag} another port")


def secret_key(raw, path, error=FastpathError, wrong_length=_SECRET_WRONG_LENGTH):
    """The key bytes of docs/contract.md section 1 in a secret file's bytes ``raw``: stripped
    of " \t\r\n", 32..1024 of them, else ``error`` with ``wrong_length`` (a str.format of
    ``path``, ``low``, ``high``, ``length``).  fastpoll reads the same file through it."""
    key = raw.strip(b" \t\r\n")
    if not _SECRET_MIN <= len(key) <= _SECRET_MAX:
        raise error(wrong_length.format(path=path, low=_SECRET_MIN, high=_SECRET_MAX, length=len(key)))
    return key


def read_secret(path, error=FastpathError, wrong_length=_SECRET_WRONG_LENGTH):
    """The key bytes of the secret file at ``path`` (``secret_key``; ``error`` when unreadable)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_SECRET_MAX + 64)
    except OSError as exc:
        raise error(f"cannot read secret file {path}: {exc.strerror}") from None
    return secret_key(raw, path, error, wrong_length)


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_numeric(host):
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def connect_address(host, port):
    """The numeric ``host:port`` (``[v6]:port``) C connects to for a memcached server.  A host
    name is resolved here, once, to the first address getaddrinfo gives: the one pymemcache
    connects to for the same name."""
    if not _is_numeric(host):
        try:
            infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM,
                                       socket.IPPROTO_TCP)
        except (socket.gaierror, UnicodeError) as exc:
            reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a valid host name"
            raise FastpathError(f"--memcached server {host}:{port}: cannot resolve {host!r} "
                                f"({reason}); give a numeric address such as 127.0.0.1:{port}") from None
        host = infos[0][4][0]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Options:
    """Every setting of a fastpath run: one typed attribute per row of OPTIONS (its default when
    not given), plus ``secret`` (bytes; overrides ``secret_file``, one of the two is required; Python only).  ``validate()``
    checks them and derives ``listen_addr``, ``admin_addr``, ``node_names``, ``node_addrs`` and
    ``notify_udp_addr``."""
    __slots__ = tuple(_BY_ATTR) + ("secret", "listen_addr", "admin_addr", "node_names", "node_addrs",
                                   "notify_udp_addr", "edge_addr")

    def __init__(self, **kwargs):
        for name in kwargs:
            if name not in _BY_ATTR and name != "secret":
                raise TypeError(f"Options() got an unexpected keyword argument {name!r}")
        for opt in OPTIONS:
            setattr(self, opt.attr, kwargs.get(opt.attr, opt.default))
        self.secret = kwargs.get("secret")
        self.listen_addr = self.admin_addr = self.node_names = self.node_addrs = None
        self.notify_udp_addr = self.edge_addr = None

    def __setattr__(self, name, value):
        opt = _BY_ATTR.get(name)
        if opt is not None:
            value = opt.coerce(value)
        elif name == "secret" and value is not None and not isinstance(value, bytes):
            raise TypeError(f"secret must be bytes, not {type(value).__name__}")
        object.__setattr__(self, name, value)

    def __repr__(self):
        return (f"Options(listen={self.listen!r}, memcached={self.memcached!r}, "
                f"workers={self.workers}, admin={self.admin!r})")

    def validate(self):
        """Check every option (ConfigurationError; FastpathError for a secret file that cannot
        be read or a memcached host name that does not resolve) and derive the addresses."""
        if self.secret is None and self.secret_file is None:
            raise ConfigurationError(_SECRET_REQUIRED)
        if self.edge_max_conns_per_address is None:
            self.edge_max_conns_per_address = min(2 * self.edge_max_per_address, 1 << 20)
        for opt in OPTIONS:
            opt.check(getattr(self, opt.attr))
        self.listen_addr = parse_listen(self.listen)
        self.admin_addr = parse_address(self.admin, "--admin") if self.admin else None
        if self.admin_addr:
            if not is_loopback(self.admin_addr[0]):
                raise ConfigurationError("--admin must be a loopback address (stats are not public)")
            check_admin_apart(self.listen_addr, self.admin_addr, self.listen, self.admin)
        self._validate_edge()
        if not self.resources and not self.object_resources:
            raise ConfigurationError(_RESOURCES_REQUIRED)
        for res in self.resources or ():
            if not _RESOURCE_RE.match(res):
                raise ConfigurationError(f"bad resource name {res!r}: 1-32 letters, digits or _")
        if len(self.resources or ()) > 16:
            raise ConfigurationError("--resources takes at most 16 names")
        for res in self.object_resources or ():
            if not _RESOURCE_RE.match(res):
                raise ConfigurationError(f"bad --object-resources name {res!r}: 1-32 letters, digits or _")
        if len(self.object_resources or ()) > 16:
            raise ConfigurationError("--object-resources takes at most 16 names")
        if not 0 < len(self.memcached) <= 64:
            raise ConfigurationError("--memcached needs 1..64 host:port servers")
        parsed = [parse_address(s, "--memcached server") for s in self.memcached]
        # node names as pymemcache spells them (v6 host without brackets, a host name as
        # written: it hashes the name), so keys land where Django puts them
        self.node_names = [f"{h}:{p}" for h, p in parsed]
        if len(set(self.node_names)) != len(self.node_names):
            raise ConfigurationError("--memcached lists a server twice")
        self.node_addrs = [connect_address(h, p) for h, p in parsed]
        if self.secret is None:
            self.secret = read_secret(self.secret_file)
        elif not _SECRET_MIN <= len(self.secret) <= _SECRET_MAX:
            raise ConfigurationError("secret must be 32..1024 bytes")
        if self.workers == 0:
            self.workers = os.cpu_count() or 1
        if self.notify_dir:
            check_notify_dir(self.notify_dir, self.workers)
        self.notify_udp_addr = parse_notify_udp(self.notify_udp, self.workers) if self.notify_udp else None
        return self

    def _validate_edge(self):
        """--edge apart from --listen and --admin, and its origins exact (unused without it)."""
        for entry in self.edge_origins or ():
            match = _ORIGIN_RE.match(entry)
            if not match:
                raise ConfigurationError(
                    f"bad --edge-origins entry {entry!r}: an origin as a browser sends it, "
                    f"scheme://host[:port] in lower case without a path, e.g. https://www.example.com")
            scheme, host, port = match.groups()
            port = None if port is None else int(port)
            sent = origin(scheme, host, port)
            if sent != entry:
                why = ("a browser never sends its scheme's default port in an Origin" if port == _DEFAULT_PORTS[scheme]
                       else "a browser writes a port without leading zeros")
                raise ConfigurationError(f"bad --edge-origins entry {entry!r}: {why}, so it would never match; "
                                         f"write {sent!r}")
        if len(self.edge_origins or ()) > _MAX_ORIGINS:
            raise ConfigurationError(f"--edge-origins takes at most {_MAX_ORIGINS} origins")
        if not self.edge:
            return
        self.edge_addr = parse_address(self.edge, "--edge")
        check_admin_apart(self.listen_addr, self.edge_addr, self.listen, self.edge, "--edge")
        if self.admin_addr:
            check_admin_apart(self.admin_addr, self.edge_addr, self.admin, self.edge, "--edge", "--admin")

    def avoid_backends(self):
        return [b for b in BACKENDS if self.backend and b != self.backend]
