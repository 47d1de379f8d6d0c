"""How each service of the stack is started: command lines and readiness checks.

Shared by the runner (``manage.py runstack``) and the test fixtures, so that tests start the very
same programs with the very same flags as production, only on other ports.
"""
import collections
import os
import shutil
import socket
import subprocess
import sys
import time

from .config import ROOT, format_hostport, is_local_address, is_loopback


class ServiceError(RuntimeError):
    """A service cannot be started; the message is one line that names the fix."""


def find_binary(name, debian_package=None, extra_dirs=("/usr/sbin", "/usr/local/sbin", "/sbin")):
    path = shutil.which(name) or next(
        (os.path.join(d, name) for d in extra_dirs if os.access(os.path.join(d, name), os.X_OK)), None)
    if path is None:
        hint = f" (apt-get install {debian_package}, or run `make run`)" if debian_package else ""
        raise ServiceError(f"{name} not found{hint}")
    return path


# The ports this process handed out lately.  A port is free the moment its probe socket closes,
# so the kernel may give the next probe the same one: two services of one test then share a port
# (fastpath refused `--edge` equal to `--listen` with exit 2 in CI).  No port is handed out twice
# among the last _HANDED_KEPT.
_HANDED_KEPT = 4096
_handed = collections.OrderedDict()


def free_port(host="127.0.0.1"):
    """A TCP port that is free on ``host`` right now (for tests), not one handed out lately."""
    return free_ports(1, host)[0]


def free_ports(count, host="127.0.0.1"):
    """``count`` distinct free TCP ports, none of them handed out lately by this process."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks, ports = [], []
    try:
        while len(ports) < count:
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)              # held open until the end, so the kernel moves on
            sock.bind((host, 0))
            port = sock.getsockname()[1]
            if (host, port) not in _handed:
                ports.append(port)
            if len(socks) > count + 256:
                raise ServiceError(f"no free TCP port on {host}")
    finally:
        for sock in socks:
            sock.close()
    for port in ports:
        _handed[(host, port)] = True
        if len(_handed) > _HANDED_KEPT:
            _handed.popitem(last=False)
    return ports


def port_in_use(host, port):
    if host == "unix":                      # a stale socket file is fine: fastpath replaces it
        return accepts(host, port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def accepts(host, port, timeout=0.2):
    if host == "unix":
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(port)
                return True
            except OSError:
                return False
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_port(host, port, timeout=15.0, process=None, name="service"):
    """Wait until ``host:port`` accepts connections; fail early when ``process`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if accepts(host, port):
            return
        if process is not None and process.poll() is not None:
            raise ServiceError(f"{name} exited with status {process.returncode} before listening "
                               f"on {format_hostport(host, port)}")
        time.sleep(0.05)
    raise ServiceError(f"{name} did not listen on {format_hostport(host, port)} within {timeout:.0f}s")


def memcached_command(host, port, memory_mb=64, max_connections=4096):
    return [find_binary("memcached", "memcached"), "-l", host, "-p", str(port), "-U", "0",
            "-m", str(memory_mb), "-c", str(max_connections), "-t", "2",
            "-u", "root" if os.geteuid() == 0 else os.environ.get("USER", "nobody")]


# Idle keep-alive lifetimes.  nginx must drop an idle upstream connection before the upstream
# does, or it may reuse one that was just closed (a 502 on loopback); the nginx template gets its
# values from these (plurksite/nginxconf.py), so the pairs cannot drift apart.
GUNICORN_KEEPALIVE_S = 75
FASTPATH_IDLE_TIMEOUT_S = 10


# gunicorn's default format, but the client's address is X-Real-IP, which nginx sets from its
# $remote_addr (the client's, behind a trusted balancer too: set_real_ip_from), not gunicorn's
# peer, always nginx (127.0.0.1); "-" for a request that did not come through nginx
GUNICORN_ACCESS_FORMAT = '%({x-real-ip}i)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s" id=%({x-request-id}i)s'


def gunicorn_command(config, settings="plurksite.settings"):
    venv_bin = os.path.dirname(sys.executable)
    gunicorn = os.path.join(venv_bin, "gunicorn")
    if not os.access(gunicorn, os.X_OK):
        gunicorn = find_binary("gunicorn", None)
    return [gunicorn, "plurksite.wsgi:application",
            "--bind", format_hostport(*config.django),
            "--workers", str(config.gunicorn_workers),
            "--worker-class", "gthread", "--threads", "4",
            "--timeout", "30", "--graceful-timeout", "10",
            "--keep-alive", str(GUNICORN_KEEPALIVE_S),
            # gunicorn believes no scheme header from anyone (by default X-Forwarded-Ssl,
            # X-Forwarded-Protocol and X-Forwarded-Proto from 127.0.0.1): Django alone decides,
            # from the X-Forwarded-Proto that nginx always sets (SECURE_PROXY_SSL_HEADER)
            "--forwarded-allow-ips", "",
            "--access-logfile", "-", "--error-logfile", "-",
            # the client's address and the request id nginx sends (its own, or a trusted
            # balancer's): one address and one id in every hop's log line
            "--access-logformat", GUNICORN_ACCESS_FORMAT,
            "--chdir", ROOT, "--env", f"DJANGO_SETTINGS_MODULE={settings}"]


def fastpoll_settings(config):
    """The FASTPOLL keys this stack's ``config`` decides that Django and fastpath must share
    (plurksite.settings' FASTPOLL says the same): fastpath's flags and the nginx include are
    rendered from them by fastpoll itself (fastpoll.commandline, fastpoll.nginx)."""
    values = {
        "MEMCACHED_SERVERS": list(config.memcached_specs),
        "MEMCACHED_TIMEOUT": config.memcached_timeout_ms / 1000.0,
        "SECRET_FILE": config.secret_file,
        "KEY_PREFIX": "p1",              # the demo's keys (fastpoll.W003: a site names its own)
        "COOKIE_NAME": "plurk_token",    # the demo's poll cookie (the library's is fastpoll_token)
        "NOTIFY_DIRS": [config.fastpath_notify] if config.fastpath_notify else [],
        "FASTPATH_ADDRESS": format_hostport(*config.fastpath),
        "FASTPATH_ADMIN": format_hostport(*config.fastpath_admin),
        "FASTPATH_WORKERS": config.fastpath_workers,
        "FASTPATH_IDLE_TIMEOUT": FASTPATH_IDLE_TIMEOUT_S,
        "LONGPOLL_MAX_WAIT": config.longpoll_max_wait_s,
        # one client cannot take everyone's slots: fastpath's cap per user (both listeners)
        # and nginx's per client address (fastpoll.nginx renders limit_conn)
        "MAX_HELD_PER_USER": config.max_held_per_user,
        "NGINX_HELD_PER_ADDRESS": config.held_per_address,
        # the poll cookie's Domain: an edge on another host of the site's domain gets it
        "COOKIE_DOMAIN": config.cookie_domain,
    }
    if config.edge:
        values.update({
            "EDGE_ADDRESS": format_hostport(*config.edge),
            "EDGE_URL": config.edge_url,
            "EDGE_ORIGINS": list(config.edge_origins),
            # 0 behind a TLS terminator (the balancer's stream edge): every connection is its
            "EDGE_MAX_PER_ADDRESS": config.edge_max_per_address,
            "EDGE_MAX_CONNS_PER_ADDRESS": config.edge_max_conns_per_address,
        })
    if config.fastpath_notify_udp:
        values["NOTIFY_BACKEND"] = "fastpoll.notify.UdpNotifier"
        values["NOTIFY_UDP"] = list(config.notify_udp_destinations)
    return values


#: the demo's per-user resources (plurkcore's, fastpoll's registry: tests/plurksite/test_config.py
#: holds them equal), fastpath's --resources, which has no default
RESOURCES = ("getMessages", "getUnreadCount")
#: the demo's per-object resources (plurkcore's getThread), served by fastpath with a capability
OBJECT_RESOURCES = ("getThread",)


def fastpath_command(config, resources=None, object_resources=OBJECT_RESOURCES, **options):
    """``python -m fastpath`` with the stack's settings, rendered by fastpoll's own renderer
    (``manage.py fastpoll_fastpath`` prints the same flags); ``resources``: the per-user ones
    (None: the demo's, RESOURCES); ``options`` (fastpath.Options names, as fastpath.serve()
    takes them) add to or override them.  Pure Python: this works before the extension is built."""
    from fastpoll.commandline import CommandLineError, fastpath_argv
    from fastpoll.nginx import RenderError

    values = dict(**longpoll_options(config), max_body=config.max_body_bytes)
    values.update(options)
    try:
        return fastpath_argv(fastpoll_settings(config), RESOURCES if resources is None else resources,
                             object_resources, **values)
    except (CommandLineError, RenderError) as exc:
        raise ServiceError(str(exc)) from None     # runstack's one-line error, not a traceback


def longpoll_options(config):
    """fastpath's long-poll options (--max-wait, --notify-dir, --notify-udp) for ``config``.
    --notify-udp is this host's own entry of the shared udp: list (ServiceError, one line, when
    that entry does not fit this host)."""
    from .config import ConfigError

    values = {"max_wait": config.longpoll_max_wait_s}
    if config.fastpath_notify:
        values["notify_dir"] = config.fastpath_notify
    try:
        local = config.local_notify_udp()
    except ConfigError as exc:
        raise ServiceError(str(exc)) from None   # runstack's one-line error, not a traceback
    if local is not None:
        values["notify_udp"] = format_hostport(local[0], local[1])
    return values


def repaircache_command():
    return [sys.executable, os.path.join(ROOT, "manage.py"), "repaircache", "--loop", "--warm"]


def nginx_conf_path(config):
    """Where the runner renders this host's nginx config (the web or the balancer template: a host
    runs one nginx)."""
    return os.path.join(config.var_dir, "nginx.conf")


def nginx_command(conf_path, prefix):
    return [find_binary("nginx", "nginx"), "-p", prefix, "-c", conf_path, "-g", "daemon off;"]


def nginx_test(conf_path, prefix):
    """``nginx -t`` on the rendered file: raise ServiceError with nginx's own complaint."""
    proc = subprocess.run([find_binary("nginx", "nginx"), "-t", "-q", "-p", prefix, "-c", conf_path],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if "[emerg]" in ln] or proc.stderr.splitlines()
        raise ServiceError(f"nginx rejects {conf_path}: {lines[0] if lines else 'unknown error'}")


# One service a host runs: the name the runner supervises it by (and logs it under, log/<log>.log),
# its role, its command line, and the address that must accept connections once it is ready.
Command = collections.namedtuple("Command", "role name argv ready log")


def local_memcached(config):
    """The PLURK_MEMCACHED entries this host runs: for ``all`` the loopback ones (the single-host
    stack), for the ``memcached`` role those whose address is this host's (each host of a cluster
    reads the same list).  A memcached role with none is a mistake: raise ServiceError."""
    if not config.runs("memcached"):
        return []
    if "all" in config.roles:
        return [(h, p) for h, p in config.memcached if is_loopback(h)]
    mine = [(h, p) for h, p in config.memcached if is_local_address(h)]
    if not mine:
        raise ServiceError(f"PLURK_ROLES has memcached but no PLURK_MEMCACHED entry "
                           f"({','.join(config.memcached_specs)}) is an address of this host; add this "
                           f"host's address:port to PLURK_MEMCACHED, or drop the memcached role")
    return mine


def commands(config, settings_module="plurksite.settings", poll_resources=None, with_repair=True,
             fastpath_options=None):
    """Everything this host runs, in start order: [Command], each the very command line a
    systemd unit would run (with the PLURK_* environment of ``config.to_env()`` and
    DJANGO_SETTINGS_MODULE).  The nginx ones read the file nginxconf.render() writes.
    ``fastpath_options`` go to fastpath_command (over the stack's own)."""
    cmds = []
    for host, port in local_memcached(config):
        cmds.append(Command("memcached", f"memcached:{format_hostport(host, port)}",
                            memcached_command(host, port, config.memcached_memory_mb),
                            (host, port), f"memcached-{port}"))
    if config.runs("web"):
        cmds.append(Command("web", "gunicorn", gunicorn_command(config, settings_module), config.django,
                            "gunicorn"))
    if config.runs("repair") and with_repair:
        cmds.append(Command("repair", "repaircache", repaircache_command(), None, "repaircache"))
    if config.runs("web"):
        cmds.append(Command("web", "fastpath", fastpath_command(config, poll_resources, **(fastpath_options or {})),
                            config.fastpath, "fastpath"))
        cmds.append(Command("web", "nginx", nginx_command(nginx_conf_path(config), config.var_dir),
                            config.http, "nginx"))
    if config.runs("balancer"):
        cmds.append(Command("balancer", "balancer", nginx_command(nginx_conf_path(config), config.var_dir),
                            config.http, "balancer"))
    return cmds


def commands_by_role(config, **kwargs):
    """``commands()`` as role -> [(service name, argv)], for a renderer of unit files."""
    by_role = {}
    for cmd in commands(config, **kwargs):
        by_role.setdefault(cmd.role, []).append((cmd.name, cmd.argv))
    return by_role
