"""The stack runner: start this host's services (PLURK_ROLES: the whole single-host stack, or a
cluster host's share: web, memcached, repair, balancer), wait until each answers, prove that a poll
through nginx is answered by fastpath (not by Django after a fallback), restart a child that dies
(with backoff), and stop everything that was started, whatever state it is in.

Used by ``manage.py runstack`` (foreground, Ctrl-C/SIGTERM to stop) and by the test fixtures::

    from plurksite.config import StackConfig
    from plurksite.stack import Stack

    with Stack(StackConfig.from_env({...PLURK_* overrides...})) as stack:
        requests.get(stack.base_url + "/Poll/getUnreadCount", ...)
        stack.service("fastpath").kill()      # SIGKILL its process group; the monitor restarts it
        stack.service("memcached:127.0.0.1:11311").kill()

Every child gets its own process group (so its workers are stopped with it) and the PLURK_*
variables of the stack's configuration, and dies with the runner (PR_SET_PDEATHSIG).
"""
import contextlib
import ctypes
import http.client
import logging
import os
import re
import shutil
import signal
import ssl
import subprocess
import threading
import time
import uuid

from . import nginxconf, services
from .config import ROOT, ConfigError, format_hostport, is_local_address
from .services import ServiceError

log = logging.getLogger("plurksite.stack")

_PR_SET_PDEATHSIG = 1
# nginx's logs (nginx/*.template), rotated by the runner past PLURK_NGINX_LOG_KB: kept as
# <log>.1 (the newest) .. <log>.N; checked every LOG_CHECK_INTERVAL_S.
NGINX_LOGS = ("nginx-access.log", "nginx-probe.log", "nginx-error.log", "nginx-edge.log")   # edge: the balancer's
NGINX_LOGS_KEPT = 4
LOG_CHECK_INTERVAL_S = 10.0
# seconds after a SIGUSR1 by which every nginx worker must have reopened the rotated logs
REOPEN_CHECK_S = 2.0


def _die_with_parent():
    """In the child before exec: get SIGTERM when the runner dies, so nothing is orphaned."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def _makedirs_searchable(directory):
    """``os.makedirs``, but each directory it creates is rwxr-xr-x whatever the umask: it holds
    fastpath's socket, which nginx's workers (maybe another user) must reach."""
    missing = []
    while not os.path.isdir(directory):
        missing.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            continue                    # made meanwhile, or not a directory: the check says
        os.chmod(path, 0o755)


def _prepare_socket_dir(directory, where, other):
    """Make the directory fastpath binds its socket(s) in, and refuse to start with one line
    (where: the variable and its value; other: the alternative to offer) when this user could
    not create a socket there."""
    try:
        _makedirs_searchable(directory)
    except OSError as exc:
        raise ServiceError(f"{where}: cannot create {exc.filename} ({exc.strerror}); create it or "
                           f"{other}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ServiceError(f"{where}: fastpath (this user) cannot create its socket in {directory}; "
                           f"make it writable (chmod u+w) or {other}")


# The line nginx's probe log (nginx/plurk.conf.template, format "plurk") has for one request.
_LOGGED = re.compile(r'" (?P<status>\d{3}) .* upstream=(?P<upstream>.*?) ustatus=(?P<ustatus>.*?) urt=')
# "... [crit] 12#12: *3 connect() to unix:/x failed (13: Permission denied) while ..., client: ..."
_NGINX_ERROR = re.compile(r"\[(?:emerg|alert|crit|error)\] [\d#]+: (?:\*\d+ )?(?P<what>.*?)(?:, client: .*)?$")


def _any_address(host):
    return host in ("0.0.0.0", "::")


def _children(pid):
    """The pids whose parent is ``pid`` (nginx's workers of its master), from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue                  # gone meanwhile
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _open_files(pid):
    """The paths of the files ``pid`` holds open ([] when /proc does not say: gone, or another
    user's process)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    paths = []
    for fd in fds:
        with contextlib.suppress(OSError):
            paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return paths


def _logged_line(path, tag, timeout=3.0):
    """The line of the log at ``path`` that names ``tag``, waiting for nginx to write it."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError), open(path, errors="replace") as fh:
            for line in fh:
                if tag in line:
                    return line
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def _last_nginx_error(path, about, offset=0):
    """nginx's own words for the last error about ``about`` in its error log past ``offset``, or
    None."""
    found = None
    with contextlib.suppress(OSError), open(path, errors="replace") as fh:
        fh.seek(offset)
        for line in fh:
            match = _NGINX_ERROR.search(line.rstrip("\n"))
            if match and about in line:
                found = match.group("what")
    return found


class Service:
    """One supervised child process (and its process group)."""

    def __init__(self, name, argv, env, log_path, ready=None, ready_timeout=20.0, stop_timeout=10.0):
        self.name = name
        self.argv = argv
        self.pass_fds = ()                  # descriptors the child inherits
        self.env = env
        self.log_path = log_path
        self.ready = ready                  # (host, port) that must accept connections, or None
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.process = None
        self.restarts = 0
        self.started_at = None
        self._lock = threading.RLock()

    def start(self):
        with self._lock:
            with open(self.log_path, "ab", buffering=0) as log_file:
                log_file.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: "
                               f"{' '.join(self.argv)}\n".encode())
                self.process = subprocess.Popen(
                    self.argv, env=self.env, cwd=ROOT, stdin=subprocess.DEVNULL,
                    stdout=log_file, stderr=subprocess.STDOUT, pass_fds=self.pass_fds,
                    start_new_session=True, preexec_fn=_die_with_parent)
            self.started_at = time.monotonic()
        return self

    def wait_ready(self):
        if self.ready is not None:
            services.wait_for_port(*self.ready, timeout=self.ready_timeout,
                                   process=self.process, name=self.name)

    @property
    def pid(self):
        return self.process.pid if self.process else None

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def _signal_group(self, sig):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def kill(self):
        """SIGKILL the whole process group (fault injection and last resort)."""
        with self._lock:
            if self.process is not None:
                self._signal_group(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=5)

    def stop(self):
        """SIGTERM (and SIGCONT, in case it is stopped), then SIGKILL after stop_timeout."""
        with self._lock:
            if self.process is None:
                return
            if self.process.poll() is None:
                self._signal_group(signal.SIGTERM)
                self._signal_group(signal.SIGCONT)
                try:
                    self.process.wait(timeout=self.stop_timeout)
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop within %.0fs; killing it", self.name, self.stop_timeout)
            # Whatever is left of the group (workers whose master exited) goes too.
            self._signal_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
            self.process = None

    def exited(self):
        """Called once when the supervisor finds the process dead (before its restart)."""


class ActivatedFastpath(Service):
    """fastpath started as systemd's plurk-fastpath.socket starts it (docs/deploy.md): the runner
    owns the listening socket and passes it (fastpath.activation), so a planned restart
    (:meth:`restart`) hands over without refusing a connection: held polls are answered 304 by
    the old fastpath, their re-polls wait in the backlog for the new one.

    A fastpath that *dies* is another matter: its socket would go on accepting connections that
    nobody answers, and nginx would wait out its read timeout (70 s for a long-poll) instead of
    falling back to Django at once.  So the socket is closed as soon as the process is found
    dead or killed (connects are refused, as with no fastpath at all) and opened again when it
    starts; only restart() keeps it open.  The socket accepts before fastpath is ready:
    readiness is fastpath's own admin port."""

    def __init__(self, name, argv, env, log_path, listen, listen_addr, admin):
        super().__init__(name, argv, env, log_path, ready=admin)
        self.fastpath_argv = list(argv)
        self.listen = listen                # PLURK_FASTPATH as fastpath's --listen spells it
        self.listen_addr = listen_addr      # ("unix", path) or (host, port)
        self.socket = None

    def open_socket(self):
        from fastpath.activation import listen_socket
        from fastpath.errors import FastpathError

        if self.socket is None:
            try:
                self.socket = listen_socket(self.listen)
            except FastpathError as exc:
                raise ServiceError(f"PLURK_FASTPATH: {exc}") from None

    def close_socket(self):
        sock, self.socket = self.socket, None
        if sock is None:
            return
        sock.close()
        if self.listen_addr[0] == "unix":
            with contextlib.suppress(OSError):
                os.unlink(self.listen_addr[1])

    def start(self):
        from fastpath.activation import activated_command

        with self._lock:
            self.open_socket()
            self.argv, self.pass_fds = activated_command(self.socket, self.fastpath_argv)
            return super().start()

    def restart(self):
        """The handover: stop this fastpath (it answers its held polls 304 and drains), start a
        new one on the same socket."""
        with self._lock:
            super().stop()                  # Service.stop: the socket stays open
            return self.start()

    def exited(self):
        self.close_socket()

    def kill(self):
        with self._lock:
            super().kill()
            self.close_socket()

    def stop(self):
        with self._lock:
            super().stop()
            self.close_socket()


class Supervisor:
    """Keeps services running: restarts a dead one after a backoff that doubles up to a cap and
    resets once the service has stayed up for a while."""

    def __init__(self, backoff_initial=0.5, backoff_max=30.0, healthy_after=30.0, poll_interval=0.2):
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.healthy_after = healthy_after
        self.poll_interval = poll_interval
        self._pending = {}          # name -> (restart at, backoff used)
        self._backoff = {}

    def check(self, svc):
        now = time.monotonic()
        if svc.alive():
            if svc.started_at and now - svc.started_at > self.healthy_after:
                self._backoff.pop(svc.name, None)
            return
        if svc.name not in self._pending:
            svc.exited()
            backoff = self._backoff.get(svc.name, self.backoff_initial)
            status = svc.process.returncode if svc.process else None
            log.warning("%s exited (status %s); restarting in %.1fs", svc.name, status, backoff)
            self._pending[svc.name] = now + backoff
            self._backoff[svc.name] = min(backoff * 2, self.backoff_max)
            return
        if now >= self._pending[svc.name]:
            del self._pending[svc.name]
            svc.restarts += 1
            try:
                svc.start()
                log.info("%s restarted (pid %s, restart #%d)", svc.name, svc.pid, svc.restarts)
            except OSError as exc:
                log.error("%s could not be restarted: %s", svc.name, exc)


class Stack:
    """Every service of the stack for one :class:`~plurksite.config.StackConfig`."""

    def __init__(self, config, settings_module="plurksite.settings", nginx_workers="auto",
                 extra_env=None, supervise=True, with_repair=None, poll_resources=None, fastpath_options=None):
        self.config = config
        # the poll resources fastpath answers (None: its default list); runstack passes every
        # resource registered with plurkcore, including an integrating app's own
        self.poll_resources = poll_resources
        # fastpath options (fastpath.Options names) no PLURK_* variable sets, over the stack's
        # own (services.fastpath_command): a benchmark's connection limits
        self.fastpath_options = dict(fastpath_options or {})
        self.settings_module = settings_module
        self.nginx_workers = nginx_workers
        self.supervise = supervise
        self.env = dict(os.environ)
        self.env.update(config.to_env())
        self.env["DJANGO_SETTINGS_MODULE"] = settings_module
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env.update(extra_env or {})
        self.with_repair = True if with_repair is None else with_repair
        self.services = []
        self._nginx_errors_from = 0
        self._stop = threading.Event()
        self._monitor = None
        self._supervisor = Supervisor()
        self.log_check_interval = LOG_CHECK_INTERVAL_S
        self._reopen = None             # nginx's workers can reopen the logs by name (rotate_nginx_logs)
        self._reopen_check = None       # (when, paths renamed): see that every worker reopened them

    # -- building -------------------------------------------------------------------------
    @property
    def base_url(self):
        return self.config.base_url

    def local_memcached(self):
        """The PLURK_MEMCACHED entries this host runs (services.local_memcached)."""
        return services.local_memcached(self.config)

    def _log(self, name):
        return os.path.join(self.config.log_dir(), f"{name}.log")

    def commands(self):
        """This host's services in start order (services.Command), as a systemd unit runs them."""
        return services.commands(self.config, self.settings_module, self.poll_resources, self.with_repair,
                                 self.fastpath_options)

    def _runs_nginx(self):
        return self.config.runs("web") or self.config.runs("balancer")

    def build(self):
        if self._runs_nginx():
            nginxconf.render(self.config, self.nginx_workers)
        return [self._service(cmd) for cmd in self.commands()]

    def _service(self, cmd):
        if cmd.name == "fastpath":
            return ActivatedFastpath(cmd.name, cmd.argv, self.env, self._log(cmd.log),
                                     format_hostport(*self.config.fastpath), self.config.fastpath,
                                     self.config.fastpath_admin)
        return Service(cmd.name, cmd.argv, self.env, self._log(cmd.log), ready=cmd.ready)

    def preflight(self):
        """Refuse to start, with one line naming the fix, when anything is obviously wrong."""
        from fastpoll.secret import ensure_secret

        cfg = self.config
        os.makedirs(cfg.log_dir(), exist_ok=True)
        web = cfg.runs("web")
        if self._runs_nginx():
            services.find_binary("nginx", "nginx")
        memcached = self.local_memcached()         # a memcached role with no entry of its own: refused
        if memcached:
            services.find_binary("memcached", "memcached")
        if web:
            try:
                import fastpath._server  # noqa: F401  (the compiled extension)
            except ImportError as exc:
                raise ServiceError(f"fastpath extension is not built ({exc}); run `make compile`") from None
        if web or cfg.runs("repair"):
            ensure_secret(cfg.secret_file)
        listens = [("PLURK_MEMCACHED", hp) for hp in memcached]
        if self._runs_nginx():
            listens.insert(0, ("PLURK_HTTP", cfg.http))
            if not is_local_address(cfg.http[0]):
                raise ServiceError(f"PLURK_HTTP={format_hostport(*cfg.http)!r} is not an address of this host; "
                                   f"set PLURK_HTTP to one of its addresses")
        if cfg.runs("balancer"):
            try:
                tls = nginxconf.site_tls(cfg)
                edge = nginxconf.edge_tls(cfg) and nginxconf.edge_tls_address(cfg)
                if edge:                            # the TLS edge needs the stream module too
                    nginxconf.stream_module_line()
            except ConfigError as exc:
                raise ServiceError(str(exc)) from None
            https = nginxconf.https_address(cfg)
            if tls and services.port_in_use(*https):
                raise ServiceError(f"https {format_hostport(*https)} (the balancer's, with the certificate in "
                                   f"{os.path.dirname(tls[0])}) is already in use (another runstack?); stop it")
            if edge and services.port_in_use(*edge):
                raise ServiceError(f"the TLS edge {format_hostport(*edge)} (the balancer's, PLURK_WEB_EDGES) is "
                                   f"already in use (another runstack?); stop it or leave PLURK_WEB_EDGES empty")
        if web:
            listens[1:1] = [("PLURK_DJANGO", cfg.django), ("PLURK_FASTPATH", cfg.fastpath),
                            ("PLURK_FASTPATH_ADMIN", cfg.fastpath_admin)]
            if cfg.edge:
                if not _any_address(cfg.edge[0]) and not is_local_address(cfg.edge[0]):
                    raise ServiceError(f"PLURK_EDGE={format_hostport(*cfg.edge)!r} is not an address of this host; "
                                       f"set PLURK_EDGE to one of its addresses (or empty: no edge)")
                listens.append(("PLURK_EDGE", cfg.edge))
        for name, (host, port) in listens:
            if services.port_in_use(host, port):
                raise ServiceError(f"{name} {format_hostport(host, port)} is already in use "
                                   f"(another runstack?); stop it or set {name}")
        if web and cfg.fastpath[0] == "unix":
            self._prepare_socket(cfg.fastpath[1])
        if web and cfg.fastpath_notify:
            self._prepare_notify_dir(cfg.fastpath_notify)
        if self._runs_nginx():
            conf = nginxconf.render(cfg, self.nginx_workers)
            services.nginx_test(conf, cfg.var_dir)
        with contextlib.suppress(OSError):     # verify_polls quotes only this run's errors
            self._nginx_errors_from = os.path.getsize(self._nginx_error_log())

    def _nginx_error_log(self):
        return os.path.join(self.config.log_dir(), "nginx-error.log")

    @staticmethod
    def _prepare_socket(path):
        """Create the socket's directory, and refuse to start when nginx's workers could not reach
        the socket in it: every connect would fail ("Permission denied" in nginx's error log) and
        every poll would fall back to Django, about 80 times slower, in silence."""
        where = f"PLURK_FASTPATH=unix:{path}"
        _prepare_socket_dir(os.path.dirname(path), where,
                            "set PLURK_FASTPATH to another unix:/path or a loopback host:port")
        why = nginxconf.unreachable_socket(path, with_socket=False)  # fastpath makes a new one, 0666
        if why:
            raise ServiceError(f"{where}: {why}, or set PLURK_FASTPATH to a socket in a directory they can "
                               f"reach, or to a loopback host:port such as 127.0.0.1:8001")

    @staticmethod
    def _prepare_notify_dir(directory):
        """fastpath binds its notice sockets there and Django (the same user) sends to them:
        refuse at once when it cannot, rather than let every held poll wait for a re-read."""
        _prepare_socket_dir(directory, f"PLURK_FASTPATH_NOTIFY={directory}",
                            "set PLURK_FASTPATH_NOTIFY to another directory, or to off")

    def verify_polls(self, attempts=3):
        """Prove the path a user's poll takes: a poll through nginx without a token must get
        fastpath's own 401, not Django's after a fallback.  nginx logs requests that carry
        ``plurk_probe`` at once to nginx-probe.log, whose upstream= and ustatus= say who answered
        (the two 401s are the same bytes, by contract)."""
        cfg = self.config
        resource = (self.poll_resources or ("getUnreadCount",))[0]
        fastpath = format_hostport(*cfg.fastpath)
        seen = "no answer"
        key = nginxconf.probe_key(cfg)      # only a probe with it is written to nginx-probe.log
        for attempt in range(attempts):
            if attempt:
                time.sleep(0.5)         # a loaded machine may time out one try; a denial stays
            tag = key + uuid.uuid4().hex
            try:
                conn = http.client.HTTPConnection(*cfg.http, timeout=5)
                try:
                    conn.request("GET", f"/Poll/{resource}?plurk_probe={tag}")
                    status = conn.getresponse().status
                finally:
                    conn.close()
            except OSError as exc:
                seen = f"no answer ({exc})"
                continue
            line = _logged_line(os.path.join(cfg.log_dir(), "nginx-probe.log"), tag)
            match = _LOGGED.search(line or "")
            if match is None:
                seen = f"{status}, not in nginx-probe.log"
                continue
            upstream, ustatus = match.group("upstream"), match.group("ustatus")
            if status == 401 and (upstream, ustatus) == (fastpath, "401"):
                return
            seen = f"{status} from upstream {upstream} (status {ustatus})"
        unix = cfg.fastpath[0] == "unix"
        nginx_says = _last_nginx_error(self._nginx_error_log(), fastpath, self._nginx_errors_from)
        why = nginxconf.unreachable_socket(cfg.fastpath[1]) if unix else None
        details = "; ".join(x for x in (f"nginx: {nginx_says}" if nginx_says else None, why) if x)
        raise ServiceError(f"polls through nginx do not reach fastpath at {fastpath}: a poll without a token "
                           f"got {seen}, so every poll would fall back to Django"
                           f"{' (' + details + ')' if details else ''}; fix that"
                           f"{', or set PLURK_FASTPATH to a loopback host:port' if unix else ''}")

    def _probe(self, address, attempts=1, tls=False):
        """One probe poll (no token) straight to ``address`` (over https with ``tls``): (status,
        X-Plurk-Probe) or None when nothing answers.  A web host's nginx says in X-Plurk-Probe who
        answered the probe."""
        resource = (self.poll_resources or ("getUnreadCount",))[0]
        for attempt in range(attempts):
            if attempt:
                time.sleep(0.5)
            try:
                if tls:
                    # this host's own nginx, by address: its certificate names the site (and nginx
                    # loaded it), so this probe checks that https answers, not who signed it
                    conn = http.client.HTTPSConnection(*address, timeout=5,
                                                       context=ssl._create_unverified_context())
                else:
                    conn = http.client.HTTPConnection(*address, timeout=5)
                try:
                    key = nginxconf.probe_key(self.config)   # this host's: the balancer logs it
                    conn.request("GET", f"/Poll/{resource}?plurk_probe={key}{uuid.uuid4().hex}")
                    resp = conn.getresponse()
                    resp.read()
                    return resp.status, resp.getheader("X-Plurk-Probe")
                finally:
                    conn.close()
            except OSError:
                continue
        return None

    @property
    def edge_url(self):
        """The URL a browser on this machine polls the edge by ("" without an edge)."""
        cfg = self.config
        if not cfg.edge:
            return ""
        return cfg.edge_url or f"http://{format_hostport(*cfg.edge)}"

    def verify_edge(self, timeout=10.0):
        """Prove that pages can poll the edge: a CORS preflight from the site's origin (the first
        of PLURK_EDGE_ORIGINS) gets fastpath's 204 with that origin allowed, as a browser needs
        before its first poll there."""
        cfg = self.config
        resource = (self.poll_resources or ("getUnreadCount",))[0]
        origin = cfg.edge_origins[0]
        host, port = cfg.edge
        if _any_address(host):             # a wildcard: ask it on this host's loopback
            host = "::1" if ":" in host else "127.0.0.1"
        seen, deadline = "no answer", time.monotonic() + timeout
        while True:
            try:
                conn = http.client.HTTPConnection(host, port, timeout=5)
                try:
                    conn.request("OPTIONS", f"/Poll/{resource}",
                                 headers={"Origin": origin, "Access-Control-Request-Method": "GET"})
                    resp = conn.getresponse()
                    resp.read()
                finally:
                    conn.close()
                allowed = resp.getheader("Access-Control-Allow-Origin")
                if resp.status == 204 and allowed == origin:
                    return
                seen = f"{resp.status} (Access-Control-Allow-Origin: {allowed})"
            except OSError as exc:
                seen = f"no answer ({exc})"
            if time.monotonic() > deadline:
                break
            time.sleep(0.25)          # fastpath's workers bind the edge after its admin port answers
        raise ServiceError(f"the edge at {format_hostport(*cfg.edge)} does not answer a CORS preflight from "
                           f"{origin}: got {seen} (see {self._log('fastpath')}); fix that, or set PLURK_EDGE "
                           f"empty to run without an edge")

    def verify_balancer(self, attempts=3):
        """The balancer answers; each web host that is up is a web host's nginx whose polls reach
        its fastpath; and when one is, a poll through the balancer reaches a fastpath.  Hosts start
        in any order: a web host not up yet (or answering polls from Django) is a loud warning,
        never a refusal; an address that answers but is no web host's nginx is a mistake."""
        cfg = self.config
        # with a certificate, plain HTTP only redirects: the site is its https address
        tls = nginxconf.site_tls(cfg) is not None
        site = nginxconf.https_address(cfg) if tls else cfg.http
        balancer = f"https://{format_hostport(*site)}" if tls else format_hostport(*site)
        up = []
        for host in cfg.web_hosts:
            where = format_hostport(*host)
            got = self._probe(host, attempts=1)
            if got is None:
                log.warning("WEB HOST %s IS NOT UP: the balancer skips it until it answers", where)
            elif got[1] is None:
                raise ServiceError(f"PLURK_WEB_HOSTS entry {where} answered a poll ({got[0]}) but is no web host's "
                                   f"nginx (no X-Plurk-Probe); list the web hosts' PLURK_HTTP in PLURK_WEB_HOSTS")
            elif got[1] != "fastpath":
                log.warning("WEB HOST %s ANSWERS POLLS FROM DJANGO, not fastpath (see its runstack.log)", where)
            else:
                up.append(where)
        # A web host that failed is skipped for fail_timeout (it may have been down a moment ago),
        # and round robin may pick one going down: try for a little longer than that.
        deadline = time.monotonic() + nginxconf.WEB_HOST_FAIL_TIMEOUT_S + 2
        while True:
            seen = self._probe(site, attempts=attempts, tls=tls)
            if seen is None:
                raise ServiceError(f"the balancer at {balancer} does not answer; see {self._nginx_error_log()}")
            if not up or seen[1] == "fastpath" or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        if not up:
            log.warning("NO WEB HOST IS UP (%s): the balancer at %s answers %s until one is",
                        ",".join(format_hostport(*hp) for hp in cfg.web_hosts), balancer, seen[0])
            return
        if seen[1] != "fastpath":
            raise ServiceError(f"web host(s) {', '.join(up)} answer polls from fastpath, but a poll through the "
                               f"balancer at {balancer} got {seen[0]} (X-Plurk-Probe: {seen[1]}); see "
                               f"{self._nginx_error_log()}")
        log.info("a poll through the balancer at %s reached a fastpath (web hosts up: %s)", balancer, ", ".join(up))

    def verify(self):
        """Prove what this host's roles serve; memcached and repair need nothing beyond readiness."""
        if self.config.runs("web"):
            self.verify_polls()
            log.info("a poll through nginx was answered by fastpath at %s", format_hostport(*self.config.fastpath))
            if self.config.edge:
                self.verify_edge()
                log.info("the edge at %s answered a CORS preflight from %s", format_hostport(*self.config.edge),
                         self.config.edge_origins[0])
        if self.config.runs("balancer"):
            self.verify_balancer()

    def describe(self):
        """What this host runs and where, one line per role."""
        cfg, lines = self.config, []
        memcached = self.local_memcached()
        if memcached:
            lines.append(f"memcached  {', '.join(format_hostport(*hp) for hp in memcached)}")
        if cfg.runs("web"):
            lines.append(f"web        nginx {format_hostport(*cfg.http)}, fastpath {format_hostport(*cfg.fastpath)} "
                         f"(metrics {format_hostport(*cfg.fastpath_admin)}), gunicorn {format_hostport(*cfg.django)}")
            if cfg.edge:
                lines.append(f"edge       fastpath {format_hostport(*cfg.edge)} (pages poll {self.edge_url}, "
                             f"origins {', '.join(cfg.edge_origins)})")
        if cfg.runs("repair") and self.with_repair:
            lines.append("repair     manage.py repaircache --loop --warm")
        if cfg.runs("balancer"):
            tls = nginxconf.site_tls(cfg)
            served = (f"https://{format_hostport(*nginxconf.https_address(cfg))} (certificate {tls[0]}; "
                      f"{format_hostport(*cfg.http)} redirects there)" if tls else format_hostport(*cfg.http))
            lines.append(f"balancer   nginx {served} -> "
                         f"{', '.join(format_hostport(*hp) for hp in cfg.web_hosts)}")
        return lines

    # -- running --------------------------------------------------------------------------
    def start(self):
        self.preflight()
        self.services = self.build()
        try:
            for svc in self.services:
                svc.start()
                svc.wait_ready()
                log.info("%s ready (pid %s)", svc.name, svc.pid)
            self.verify()
        except BaseException:
            self.stop()
            raise
        if self.supervise:
            self._monitor = threading.Thread(target=self._watch, name="stack-monitor", daemon=True)
            self._monitor.start()
        return self

    def _watch(self):
        next_rotation = time.monotonic() + self.log_check_interval
        while not self._stop.wait(self._supervisor.poll_interval):
            for svc in self.services:
                if self._stop.is_set():
                    return
                self._supervisor.check(svc)
            if time.monotonic() >= next_rotation:
                next_rotation = time.monotonic() + self.log_check_interval
                try:
                    self.rotate_nginx_logs()
                except OSError as exc:
                    log.warning("rotating nginx's logs failed: %s", exc)

    def rotate_nginx_logs(self):
        """Rotate each of nginx's logs that has passed PLURK_NGINX_LOG_KB: <log>.1 .. <log>.N
        shift up (the oldest goes), the log becomes <log>.1, and nginx's master reopens its
        logs (SIGUSR1, what `nginx -s reopen` sends): it writes what it buffered to the renamed
        file and goes on in a new one.  Returns the logs rotated."""
        limit = self.config.nginx_log_kb * 1024
        nginx = next((s for s in self.services if s.name in ("nginx", "balancer")), None)
        if not limit or nginx is None or not nginx.alive():
            return []
        self._check_reopened(nginx.pid)
        if self._reopen is None:
            # nginx's workers reopen the logs by name: as root they are another user, who may not
            # search the way to the log directory (a checkout under /root): then each log is
            # copied and emptied in place instead (nginx appends, O_APPEND, so it goes on at
            # the new end; lines written between the copy and the truncation are lost)
            why = nginxconf.unreachable_socket(os.path.join(self.config.log_dir(), NGINX_LOGS[0]),
                                               with_socket=False)
            self._reopen = why is None
            if why:
                log.warning("nginx's logs are rotated by copying and truncating: %s", why)
        rotated = []
        for name in NGINX_LOGS:
            path = os.path.join(self.config.log_dir(), name)
            try:
                if os.path.getsize(path) < limit:
                    continue
            except FileNotFoundError:
                continue
            for n in range(NGINX_LOGS_KEPT - 1, 0, -1):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(f"{path}.{n}", f"{path}.{n + 1}")
            if self._reopen:
                os.replace(path, f"{path}.1")
            else:
                shutil.copyfile(path, f"{path}.1")
                os.truncate(path, 0)
            rotated.append(name)
        if rotated:
            if self._reopen:
                os.kill(nginx.pid, signal.SIGUSR1)
                self._reopen_check = (time.monotonic() + REOPEN_CHECK_S,
                                      [os.path.join(self.config.log_dir(), name) for name in rotated])
            if "nginx-error.log" in rotated:
                self._nginx_errors_from = 0
            log.info("rotated %s past %d KiB%s", ", ".join(rotated), self.config.nginx_log_kb,
                     "; nginx reopened its logs" if self._reopen else " (copied and truncated)")
        return rotated

    def _check_reopened(self, master):
        """REOPEN_CHECK_S after a SIGUSR1, every worker of nginx's ``master`` must write the new
        logs: a worker whose descriptor still names a renamed one (``<log>.1``) missed the reopen
        (CI saw one go on writing nginx-access.log.1), so the master is asked once more."""
        if self._reopen_check is None or time.monotonic() < self._reopen_check[0]:
            return
        renamed = tuple(path + "." for path in self._reopen_check[1])
        self._reopen_check = None
        stale = sorted({(pid, target) for pid in _children(master) for target in _open_files(pid)
                        if target.startswith(renamed)})
        if stale:
            log.warning("nginx worker(s) still write %s %.0f s after the reopen; asking nginx to reopen again",
                        ", ".join(f"{os.path.basename(t)} (pid {p})" for p, t in stale), REOPEN_CHECK_S)
            os.kill(master, signal.SIGUSR1)

    def service(self, name):
        for svc in self.services:
            if svc.name == name:
                return svc
        raise KeyError(f"no service {name!r}; have {[s.name for s in self.services]}")

    def stop(self):
        self._stop.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=5)
        for svc in reversed(self.services):
            try:
                svc.stop()
            except Exception:  # keep stopping the others
                log.exception("stopping %s failed", svc.name)
        log.info("stack stopped")

    def wait(self):
        """Block until stop() is called (from a signal handler) or the stop event is set."""
        while not self._stop.wait(0.5):
            pass

    def request_stop(self, *_args):
        self._stop.set()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
