"""Renders this host's nginx config into the run-time directory: nginx/main.conf.template (the
process-level part: user, workers, file limits, temp paths) around the http-level part, which is
nginx/plurk.conf.template (a web host) or nginx/balancer.conf.template (the balancer role).  That
part alone (``render_include``) is what an nginx the operator already runs includes
(``manage.py rendernginx --include``, docs/deploy.md): the same text both ways.  Also says whether
nginx's workers (another user when the runner is root) can reach a path."""
import grp
import os
import pwd
import re
import secrets
import stat
import subprocess

from fastpoll import nginx as fastpoll_nginx

from .config import ROOT, ConfigError, format_hostport
from .services import GUNICORN_KEEPALIVE_S, fastpoll_settings, nginx_conf_path

MAIN_TEMPLATE = os.path.join(ROOT, "nginx", "main.conf.template")
TEMPLATE = os.path.join(ROOT, "nginx", "plurk.conf.template")
BALANCER_TEMPLATE = os.path.join(ROOT, "nginx", "balancer.conf.template")
BALANCER_TLS_TEMPLATE = os.path.join(ROOT, "nginx", "balancer-tls.conf.template")
BALANCER_EDGE_TEMPLATE = os.path.join(ROOT, "nginx", "balancer-edge.conf.template")
# The balancer serves the site over TLS when its var dir holds a certificate chain and its key
# (TLS_FILES in TLS_DIR, Let's Encrypt's names): https on PLURK_HTTP's address at HTTPS_PORT, and
# plain HTTP only redirects there (docs/deploy.md, "TLS").
TLS_DIR = "tls"
TLS_FILES = ("fullchain.pem", "privkey.pem")
# certbot's webroot (certonly --webroot -w <var dir>/acme), served over plain HTTP
ACME_DIR = "acme"
HTTPS_PORT = 443
# The balancer's TLS edge (PLURK_WEB_EDGES): nginx's stream module on the https address at this
# port, in front of the web hosts' edges (nginx/balancer-edge.conf.template).
EDGE_TLS_PORT = 8443
# a web host's read timeout for a long-poll is fastpath's max wait + fastpoll.nginx's
# LONGPOLL_READ_MARGIN_S (15); the balancer's is longer still, so a web host always answers first
BALANCER_READ_MARGIN_S = fastpoll_nginx.LONGPOLL_READ_MARGIN_S + 5
# Idle client keep-alive of every nginx; the balancer's idle upstream connections to a web host's
# nginx are dropped sooner, or it may reuse one the web host has just closed (a 502).
KEEPALIVE_TIMEOUT_S = 65
BALANCER_UPSTREAM_KEEPALIVE_S = KEEPALIVE_TIMEOUT_S - 5
# A web host that fails this many times (refused, timed out) is skipped for this long.
WEB_HOST_MAX_FAILS = 1
WEB_HOST_FAIL_TIMEOUT_S = 5
TEMP_DIRS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
# Connections per nginx worker: the machine's hard limit is 20,000 fds per process, less room for
# listen sockets and logs.  A held poll costs two (the client's, the upstream's).
WORKER_CONNECTIONS = 19000
# Idle upstream connections an nginx worker keeps: one for every client it can carry.  A client
# answered at once asks again, and each of nginx's answers frees an upstream connection: with
# 1,024 kept, an author's post to 10,000 held followers closed ~8,000 of them on both sides and
# the followers' next polls opened them again (bench/longpoll.py fan-out: fastpath's CPU
# 240 -> 50 ms, nginx's 440 -> 340 ms).  nginx's master allocates the slots when it reads the
# configuration: 152 bytes each, 1.4 MB, shared with the workers until they use them.
UPSTREAM_KEEPALIVE = WORKER_CONNECTIONS // 2
# A web host's request-head buffers, pools and timeout (nginx/plurk.conf.template says why these
# sizes), rendered into both of its server blocks: the site's, and the default server that closes
# other Hosts, with whose settings nginx reads every request's head (it knows the Host only after).
HEADER_LIMITS = (
    ("client_header_buffer_size", "1k"),
    ("large_client_header_buffers", "4 8k"),
    ("connection_pool_size", "384"),
    ("request_pool_size", "1k"),
    ("client_header_timeout", "10s"),
)


def header_limits(indent="    "):
    """HEADER_LIMITS as the lines of a server block."""
    return "\n".join(f"{indent}{name} {value};" for name, value in HEADER_LIMITS)


def worker_user():
    """(user, group) nginx's workers run as, or None when they run as the invoking user.

    Running as root (make run on a fresh machine), workers drop to an unprivileged user."""
    if os.geteuid() != 0:
        return None
    for group in ("nogroup", "nobody"):
        try:
            grp.getgrnam(group)
            return ("nobody", group)
        except KeyError:
            continue
    return ("nobody", "nobody")       # what nginx assumes for `user nobody;`


def _user_directive():
    who = worker_user()
    if who is None:
        return "# not root: workers run as the invoking user"
    return f"user {who[0]} {who[1]};" if who[1] != who[0] else f"user {who[0]};"


# Each argument is "-x path" or "-w path"; prints the first one that fails.  test(1) asks the
# kernel (access(2) as the worker), so ACLs and mount options count as they will for nginx.
_ACCESS_SCRIPT = 'while [ $# -gt 1 ]; do [ "$1" "$2" ] || { printf %s "$1 $2"; exit 1; }; shift 2; done'


def _first_denied(checks):
    """The first (mode, path) in ``checks`` that nginx's workers are denied, or None."""
    who = worker_user()
    if who is None:
        modes = {"-x": os.X_OK, "-w": os.W_OK}
        return next(((m, p) for m, p in checks if not os.access(p, modes[m])), None)
    user, group = who
    try:
        uid, gid = pwd.getpwnam(user).pw_uid, grp.getgrnam(group).gr_gid
    except KeyError:
        return None                    # nginx -t names the missing user or group
    argv = ["/bin/sh", "-c", _ACCESS_SCRIPT, "sh"] + [arg for check in checks for arg in check]
    proc = subprocess.run(argv, user=uid, group=gid, extra_groups=os.getgrouplist(user, gid),
                          cwd="/", capture_output=True, text=True, timeout=10)
    if proc.returncode == 0:
        return None
    mode, _, path = proc.stdout.partition(" ")
    return (mode, path)


def _describe(path):
    """``drwx------ root:root`` for a message."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return exc.strerror.lower()
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"{stat.filemode(st.st_mode)} {owner}:{group}"


def _who_bit(path):
    """The chmod class (u, g or o) whose bits decide the workers' access to ``path``."""
    who = worker_user()
    try:
        user, group = who if who is not None else (pwd.getpwuid(os.geteuid()).pw_name, None)
        st, pw = os.stat(path), pwd.getpwnam(user)
    except (OSError, KeyError):
        return "o"
    if st.st_uid == pw.pw_uid:
        return "u"
    gid = grp.getgrnam(group).gr_gid if group else pw.pw_gid
    return "g" if st.st_gid in os.getgrouplist(user, gid) else "o"


def unreachable_socket(path, with_socket=True):
    """Why nginx's workers cannot connect to the unix socket ``path`` (one clause naming the
    directory or file and the chmod that fixes it), or None when they can.

    Connecting needs search (x) on every directory from / down, and write (w) on the socket
    (fastpath creates it 0666; ``with_socket=False`` leaves the socket out, before it exists)."""
    parts = []
    directory = os.path.dirname(path)
    while True:
        parts.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    checks = [("-x", d) for d in reversed(parts)]
    if with_socket and os.path.exists(path):
        checks.append(("-w", path))
    denied = _first_denied(checks)
    if denied is None:
        return None
    mode, where = denied
    if not os.path.exists(where):
        return f"{where} does not exist"
    who = worker_user()
    user = who[0] if who is not None else pwd.getpwuid(os.geteuid()).pw_name
    verb = "search" if mode == "-x" else "write"
    return (f"nginx's workers (user {user}) cannot {verb} {where} ({_describe(where)}): "
            f"chmod {_who_bit(where)}+{mode[1]} {where}")


def worker_processes(text):
    """argparse type for nginx's worker_processes: ``auto`` or 1..1024.  nginx -t accepts 0, and
    an nginx with no worker accepts connections and never answers them."""
    import argparse

    from fastpath.options import is_decimal

    value = text.strip().lower()
    if value == "auto" or (is_decimal(value) and 1 <= int(value) <= 1024):
        return value
    raise argparse.ArgumentTypeError(f"expected auto or a number of workers from 1 to 1024, got {text!r}")


def context(config, worker_processes="auto"):
    values = {
        "user_directive": _user_directive(),
        "worker_processes": str(worker_processes),
        "var_dir": config.var_dir,
        "log_dir": config.log_dir(),
        "http": format_hostport(*config.http),
        "max_body": f"{config.max_body_kb}k",
        "keepalive_timeout": f"{KEEPALIVE_TIMEOUT_S}s",
        "worker_connections": str(WORKER_CONNECTIONS),
        "upstream_keepalive": str(UPSTREAM_KEEPALIVE),
    }
    if config.runs("balancer"):
        values.update(balancer_context(config))
        return values
    values.update(web_context(config))
    return values


def site_tls(config):
    """(certificate chain, key) the balancer serves https with: ``<var dir>/tls/fullchain.pem``
    and ``privkey.pem``, or None when neither is there (plain HTTP only).  One alone is a
    ConfigError naming the other."""
    paths = tuple(os.path.join(config.var_dir, TLS_DIR, name) for name in TLS_FILES)
    present = [os.path.exists(p) for p in paths]
    if not any(present):
        return None
    if not all(present):
        have, missing = (paths[0], paths[1]) if present[0] else (paths[1], paths[0])
        raise ConfigError(f"{have} is there but {missing} is not: put the certificate chain and its key "
                          f"in {os.path.dirname(have)} (or remove both for plain HTTP)")
    return paths


def https_address(config):
    """Where the balancer serves https: PLURK_HTTP's host at HTTPS_PORT."""
    return (config.http[0], HTTPS_PORT)


def acme_location(config):
    """The ACME HTTP-01 challenge's location (certbot certonly --webroot -w <var dir>/acme),
    served over plain HTTP with or without a certificate: the first certificate is taken before
    there is one, and without this location the path would go to Django (a 404)."""
    return ("    location ^~ /.well-known/acme-challenge/ {\n"
            f"        root {os.path.join(config.var_dir, ACME_DIR)};\n"
            "        default_type text/plain;\n"
            "    }")


def tls_context(config):
    """The balancer's TLS directives (nginx/balancer-tls.conf.template), indented for its server
    block, or a comment saying where a certificate would turn them on; the ACME challenge's
    location either way."""
    tls = site_tls(config)
    if tls is None and config.https:
        # told the site is https (cluster.env is shared): plain HTTP would serve the login page
        # unencrypted and every Secure cookie would be dropped; never degrade silently
        raise ConfigError(f"PLURK_HTTPS=1 but {os.path.join(config.var_dir, TLS_DIR, TLS_FILES[0])} is missing: "
                          f"put the certificate chain and its key there (docs/deploy.md section 10), or set "
                          f"PLURK_HTTPS=0 on the balancer while it takes its first certificate by ACME")
    if tls is None:
        return (f"    # plain HTTP only: no {' and '.join(TLS_FILES)} in "
                f"{os.path.join(config.var_dir, TLS_DIR)} (docs/deploy.md, \"TLS\")\n"
                f"{acme_location(config)}")
    port = HTTPS_PORT
    with open(BALANCER_TLS_TEMPLATE) as fh:
        text = fastpoll_nginx.render_text(fh.read(), {
            "https": format_hostport(*https_address(config)),
            "certificate": tls[0],
            "certificate_key": tls[1],
            "https_port_suffix": "" if port == 443 else f":{port}",
        }, BALANCER_TLS_TEMPLATE)
    return f"{fastpoll_nginx.indent(text)}\n{acme_location(config)}"


def edge_tls_address(config):
    """Where the balancer terminates TLS for the edges: its https host at EDGE_TLS_PORT."""
    return (config.http[0], EDGE_TLS_PORT)


def edge_tls(config):
    """(certificate chain, key) of the balancer's TLS edge, or None without PLURK_WEB_EDGES; a
    ConfigError when the edges are asked for without a certificate (they are never plain here)."""
    if not config.web_edges:
        return None
    tls = site_tls(config)
    if tls is None:
        raise ConfigError(f"PLURK_WEB_EDGES is set but {os.path.join(config.var_dir, TLS_DIR)} holds no "
                          f"{' and '.join(TLS_FILES)}: the balancer serves the edges over TLS only; put the "
                          f"site's certificate there (docs/deploy.md, \"TLS\") or leave PLURK_WEB_EDGES empty")
    return tls


def _nginx_build_flags():
    from .services import find_binary

    try:
        done = subprocess.run([find_binary("nginx", "nginx"), "-V"], capture_output=True, text=True, timeout=30)
    except OSError:
        return ""
    return done.stderr + done.stdout


def stream_module_line(flags=None):
    """The ``load_module`` line nginx needs for ``stream {}`` (Debian builds it as a module,
    libnginx-mod-stream), or a comment when it is built in; ConfigError when it is neither."""
    flags = _nginx_build_flags() if flags is None else flags
    words = flags.split()
    if "--with-stream" in words:
        return "# the stream module is built into this nginx"
    if "--with-stream=dynamic" in words:
        modules = next((w.split("=", 1)[1] for w in words if w.startswith("--modules-path=")), None)
        if modules is None:
            prefix = next((w.split("=", 1)[1] for w in words if w.startswith("--prefix=")), "/etc/nginx")
            modules = os.path.join(prefix, "modules")
        path = os.path.join(modules, "ngx_stream_module.so")
        if os.path.exists(path):
            return f"load_module {path};      # the balancer's TLS edge: stream {{}} below"
    raise ConfigError("PLURK_WEB_EDGES needs nginx's stream module (the balancer's TLS edge): "
                      "apt-get install libnginx-mod-stream, or leave PLURK_WEB_EDGES empty")


def render_edge_stream(config):
    """The balancer's ``stream {}`` block (nginx/balancer-edge.conf.template): TLS on
    edge_tls_address() before the web hosts' edges (PLURK_WEB_EDGES)."""
    certificate, key = edge_tls(config)
    with open(BALANCER_EDGE_TEMPLATE) as fh:
        return fastpoll_nginx.render_text(fh.read(), {
            "edge_port": str(EDGE_TLS_PORT),
            "log_dir": config.log_dir(),
            "edge_tls": format_hostport(*edge_tls_address(config)),
            "certificate": certificate,
            "certificate_key": key,
            "edge_servers": "\n".join(f"        server {format_hostport(*hp)} max_fails={WEB_HOST_MAX_FAILS} "
                                      f"fail_timeout={WEB_HOST_FAIL_TIMEOUT_S}s;" for hp in config.web_edges),
            # a long-poll's longest hold and then some, as the balancer's http read timeout
            "edge_idle_timeout": f"{config.longpoll_max_wait_s + BALANCER_READ_MARGIN_S}s",
            **edge_conn_cap(config),
        }, BALANCER_EDGE_TEMPLATE).rstrip("\n")


def edge_conn_cap(config):
    """The TLS edge's cap on connections per client address (PLURK_HELD_PER_ADDRESS, 0: none):
    stream-level zone lines and the server's limit_conn.  This host's own address (127.0.0.1,
    ::1: its probes and bench/edgetls.py) is not capped, as a web host's loopback is not."""
    per_address = config.held_per_address
    if not per_address:
        return {"edge_conn_zone": "    # no cap per client address (PLURK_HELD_PER_ADDRESS is 0)",
                "edge_conn_limit": "        # no cap per client address (PLURK_HELD_PER_ADDRESS is 0)"}
    return {"edge_conn_zone": "\n".join((
                "    geo $plurk_edge_capped { default 1; 127.0.0.1 0; ::1 0; }",
                '    map $plurk_edge_capped $plurk_edge_key { 0 ""; default $binary_remote_addr; }',
                f"    limit_conn_zone $plurk_edge_key zone=plurk_edge_conns:{fastpoll_nginx.HELD_ZONE_MB}m;")),
            "edge_conn_limit": f"        limit_conn plurk_edge_conns {per_address};"}


def site_host_map(config):
    """The balancer's map of the site's names ($plurk_site_host: 1 for one of them)."""
    if config.debug:
        return "# PLURK_DEBUG: every Host is the site's\nmap $host $plurk_site_host { default 1; }"
    hosts = config.site_hosts       # ".localhost" is localhost and its subdomains for nginx too
    names = " ".join(f"{_nginx_host(h)} 1;" for h in hosts if "." + h not in hosts)
    return f"map $host $plurk_site_host {{ hostnames; default 0; {names} }}"


def balancer_held_cap(config):
    """The site-wide cap on held polls per client address (PLURK_HELD_PER_ADDRESS, 0: none): the
    web hosts count in zones of their own, and the balancer spreads requests round robin, so
    without this one address could hold the cap once per web host.  A held request is a poll's
    long-poll (Prefer: wait=) or stream (GET, Accept: text/event-stream), read as fastpoll's maps
    read them; this host's own 127.0.0.1 and ::1 (its probes, the benches) are not counted."""
    per_address = config.held_per_address
    if not per_address:
        return {"held_zone": "# no cap on held polls per client address (PLURK_HELD_PER_ADDRESS is 0)",
                "held_limit": "        # no cap on held polls per client address (PLURK_HELD_PER_ADDRESS is 0)"}
    prefix = re.escape(fastpoll_nginx.settings_of(fastpoll_settings(config))["PATH_PREFIX"])
    return {"held_zone": "\n".join((
                "geo $plurk_held_capped { default 1; 127.0.0.1 0; ::1 0; }",
                f"map $http_prefer $plurk_held_wait {{ {fastpoll_nginx.WAIT_PATTERN} 1; default 0; }}",
                f'map "$request_method:$http_accept" $plurk_held_events '
                f"{{ {fastpoll_nginx.STREAM_PATTERN} 1; default 0; }}",
                f'map "$plurk_held_capped:$plurk_held_wait$plurk_held_events:$uri" $plurk_held_key '
                f'{{ "~^1:(1.|.1):{prefix}" $binary_remote_addr; default ""; }}',
                f"limit_conn_zone $plurk_held_key zone=plurk_held:{fastpoll_nginx.HELD_ZONE_MB}m;")),
            "held_limit": f"        limit_conn plurk_held {per_address};\n        limit_conn_status 429;"}


def balancer_context(config):
    return {
        **balancer_held_cap(config),
        "site_host_map": site_host_map(config),
        "host_check": ("        if ($plurk_site_host = 0) {\n            return 444;\n        }"),
        "tls": tls_context(config),
        "https_port": str(HTTPS_PORT),
        "probe_key": probe_key(config),
        "web_servers": "\n".join(f"    server {format_hostport(*hp)} max_fails={WEB_HOST_MAX_FAILS} "
                                 f"fail_timeout={WEB_HOST_FAIL_TIMEOUT_S}s;" for hp in config.web_hosts),
        "upstream_keepalive_timeout": f"{BALANCER_UPSTREAM_KEEPALIVE_S}s",
        "longpoll_read_timeout": f"{config.longpoll_max_wait_s + BALANCER_READ_MARGIN_S}s",
        # nginx's own errors as JSON, from fastpoll's one table (fastpoll.nginx.JSON_ERRORS)
        "error_pages": fastpoll_nginx.error_pages("plurk", indent="    "),
        "error_locations": fastpoll_nginx.error_locations("plurk", indent="    "),
    }


PROBE_KEY_FILE = "nginx-probe.key"


def probe_key(config):
    """The secret the runner's probe carries (?plurk_probe=<key><id>), so that only it writes to
    nginx-probe.log: <var dir>/nginx-probe.key, made (0600, 32 hex digits) when absent."""
    path = os.path.join(config.var_dir, PROBE_KEY_FILE)
    try:
        with open(path) as fh:
            key = fh.read().strip()
        if len(key) == 32 and all(c in "0123456789abcdef" for c in key):
            return key
    except FileNotFoundError:
        pass
    key = secrets.token_hex(16)
    os.makedirs(config.var_dir, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    os.replace(tmp, path)
    return key


# A request id from a trusted proxy: what nginx's $request_id looks like and a little more
# (a balancer of another make); anything else is replaced by this host's own.
_REQUEST_ID_RE = r"[0-9A-Za-z._-]{1,128}"


def trusted_maps(config):
    """The http-level lines that take the scheme and the request id from a trusted proxy only
    ($realip_remote_addr is the peer, before set_real_ip_from replaces $remote_addr)."""
    if not config.trusted_proxies:
        return ("# no trusted proxy (PLURK_TRUSTED_PROXIES is empty): this host faces clients; "
                "Django gets $scheme and $request_id")
    nets = " ".join(f"{net} 1;" for net in config.trusted_proxies)
    return "\n".join((
        f"geo $realip_remote_addr $plurk_from_proxy {{ default 0; {nets} }}",
        'map "$plurk_from_proxy:$http_x_forwarded_proto" $plurk_scheme '
        '{ "~^1:(?<proto>https?)$" $proto; default $scheme; }',
        f'map "$plurk_from_proxy:$http_x_request_id" $plurk_request_id '
        f'{{ "~^1:(?<id>{_REQUEST_ID_RE})$" $id; default $request_id; }}',
    ))


def real_ip(config):
    """The server-level lines that make $remote_addr the client's behind a trusted proxy."""
    if not config.trusted_proxies:
        return "    # no trusted proxy: $remote_addr is the peer, X-Forwarded-For is not read"
    lines = [f"    set_real_ip_from {net};" for net in config.trusted_proxies]
    lines += ["    real_ip_header X-Forwarded-For;",
              "    real_ip_recursive on;           # the last address no trusted proxy added"]
    return "\n".join(lines)


def request_id_variable(config):
    return "$plurk_request_id" if config.trusted_proxies else "$request_id"


def _nginx_host(name):
    return name if name.startswith("[") or ":" not in name else f"[{name}]"


def host_servers(config):
    """(the default server that closes any other Host, the main server's listen options, its
    server_name).  PLURK_DEBUG (ALLOWED_HOSTS *): no such server, every Host reaches Django."""
    listen = format_hostport(*config.http)
    if config.debug:
        return ("# PLURK_DEBUG: every Host reaches Django (ALLOWED_HOSTS is *), no default server",
                " default_server backlog=4096", "_")
    settings = fastpoll_nginx_settings(config)
    other = "\n".join((
        "# Any other Host (a scanner, a name that points here by mistake) is closed without an answer",
        "# (444) and never reaches Django, which would answer 400 and log a DisallowedHost each time.",
        "# nginx reads every request's head with this server's settings (it knows the Host only after),",
        "# so they are the site's, and an error found before the Host (a request line too long, a bad",
        "# request) is the site's JSON error.",
        "server {",
        f"    listen {listen} default_server backlog=4096;",
        '    server_name "";',
        f"    access_log {config.log_dir()}/nginx-access.log plurk buffer=64k flush=1s;",
        header_limits(),
        fastpoll_nginx.error_pages(settings["NGINX_NAME"], indent="    "),
        "    location / {",
        "        return 444;",
        "    }",
        fastpoll_nginx.error_locations(settings["NGINX_NAME"], indent="    "),
        "}",
    ))
    names = config.site_hosts       # ".localhost" is localhost and its subdomains for nginx too
    return other, "", " ".join(_nginx_host(h) for h in names if "." + h not in names)


def fastpoll_nginx_settings(config):
    """The FASTPOLL values fastpoll's nginx parts are rendered from for this web host: the stack's
    (services.fastpoll_settings) and the names of this template's own upstreams and locations."""
    return {**fastpoll_settings(config),
            "NGINX_NAME": "plurk",                  # plurk_fastpath, $plurk_wait, /_plurk_error/...
            "DJANGO_UPSTREAM": "plurk_django",      # the upstream of this template
            "NGINX_UPSTREAM_KEEPALIVE": UPSTREAM_KEEPALIVE,
            "NGINX_REQUEST_ID": request_id_variable(config)}


def web_context(config):
    settings = fastpoll_nginx_settings(config)
    other_hosts_server, listen_options, server_names = host_servers(config)
    return {
        "other_hosts_server": other_hosts_server,
        "listen_options": listen_options,
        "server_names": server_names,
        "trusted_maps": trusted_maps(config),
        "real_ip": real_ip(config),
        "scheme": "$plurk_scheme" if config.trusted_proxies else "$scheme",
        "request_id": request_id_variable(config),
        "probe_key": probe_key(config),
        "header_limits": header_limits(),
        "django": format_hostport(*config.django),
        # below gunicorn's own idle timeout (see services.py)
        "django_keepalive_timeout": f"{max(1, GUNICORN_KEEPALIVE_S - 15)}s",
        # fastpoll's parts: the long-poll map and fastpath's upstream; the poll locations
        "fastpoll_http": fastpoll_nginx.render_http(settings).rstrip("\n"),
        "fastpoll_server": fastpoll_nginx.indent(fastpoll_nginx.render_server(settings)),
        # the server's error_page lines point at the JSON error locations the poll part defines
        "error_pages": fastpoll_nginx.error_pages(settings["NGINX_NAME"], indent="    "),
    }


def render_text(template_text, values):
    return fastpoll_nginx.render_text(template_text, values, TEMPLATE)


def template(config):
    """The http-level template of this host's nginx: the balancer's, or a web host's."""
    return BALANCER_TEMPLATE if config.runs("balancer") else TEMPLATE


def main_level_context(config):
    """The full config's main-level parts besides http: the balancer's TLS edge (``stream {}``
    and the module it needs) when PLURK_WEB_EDGES is set, else comments."""
    if config.runs("balancer") and config.web_edges:
        return {"load_modules": stream_module_line(), "stream_block": render_edge_stream(config)}
    return {"load_modules": "# no dynamic module", "stream_block": "# no TLS edge at this host (PLURK_WEB_EDGES is the balancer's)"}


def render_include(config):
    """The http-level part of this host's nginx (log format, maps, upstreams, the server block) as
    text: what an operator's nginx includes at http level, and what the full config inlines."""
    with open(template(config)) as fh:
        return render_text(fh.read(), context(config))


def render_full(config, worker_processes="auto"):
    """The whole nginx.conf of this host as text: the main template around render_include()."""
    values = dict(context(config, worker_processes))
    values.update(main_level_context(config))
    values["http_block"] = "\n".join("    " + line if line else line
                                      for line in render_include(config).rstrip("\n").split("\n"))
    with open(MAIN_TEMPLATE) as fh:
        return render_text(fh.read(), values)


def render(config, worker_processes="auto"):
    """Write ``<var_dir>/nginx.conf`` and the temp directories; return the file's path."""
    text = render_full(config, worker_processes)
    for name in TEMP_DIRS:
        os.makedirs(os.path.join(config.var_dir, "nginx", name), exist_ok=True)
    os.makedirs(config.log_dir(), exist_ok=True)
    path = nginx_conf_path(config)
    tmp = path + ".tmp"
    # 0600: it holds the probe key (nginx-probe.key is 0600 too); only nginx's master reads it,
    # as the user that rendered it (the unit's ExecStartPre, the runner)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)       # a .tmp left by an older render kept its mode
        fh.write(text)
    os.replace(tmp, path)
    return path
