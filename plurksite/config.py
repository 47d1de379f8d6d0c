"""The one source of configuration: ``PLURK_*`` environment variables with documented defaults.

``VARIABLES`` is the table: one row per variable with its name, the :class:`StackConfig` field it
sets, its parser, its formatter, its default and its help.  Generated from it: the parsed
configuration (``StackConfig.from_env``), the environment handed to every child
(``StackConfig.to_env``) and the README's configuration table (``variables_table``; rewrite it
with ``python -m plurksite.config``).  Django settings, the stack runner, the nginx template and
fastpath's flags are all derived from :class:`StackConfig`; nothing else reads these variables.
Importing this module must stay cheap and Django-free (the runner and the benchmarks use it too).
"""
import dataclasses
import os
import re
from urllib.parse import urlsplit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ConfigError(ValueError):
    """A ``PLURK_*`` variable has a value we cannot use; the message names it and the fix."""


# PLURK_ROLES: `all` is the single-host stack, exactly the roles it implies (no balancer: a host
# runs one nginx, either the web one or the balancer).
ROLES = ("all", "web", "balancer", "memcached", "repair")
ALL_ROLES = ("web", "memcached", "repair")


def _resolve(path, base=ROOT):
    return path if os.path.isabs(path) else os.path.join(base, path)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _boolean(name, value):
    word = value.strip().lower()
    if word not in _TRUE + _FALSE:
        raise ConfigError(f"{name}={value!r}: expected 1 or 0 (also true/false, yes/no, on/off)")
    return word in _TRUE


def _check_database_url(url):
    """sqlite:///relative/path, sqlite:////absolute/path or postgres://user:pw@host:port/name."""
    parts = urlsplit(url)
    example = "use sqlite:///var/plurk.sqlite3 (relative to the checkout), sqlite:////abs/path or postgres://..."
    if parts.scheme == "sqlite":
        if not url.startswith("sqlite:///") or not url[len("sqlite:///"):].strip("/"):
            raise ConfigError(f"PLURK_DATABASE_URL={url!r}: {example}")
    elif parts.scheme in ("postgres", "postgresql"):
        try:
            parts.port
        except ValueError:
            raise ConfigError(f"PLURK_DATABASE_URL={url!r}: the port must be a number from 1 to 65535") from None
        if not parts.path.strip("/"):         # no host is libpq's local socket; no name is an error
            raise ConfigError(f"PLURK_DATABASE_URL={url!r}: name the database, postgres://user:password@host:port/name")
    else:
        raise ConfigError(f"PLURK_DATABASE_URL={url!r}: {example}")
    return url


def parse_hostport(name, value):
    """``host:port`` or ``[v6]:port`` -> (host, port); host is returned without brackets.  The
    grammar is fastpath's (its --listen, --admin and --memcached read these very values)."""
    from fastpath.errors import ConfigurationError
    from fastpath.options import parse_address

    try:
        return parse_address(value)
    except ConfigurationError:
        raise ConfigError(f"{name}={value.strip()!r}: expected host:port, for example 127.0.0.1:8080") from None


def parse_listen(name, value, base=ROOT):
    """``parse_hostport``, or ``unix:<path>`` -> ("unix", absolute path; a relative one is under
    ``base``).  The pair formats back as ``unix:/path`` with format_hostport, which is also how
    nginx names such an upstream."""
    value = value.strip()
    if value.startswith("unix:"):
        if not value[5:]:
            raise ConfigError(f"{name}={value!r}: expected unix:<path>, for example unix:/run/plurk/fastpath.sock")
        path = _resolve(value[5:], base)
        if len(os.fsencode(path)) > 107:      # sun_path holds 108 bytes with the NUL
            raise ConfigError(f"{name}={value!r}: the socket path {path} is over 107 bytes; set {name} "
                              f"to a shorter unix:/path (or a host:port)")
        return ("unix", path)
    return parse_hostport(name, value)


def parse_notify_dir(name, value, var_dir):
    """The notice directory: absolute (a relative one is under the var dir, like the fastpath
    socket), or None for ``off``/empty.  Its sockets are ``<index>.sock``, so the directory
    leaves room in sun_path for a worker index."""
    value = value.strip()
    if value.lower() in ("", "off"):
        return None
    path = _resolve(value, var_dir)
    if len(os.fsencode(path)) > 107 - len("/999.sock"):
        raise ConfigError(f"{name}={value!r}: the directory {path} is too long for its sockets "
                          f"(<dir>/<worker>.sock must fit 107 bytes); set a shorter path or off")
    return path


def parse_notify(name, value, var_dir):
    """PLURK_FASTPATH_NOTIFY -> (directory or None, udp entries): ``off``/empty, a directory
    (parse_notify_dir), or a comma list of ``udp:HOST:PORT`` / ``udp:HOST:FIRST-LAST`` entries,
    each (host, first, last) with a numeric host (every host of a cluster reads the same list
    and must recognise its own address)."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not any(p.lower().startswith("udp:") for p in parts):
        return parse_notify_dir(name, value, var_dir), ()
    entries = []
    for part in parts:
        if not part.lower().startswith("udp:"):
            raise ConfigError(f"{name}={value.strip()!r}: {part!r} is not a udp: entry; give either one "
                              f"directory or only udp:HOST:FIRST-LAST entries")
        entries.append(_parse_udp_entry(name, part))
    taken = {}
    for host, first, last in entries:
        for port in range(first, last + 1):
            if (host, port) in taken:
                raise ConfigError(f"{name}: {format_hostport(host, port)} is in two entries; give each "
                                  f"port once")
            taken[host, port] = True
    return None, tuple(entries)


def _parse_udp_entry(name, part):
    import ipaddress

    from fastpath.options import is_decimal

    rest = part[4:]
    if rest.startswith("["):
        host, sep, ports = rest[1:].partition("]:")
    else:
        host, sep, ports = rest.rpartition(":")
    first, dash, last = ports.partition("-")
    example = "for example udp:10.77.0.21:9100-9101"
    if not sep or not host or not is_decimal(first) or (dash and not is_decimal(last)):
        raise ConfigError(f"{name}: bad entry {part!r}: expected udp:HOST:PORT or udp:HOST:FIRST-LAST, {example}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{name}: bad entry {part!r}: HOST must be a numeric address, {example}") from None
    first, last = int(first), int(last) if dash else int(first)
    if not 0 < first <= 65535 or not 0 < last <= 65535:
        raise ConfigError(f"{name}: bad entry {part!r}: ports are 1..65535")
    if last < first:
        raise ConfigError(f"{name}: bad entry {part!r}: the last port is below the first")
    return host, first, last


def _format_udp_entry(host, first, last):
    ports = str(first) if first == last else f"{first}-{last}"
    return f"udp:[{host}]:{ports}" if ":" in host else f"udp:{host}:{ports}"


def _others_can_search(path):
    """Every existing directory from / down to path lets "other" users search it (o+x); the
    ones still to be made are made 0755 by the runner."""
    path = os.path.abspath(path)
    while True:
        try:
            if not os.stat(path).st_mode & 0o001:
                return False
        except FileNotFoundError:
            pass
        except OSError:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def default_fastpath_socket(var_dir):
    """PLURK_FASTPATH when it is not set: ``unix:run/fastpath.sock`` under the var dir.  Run as
    root, nginx's workers drop to nobody, who cannot reach a var dir under a private directory
    (a checkout in /root is 0700): then the socket goes to /run/plurk/<digest of the var dir>/,
    one directory per stack, which the runner makes reachable.  An explicit PLURK_FASTPATH is
    never moved: the runner checks it and refuses to start when nginx cannot reach it."""
    default = _BY_NAME["PLURK_FASTPATH"].default
    if os.geteuid() != 0 or _others_can_search(var_dir):
        return default
    import hashlib
    digest = hashlib.sha1(os.fsencode(var_dir)).hexdigest()[:12]
    return f"unix:/run/plurk/{digest}/fastpath.sock"


def is_loopback(host):
    from fastpath.options import is_loopback as fastpath_is_loopback

    return fastpath_is_loopback(host)


def is_local_address(host):
    """True when ``host`` is an address of one of this host's (this network namespace's)
    interfaces: binding to it succeeds.  Every host of a cluster reads the same lists
    (PLURK_MEMCACHED, the notice destinations) and serves the entries that are its own."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))
    except OSError:
        return False
    return True


def parse_roles(value):
    """PLURK_ROLES -> the roles in ROLES order, each once."""
    names = [r.strip().lower() for r in value.split(",") if r.strip()]
    choices = "all, or a comma list of web, balancer, memcached, repair"
    if not names:
        raise ConfigError(f"PLURK_ROLES is empty: expected {choices}")
    unknown = [r for r in names if r not in ROLES]
    if unknown:
        raise ConfigError(f"PLURK_ROLES={value.strip()!r}: unknown role {unknown[0]!r}; expected {choices}")
    if "all" in names and set(names) != {"all"}:
        raise ConfigError(f"PLURK_ROLES={value.strip()!r}: all already means web, memcached and repair; "
                          f"give all alone, or list the roles")
    if "balancer" in names and "web" in names:
        raise ConfigError(f"PLURK_ROLES={value.strip()!r}: balancer and web are both nginx on PLURK_HTTP; "
                          f"run them on two hosts (PLURK_ROLES=balancer on one, web on the others)")
    return tuple(r for r in ROLES if r in names)


def parse_hostport_list(name, value):
    """A comma-separated ``host:port`` list (empty entries ignored), each entry once."""
    entries = tuple(parse_hostport(name, s) for s in value.split(",") if s.strip())
    if len(set(entries)) != len(entries):
        raise ConfigError(f"{name} lists an address twice")
    return entries


_HOST_NAME = re.compile(r"^\.?[A-Za-z0-9_.-]+$|^\[[0-9A-Fa-f:.]+\]$")


def parse_host_names(name, value):
    """A comma-separated list of host names or addresses, as Django's ALLOWED_HOSTS takes them
    (a leading dot: the domain and its subdomains; an IPv6 address in brackets)."""
    names = tuple(s.strip() for s in value.split(",") if s.strip())
    for host in names:
        if not _HOST_NAME.match(host):
            raise ConfigError(f"{name}={value.strip()!r}: {host!r} is not a host name; expected names or "
                              f"addresses without port, for example 10.77.0.10,plurk.example.com")
    return names


def parse_networks(name, value):
    """A comma-separated list of addresses or CIDR networks (nginx's set_real_ip_from takes
    both) -> their normalised texts (``10.77.0.10/32`` for an address)."""
    import ipaddress

    networks = []
    for part in (s.strip() for s in value.split(",")):
        if not part:
            continue
        try:
            network = ipaddress.ip_network(part, strict=False)
        except ValueError:
            raise ConfigError(f"{name}={value.strip()!r}: {part!r} is not an address or network; expected "
                              f"addresses or CIDRs, for example 10.77.0.10,10.77.1.0/24") from None
        if network.prefixlen < (8 if network.version == 4 else 32):
            raise ConfigError(f"{name}={value.strip()!r}: {part!r} would trust the forwarded headers of "
                              f"clients anywhere (anyone could claim any address and escape the per-address "
                              f"caps); give the balancers' own addresses or subnet, for example 10.77.0.10")
        networks.append(str(network))
    return tuple(dict.fromkeys(networks))


def format_hostport(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---- the table: one row per PLURK_* variable ---------------------------------------------------
#
# Each parser is ``parse(name, value, get)``: ``value`` is the variable's text (its default when
# unset), ``get(other)`` another variable's text (for the two that live under PLURK_VAR_DIR).  It
# returns the StackConfig field's value, or raises ConfigError with one line naming the variable.

def _var_dir(get):
    return _resolve(get("PLURK_VAR_DIR"))


def _address(name, value, get):
    return parse_hostport(name, value)


def _fastpath_listen(name, value, get):
    return parse_listen(name, value, base=_var_dir(get))


def _memcached_servers(name, value, get):
    servers = [s for s in value.split(",") if s.strip()]
    if not servers:
        raise ConfigError(f"{name} is empty: give at least one host:port")
    memcached = tuple(parse_hostport(name, s) for s in servers)
    if len(set(memcached)) != len(memcached):
        raise ConfigError(f"{name} lists a server twice")
    return memcached


def _database_url(name, value, get):
    return _check_database_url(value)


def _secret_file(name, value, get):
    if not value.strip():
        raise ConfigError(f"{name} is empty: give the secret file's path, for example var/secret.key")
    return _resolve(value)


def _path(name, value, get):
    return _resolve(value)


def _integer(low, high, empty=False):
    """A parser of a whole number from ``low`` to ``high`` (``empty``: also of "", which is
    None: the consumer's own default)."""
    def parse(name, value, get):
        if empty and not value.strip():
            return None
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or not low <= number <= high:
            raise ConfigError(f"{name}={value!r}: expected a whole number from {low} to {high}"
                              f"{' or nothing' if empty else ''}")
        return number
    return parse


def _boolean_parser(name, value, get):
    return _boolean(name, value)


def _notify(name, value, get):
    return parse_notify(name, value, _var_dir(get))


def _roles(name, value, get):
    return parse_roles(value)


def _host_names(name, value, get):
    return parse_host_names(name, value)


def _networks(name, value, get):
    return parse_networks(name, value)


def _hostport_list(name, value, get):
    return parse_hostport_list(name, value)


def _edge(name, value, get):
    """PLURK_EDGE: host:port, or None when empty (no edge)."""
    return parse_hostport(name, value) if value.strip() else None


def _edge_url(name, value, get):
    """PLURK_EDGE_URL: an origin (http(s)://host[:port], no path), or None when empty."""
    value = value.strip()
    if not value:
        return None
    parts = urlsplit(value)
    try:
        parts.port
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.path or \
            parts.query or parts.fragment or "@" in parts.netloc:
        raise ConfigError(f"{name}={value!r}: expected the URL browsers reach the edge by, http(s)://host[:port] "
                          f"without a path, for example https://poll.example.com")
    return value


def _cookie_domain(name, value, get):
    """PLURK_COOKIE_DOMAIN: a domain such as .example.com, or None when empty."""
    value = value.strip()
    if not value:
        return None
    labels = value.lstrip(".").split(".")
    if len(labels) < 2 or not all(label and all(c.isalnum() or c == "-" for c in label) for label in labels) \
            or not value.isascii():
        raise ConfigError(f"{name}={value!r}: expected the site's registrable domain or a parent of it, "
                          f"for example .example.com (a browser refuses a cookie for a public suffix such as .com)")
    return value


def _origins(name, value, get):
    """PLURK_EDGE_ORIGINS: the page origins the edge answers with CORS, each as a browser sends it."""
    from fastpath.errors import ConfigurationError
    from fastpath.options import Options

    origins = tuple(o.strip() for o in value.split(",") if o.strip())
    try:
        Options(edge_origins=origins)._validate_edge()      # fastpath's own reading of an origin
    except ConfigurationError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    return origins


def default_edge_origins(get):
    """PLURK_EDGE_ORIGINS when it is not set: the origin of PLURK_HTTP (and its localhost name
    when it is loopback, as `make run` prints both), and each name of PLURK_PUBLIC_HOSTS on the
    site's scheme (https with PLURK_HTTPS, at the default port: a balancer's) except wildcards,
    which no origin list can name."""
    from fastpath.options import origin      # as a browser sends it: the form fastpath's check takes

    host, port = parse_hostport("PLURK_HTTP", get("PLURK_HTTP"))
    origins = []
    if not _unspecified(host):
        origins.append(origin("http", host, port))
    if is_loopback(host) and host != "localhost":
        origins.append(origin("http", "localhost", port))
    scheme = "https" if _boolean("PLURK_HTTPS", get("PLURK_HTTPS")) else "http"
    origins += [origin(scheme, name) for name in parse_host_names("PLURK_PUBLIC_HOSTS", get("PLURK_PUBLIC_HOSTS"))
                if not name.startswith(".")]
    return ",".join(dict.fromkeys(origins))


def _unspecified(host):
    """0.0.0.0 or ::, which a listen takes and no browser sends in an Origin."""
    import ipaddress
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _text(value):
    return str(value)


def _optional(value):
    return "" if value is None else str(value)


def _optional_address(addr):
    return "" if addr is None else format_hostport(*addr)


def _joined(values):
    return ",".join(values)


def _an_address(addr):
    return format_hostport(*addr)


def _addresses(addrs):
    return ",".join(format_hostport(*hp) for hp in addrs)


def _on_off(flag):
    return "1" if flag else "0"


def _notice_targets(pair):
    directory, udp = pair
    return ",".join(_format_udp_entry(*e) for e in udp) or directory or "off"


@dataclasses.dataclass(frozen=True)
class Variable:
    """One ``PLURK_*`` variable: its name, the StackConfig field it sets (a tuple: several, the
    parser then returns one value each), its parser and formatter (``format(parse(text))`` is
    text that parses back to the same value: the environment handed to children), its default
    and its help (the README's configuration table)."""
    name: str
    attr: object
    parse: object
    format: object
    default: str
    help: str
    default_of: object = None    # get -> the default, computed from other variables; also for ""

    def value(self, env, get):
        """This variable's text in ``env``, or its default."""
        text = env.get(self.name)
        if self.default_of is not None and not text:
            return self.default_of(get)
        return self.default if text is None else text

    def read(self, config):
        """This variable's field(s) of ``config``."""
        if isinstance(self.attr, tuple):
            return tuple(getattr(config, a) for a in self.attr)
        return getattr(config, self.attr)


def _default_fastpath(get):
    return default_fastpath_socket(_var_dir(get))


# StackConfig is built from these rows (from_env), gives them back (to_env) and the README's
# configuration table is their rendering (variables_table; tests/plurksite/test_config.py fails
# when the README differs).  A new variable is one row here and one StackConfig field.
VARIABLES = (
    Variable("PLURK_HTTP", "http", _address, _an_address, "127.0.0.1:8080",
             "public nginx listen address (the only public port)"),
    Variable("PLURK_DJANGO", "django", _address, _an_address, "127.0.0.1:8000",
             "gunicorn (Django) listen address (must be loopback: only nginx is public)"),
    Variable("PLURK_FASTPATH", "fastpath", _fastpath_listen, _an_address, "unix:run/fastpath.sock",
             "fastpath listen address (nginx only): `unix:<path>` (relative: under `PLURK_VAR_DIR`, "
             "so `var/run/fastpath.sock` by default, or `/run/plurk/<digest>/` when root's nginx workers "
             "cannot reach the var dir; the runner creates its directory and refuses to start "
             "when nginx's workers cannot reach it) or a loopback `host:port` (TCP: "
             "0.8-1.0x nginx's own `memcached_pass`, against 0.85-1.2x over the socket, from run to "
             "run; see [docs/benchmarks.md](docs/benchmarks.md))", default_of=_default_fastpath),
    Variable("PLURK_FASTPATH_ADMIN", "fastpath_admin", _address, _an_address, "127.0.0.1:8002",
             "fastpath's loopback-only stats listener (`/metrics`)"),
    Variable("PLURK_MEMCACHED", "memcached", _memcached_servers, _addresses, "127.0.0.1:11211",
             "comma-separated memcached `host:port` list"),
    Variable("PLURK_DATABASE_URL", "database_url", _database_url, _text, "sqlite:///var/plurk.sqlite3",
             "`sqlite:///relative`, `sqlite:////absolute` or `postgres://user:pw@host:port/db`"),
    Variable("PLURK_SECRET_FILE", "secret_file", _secret_file, _text, "var/secret.key",
             "HMAC secret shared by Django and fastpath; generated (0600) if absent"),
    Variable("PLURK_VAR_DIR", "var_dir", _path, _text, "var",
             "run-time directory: logs, rendered nginx config, pid files, fastpath's socket"),
    Variable("PLURK_DEBUG", "debug", _boolean_parser, _on_off, "0",
             "`1` turns on Django's `DEBUG` (`true`/`yes`/`on` too; `0`, `false`, `no`, `off` or empty: off)"),
    Variable("PLURK_GUNICORN_WORKERS", "gunicorn_workers", _integer(1, 64), _text, "2",
             "gunicorn worker processes"),
    Variable("PLURK_FASTPATH_WORKERS", "fastpath_workers", _integer(0, 64), _text, "0",
             "fastpath worker processes (`0`: one per CPU)"),
    Variable("PLURK_MEMCACHED_TIMEOUT_MS", "memcached_timeout_ms", _integer(1, 10000), _text, "50",
             "how long fastpath and Django wait for memcached"),
    Variable("PLURK_MEMCACHED_MEMORY_MB", "memcached_memory_mb", _integer(8, 65536), _text, "64",
             "memory of each memcached the runner starts"),
    Variable("PLURK_MAX_BODY_KB", "max_body_kb", _integer(1, 16384), _text, "64",
             "largest request body, KiB: nginx, Django and fastpath all enforce it (413 beyond)"),
    Variable("PLURK_FASTPATH_NOTIFY", ("fastpath_notify", "fastpath_notify_udp"), _notify, _notice_targets,
             "run/notify",
             "where Django sends the keys it stored so that fastpath's held long-polls wake at "
             "once: a directory of fastpath's notice sockets (`<worker>.sock`; relative: under "
             "`PLURK_VAR_DIR`), or, for several hosts, a comma list of `udp:HOST:FIRST-LAST` "
             "(or `udp:HOST:PORT`) entries, one port per fastpath worker of that host (Django "
             "sends to every port; each host's fastpath binds its own entry, on a private "
             "address); `off` (or empty): no notices, fastpath re-reads held keys"),
    Variable("PLURK_LONGPOLL_MAX_WAIT_S", "longpoll_max_wait_s", _integer(1, 3600), _text, "55",
             "longest a long-poll (`Prefer: wait=N`) is held by fastpath, seconds "
             "(fastpath's `--max-wait`; nginx waits 15 s more before giving up)"),
    Variable("PLURK_ROLES", "roles", _roles, _joined, "all",
             "what `manage.py runstack` starts on this host: `all` (the whole single-host stack), "
             "or a comma list of `web` (nginx, fastpath, gunicorn), `memcached` (every "
             "`PLURK_MEMCACHED` entry whose address is this host's), `repair` (the cache repairer; "
             "several are safe, one is enough) and `balancer` (nginx in front of `PLURK_WEB_HOSTS`)"),
    Variable("PLURK_WEB_HOSTS", "web_hosts", _hostport_list, _addresses, "",
             "the balancer's web hosts: comma-separated `host:port` list of their `PLURK_HTTP` "
             "(required with the `balancer` role)"),
    Variable("PLURK_PUBLIC_HOSTS", "public_hosts", _host_names, _joined, "",
             "comma-separated host names clients reach the site by, besides `PLURK_HTTP`'s "
             "address (Django answers 400 to any other `Host`): behind a balancer, its address "
             "or the site's name, on every web host"),
    Variable("PLURK_EDGE", "edge", _edge, _optional_address, "127.0.0.1:8003",
             "fastpath's edge listener `host:port` (docs/deploy.md \"The edge\"): pages poll it directly, "
             "without nginx, and ask the site only on a miss; empty: no edge, pages poll through nginx"),
    Variable("PLURK_EDGE_URL", "edge_url", _edge_url, _optional, "",
             "the URL browsers reach the edge by, such as `https://poll.example.com` (empty: "
             "`http://PLURK_EDGE`, given only to pages opened on a loopback address)"),
    Variable("PLURK_EDGE_ORIGINS", "edge_origins", _origins, _joined, "",
             "comma-separated page origins the edge answers with CORS and credentials (empty: "
             "`PLURK_HTTP`'s, and its `localhost` name when loopback, and each `PLURK_PUBLIC_HOSTS` "
             "name on the site's scheme)", default_of=default_edge_origins),
    Variable("PLURK_COOKIE_DOMAIN", "cookie_domain", _cookie_domain, _optional, "",
             "the poll token cookie's Domain (FASTPOLL `COOKIE_DOMAIN`), so that an edge on another "
             "host of the site's domain gets it, for example `.example.com` (empty: host-only)"),
    Variable("PLURK_EDGE_MAX_PER_ADDRESS", "edge_max_per_address", _integer(0, 1 << 20), _text, "64",
             "long-polls and streams the edge holds at once per client address, per fastpath worker "
             "(`--edge-max-per-address`; `0`: no cap).  Behind the balancer's TLS edge every "
             "connection comes from the balancer's address: set `0` there and let "
             "`PLURK_MAX_HELD_PER_USER` cap each user"),
    Variable("PLURK_EDGE_MAX_CONNS_PER_ADDRESS", "edge_max_conns_per_address", _integer(0, 1 << 20, empty=True),
             _optional, "",
             "connections the edge keeps open at once per client address, per fastpath worker, held or "
             "not (`--edge-max-conns-per-address`; beyond it a new one is closed at once; `0`: no cap; "
             "empty: twice `PLURK_EDGE_MAX_PER_ADDRESS`, so its `0` turns this off too)"),
    Variable("PLURK_WEB_EDGES", "web_edges", _hostport_list, _addresses, "",
             "the balancer's: comma-separated `host:port` list of the web hosts' `PLURK_EDGE`; with "
             "its certificate, the balancer terminates TLS for them on its https address at port "
             "8443 (nginx `stream`, docs/deploy.md \"The edge over TLS\"); empty: no edge there"),
    Variable("PLURK_TRUSTED_PROXIES", "trusted_proxies", _networks, _joined, "",
             "comma-separated addresses or CIDRs of the balancer(s) in front of this web host: only "
             "from them does nginx take the client's address (`X-Forwarded-For`), the scheme "
             "(`X-Forwarded-Proto`) and the request id (`X-Request-ID`); empty: this host faces "
             "clients itself and ignores those headers"),
    Variable("PLURK_HTTPS", "https", _boolean_parser, _on_off, "0",
             "`1`: the site is served over HTTPS (at the balancer): Django's session and CSRF "
             "cookies are `Secure` (the poll token's is whenever the request came over HTTPS); "
             "a web host refuses it without `PLURK_TRUSTED_PROXIES` (it would see plain http)"),
    Variable("PLURK_HSTS_SECONDS", "hsts_seconds", _integer(0, 2 ** 31 - 1), _text, "0",
             "`Strict-Transport-Security: max-age` Django sends on HTTPS answers (`0`: none)"),
    Variable("PLURK_HELD_PER_ADDRESS", "held_per_address", _integer(0, 1 << 20), _text, "256",
             "long-polls and streams nginx holds at once per client address (`limit_conn`; beyond "
             "it a JSON 429 with `Retry-After`; `0`: no cap); on the balancer, connections open at "
             "once per client address to its TLS edge (8443, `PLURK_WEB_EDGES`; beyond it closed)"),
    Variable("PLURK_MAX_HELD_PER_USER", "max_held_per_user", _integer(0, 1 << 20), _text, "32",
             "long-polls and streams fastpath holds at once per user, per worker, through nginx and "
             "the edge (`--max-held-per-user`; beyond it 429 with `Retry-After`; `0`: no cap)"),
    Variable("PLURK_NGINX_LOG_KB", "nginx_log_kb", _integer(0, 1 << 30), _text, "65536",
             "`manage.py runstack` rotates nginx's logs past this size, KiB (`<log>.1` .. `<log>.4`, "
             "then `nginx -s reopen`); `0`: never (logrotate or the journal does, docs/deploy.md)"),
)
_BY_NAME = {var.name: var for var in VARIABLES}

README_START = "<!-- variables:start (generated from plurksite.config.VARIABLES: python -m plurksite.config) -->"
README_END = "<!-- variables:end -->"


def variables_table():
    """VARIABLES as the README's Markdown table."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{var.name}` | {f'`{var.default}`' if var.default else '(empty)'} | {var.help} |"
             for var in VARIABLES]
    return "\n".join(rows) + "\n"


def readme_table(readme_text):
    """The configuration table between the README's markers, or None when they are missing."""
    if README_START not in readme_text or README_END not in readme_text:
        return None
    return readme_text.split(README_START, 1)[1].split(README_END, 1)[0].lstrip("\n")


def write_readme(path=os.path.join(ROOT, "README.md")):
    """Rewrite the README's configuration table from VARIABLES."""
    with open(path) as fh:
        text = fh.read()
    if readme_table(text) is None:
        raise SystemExit(f"{path} has no {README_START} ... {README_END} markers")
    head, rest = text.split(README_START, 1)
    tail = rest.split(README_END, 1)[1]
    with open(path, "w") as fh:
        fh.write(f"{head}{README_START}\n{variables_table()}{README_END}{tail}")


@dataclasses.dataclass(frozen=True)
class StackConfig:
    """The parsed PLURK_* variables: each field is set by one VARIABLES row."""
    http: tuple
    django: tuple
    fastpath: tuple                 # (host, port), or ("unix", absolute path)
    fastpath_admin: tuple
    memcached: tuple                # ((host, port), ...)
    database_url: str
    secret_file: str
    var_dir: str
    debug: bool
    gunicorn_workers: int
    fastpath_workers: int
    memcached_timeout_ms: int
    memcached_memory_mb: int
    max_body_kb: int
    fastpath_notify: str            # absolute directory, or None: no unix notices
    fastpath_notify_udp: tuple      # ((host, first port, last port), ...): UDP notices
    longpoll_max_wait_s: int
    roles: tuple                    # parse_roles(): ROLES order, each once
    web_hosts: tuple                # ((host, port), ...): the balancer's upstreams
    public_hosts: tuple             # extra Django ALLOWED_HOSTS
    edge: tuple                     # (host, port) of fastpath's edge listener, or None
    edge_url: str                   # the URL browsers reach the edge by, or None: derived
    edge_origins: tuple             # page origins the edge answers with CORS
    cookie_domain: str              # the poll cookie's Domain, or None: host-only
    trusted_proxies: tuple          # networks (text) nginx takes X-Forwarded-* from
    https: bool                     # served over HTTPS: Secure session/CSRF cookies
    hsts_seconds: int               # SECURE_HSTS_SECONDS
    held_per_address: int           # nginx limit_conn on held polls per client address (0: off)
    max_held_per_user: int          # fastpath --max-held-per-user (0: off)
    nginx_log_kb: int               # runstack rotates nginx's logs past this (0: never)
    edge_max_per_address: int       # fastpath --edge-max-per-address (0: off)
    edge_max_conns_per_address: int  # fastpath --edge-max-conns-per-address (0: off; None: its default)
    web_edges: tuple                # ((host, port), ...): the balancer's TLS edge upstreams

    @classmethod
    def from_env(cls, environ=None):
        """The configuration of ``environ`` (default: os.environ), one VARIABLES row per
        variable; ConfigError, one line naming the variable, for a value it cannot use."""
        env = os.environ if environ is None else environ

        def get(name):
            return _BY_NAME[name].value(env, get)

        values = {}
        for var in VARIABLES:
            parsed = var.parse(var.name, var.value(env, get), get)
            values.update(zip(var.attr, parsed) if isinstance(var.attr, tuple) else [(var.attr, parsed)])
        config = cls(**values)
        config.check_ports()
        config.check_roles()
        config.check_edge()
        return config

    def runs(self, role):
        """Whether this host runs ``role`` (``all`` runs web, memcached and repair)."""
        return role in self.roles or ("all" in self.roles and role in ALL_ROLES)

    def check_roles(self):
        if self.web_edges and not self.runs("balancer"):
            raise ConfigError("PLURK_WEB_EDGES is the balancer's (PLURK_ROLES=balancer): on a web host set "
                              "PLURK_EDGE instead, or leave PLURK_WEB_EDGES empty")
        if self.https and self.runs("web") and not self.trusted_proxies:
            # the balancer terminates TLS (a balancer host needs no trusted proxy); a web host
            # behind it that does not believe its X-Forwarded-Proto sees plain http, and Django
            # refuses every browser login and write (CSRF: the https Origin is not its own)
            raise ConfigError("PLURK_HTTPS=1 but PLURK_TRUSTED_PROXIES is empty: this web host would take the "
                              "https site for plain http and refuse every browser login (CSRF 403); set "
                              "PLURK_TRUSTED_PROXIES to the balancer's address, for example 10.77.0.10 "
                              "(127.0.0.1 when it runs on this host)")
        if not self.runs("balancer"):
            return
        if not self.web_hosts:
            raise ConfigError("PLURK_ROLES has balancer but PLURK_WEB_HOSTS is empty: set it to the web hosts' "
                              "PLURK_HTTP, for example 10.77.0.21:8080,10.77.0.22:8080")
        if self.http in self.web_hosts:
            raise ConfigError(f"PLURK_HTTP={format_hostport(*self.http)!r} is also in PLURK_WEB_HOSTS: the "
                              f"balancer would send requests to itself; give it an address of its own")

    def check_edge(self):
        if self.edge and self.edge_url is None and not is_loopback(self.edge[0]):
            raise ConfigError(f"PLURK_EDGE={format_hostport(*self.edge)!r} is not a loopback address: set "
                              f"PLURK_EDGE_URL to the URL browsers reach it by, for example https://poll.example.com")
        if self.edge and self.https and (self.edge_url or "").startswith("http://"):
            raise ConfigError(f"PLURK_HTTPS=1 but PLURK_EDGE_URL={self.edge_url!r} is plain http: a page served "
                              f"over https cannot use it (mixed content, and the Secure poll cookie is not sent); "
                              f"give the edge's https:// URL")
        if self.edge and not self.edge_origins:
            raise ConfigError("PLURK_EDGE_ORIGINS is empty (PLURK_HTTP listens on every address and "
                              "PLURK_PUBLIC_HOSTS names no host): set it to the origins of the site's pages, "
                              "for example https://www.example.com")

    def check_ports(self):
        seen = {}
        for name, addr in [("PLURK_HTTP", self.http), ("PLURK_DJANGO", self.django),
                           ("PLURK_FASTPATH", self.fastpath), ("PLURK_FASTPATH_ADMIN", self.fastpath_admin)] + \
                [("PLURK_MEMCACHED", m) for m in self.memcached] + \
                ([("PLURK_EDGE", self.edge)] if self.edge else []):
            if addr in seen:
                raise ConfigError(f"{name} and {seen[addr]} both use {format_hostport(*addr)}")
            seen[addr] = name
        # only nginx listens publicly: Django and fastpath trust what nginx forwards (X-Forwarded-*,
        # bodies already limited) and fastpath's stats are nobody else's business
        for name, (host, _) in (("PLURK_DJANGO", self.django), ("PLURK_FASTPATH", self.fastpath),
                                ("PLURK_FASTPATH_ADMIN", self.fastpath_admin)):
            if host != "unix" and not is_loopback(host):
                raise ConfigError(f"{name}={format_hostport(host, _)!r}: must be a loopback address such "
                                  f"as 127.0.0.1 (internal service; only PLURK_HTTP is public)")

    def to_env(self):
        """The PLURK_* variables that reproduce this configuration (handed to every child)."""
        return {var.name: var.format(var.read(self)) for var in VARIABLES}

    @property
    def notify_udp_destinations(self):
        """Every port of every udp: entry as ``host:port`` (FASTPOLL["NOTIFY_UDP"]): Django
        sends each notice to all of them."""
        return [format_hostport(host, port) for host, first, last in self.fastpath_notify_udp
                for port in range(first, last + 1)]

    def local_notify_udp(self):
        """The udp: entry this host's fastpath binds (its HOST is an address of this host), or
        None; ConfigError when there are several, or when its port count is not this host's
        fastpath worker count."""
        mine = [e for e in self.fastpath_notify_udp if is_local_address(e[0])]
        if not mine:
            return None
        if len(mine) > 1:
            raise ConfigError(f"PLURK_FASTPATH_NOTIFY has {len(mine)} entries of this host "
                              f"({', '.join(_format_udp_entry(*e) for e in mine)}); give one "
                              f"udp:HOST:FIRST-LAST per host, one port per fastpath worker")
        entry = mine[0]
        ports = entry[2] - entry[1] + 1
        if self.fastpath_workers == 0:
            raise ConfigError(f"PLURK_FASTPATH_NOTIFY entry {_format_udp_entry(*entry)} has one port per "
                              f"fastpath worker: set PLURK_FASTPATH_WORKERS={ports} (0, one per CPU, "
                              f"cannot be matched)")
        if ports != self.fastpath_workers:
            raise ConfigError(f"PLURK_FASTPATH_NOTIFY entry {_format_udp_entry(*entry)} has {ports} "
                              f"port(s) but PLURK_FASTPATH_WORKERS={self.fastpath_workers}: give one port "
                              f"per fastpath worker")
        return entry

    @property
    def site_hosts(self):
        """The Host names this web host answers (Django's ALLOWED_HOSTS, nginx's server_name):
        loopback names, PLURK_HTTP's address and PLURK_PUBLIC_HOSTS; nginx closes any other
        (444) before Django sees it."""
        host = self.http[0]
        return tuple(sorted({"127.0.0.1", "localhost", "[::1]", ".localhost",
                             f"[{host}]" if ":" in host else host, *self.public_hosts}))

    @property
    def max_body_bytes(self):
        return self.max_body_kb * 1024

    @property
    def base_url(self):
        return f"http://{format_hostport(*self.http)}"

    @property
    def memcached_nodes(self):
        """Server names as pymemcache spells them (``host:port``, v6 host without brackets)."""
        return [f"{host}:{port}" for host, port in self.memcached]

    @property
    def memcached_specs(self):
        """Server specs for ``HashClient`` and fastpath's ``--memcached`` (v6 in brackets)."""
        return [format_hostport(host, port) for host, port in self.memcached]

    @property
    def sqlite_path(self):
        """The SQLite file for a sqlite:// URL (relative paths are under the checkout), else None."""
        parts = urlsplit(self.database_url)
        if parts.scheme != "sqlite":
            return None
        path = self.database_url[len("sqlite://"):]
        if path.startswith("//"):        # sqlite:////abs/path
            return path[1:]
        return _resolve(path.lstrip("/"))

    def log_dir(self):
        return os.path.join(self.var_dir, "log")


def load():
    return StackConfig.from_env()


if __name__ == "__main__":
    write_readme()
    print("README.md: configuration table written from plurksite.config.VARIABLES")
