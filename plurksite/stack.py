"""The stack runner: start every service on loopback, wait until each answers, prove that a poll
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
import signal
import subprocess
import sys
import threading
import time
import uuid

from . import nginxconf, services
from .config import ROOT, format_hostport, is_loopback
from .services import ServiceError

log = logging.getLogger("plurksite.stack")

_PR_SET_PDEATHSIG = 1


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
                    stdout=log_file, stderr=subprocess.STDOUT,
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
                 extra_env=None, supervise=True, with_repair=None, poll_resources=None):
        self.config = config
        # the poll resources fastpath answers (None: its default list); runstack passes every
        # resource registered with plurkcore, including an integrating app's own
        self.poll_resources = poll_resources
        self.settings_module = settings_module
        self.nginx_workers = nginx_workers
        self.supervise = supervise
        self.env = dict(os.environ)
        self.env.update(config.to_env())
        self.env["DJANGO_SETTINGS_MODULE"] = settings_module
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env.update(extra_env or {})
        self.with_repair = self._has_repaircache() if with_repair is None else with_repair
        self.services = []
        self._nginx_errors_from = 0
        self._stop = threading.Event()
        self._monitor = None
        self._supervisor = Supervisor()

    # -- building -------------------------------------------------------------------------
    @staticmethod
    def _has_repaircache():
        return os.path.exists(os.path.join(ROOT, "plurkcore", "management", "commands", "repaircache.py"))

    @property
    def base_url(self):
        return self.config.base_url

    def local_memcached(self):
        return [(h, p) for h, p in self.config.memcached if is_loopback(h)]

    def _log(self, name):
        return os.path.join(self.config.log_dir(), f"{name}.log")

    def build(self):
        cfg = self.config
        svcs = []
        for host, port in self.local_memcached():
            name = f"memcached:{format_hostport(host, port)}"
            svcs.append(Service(name, services.memcached_command(host, port, cfg.memcached_memory_mb),
                                self.env, self._log(f"memcached-{port}"), ready=(host, port)))
        svcs.append(Service("gunicorn", services.gunicorn_command(cfg, self.settings_module),
                            self.env, self._log("gunicorn"), ready=cfg.django))
        if self.with_repair:
            svcs.append(Service("repaircache",
                                [sys.executable, os.path.join(ROOT, "manage.py"), "repaircache", "--loop", "--warm"],
                                self.env, self._log("repaircache")))
        svcs.append(Service("fastpath", services.fastpath_command(cfg, self.poll_resources), self.env,
                            self._log("fastpath"), ready=cfg.fastpath))
        conf = nginxconf.render(cfg, self.nginx_workers)
        svcs.append(Service("nginx", services.nginx_command(conf, cfg.var_dir), self.env,
                            self._log("nginx"), ready=cfg.http))
        return svcs

    def preflight(self):
        """Refuse to start, with one line naming the fix, when anything is obviously wrong."""
        from plurkcore.secret import ensure_secret

        cfg = self.config
        os.makedirs(cfg.log_dir(), exist_ok=True)
        services.find_binary("nginx", "nginx")
        if self.local_memcached():
            services.find_binary("memcached", "memcached")
        try:
            import fastpath._server  # noqa: F401  (the compiled extension)
        except ImportError as exc:
            raise ServiceError(f"fastpath extension is not built ({exc}); run `make compile`") from None
        ensure_secret(cfg.secret_file)
        listens = [("PLURK_HTTP", cfg.http), ("PLURK_DJANGO", cfg.django),
                   ("PLURK_FASTPATH", cfg.fastpath), ("PLURK_FASTPATH_ADMIN", cfg.fastpath_admin)]
        listens += [("PLURK_MEMCACHED", hp) for hp in self.local_memcached()]
        for name, (host, port) in listens:
            if services.port_in_use(host, port):
                raise ServiceError(f"{name} {format_hostport(host, port)} is already in use "
                                   f"(another runstack?); stop it or set {name}")
        if cfg.fastpath[0] == "unix":
            self._prepare_socket(cfg.fastpath[1])
        if cfg.fastpath_notify:
            self._prepare_notify_dir(cfg.fastpath_notify)
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
        for attempt in range(attempts):
            if attempt:
                time.sleep(0.5)         # a loaded machine may time out one try; a denial stays
            tag = uuid.uuid4().hex
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

    # -- running --------------------------------------------------------------------------
    def start(self):
        self.preflight()
        self.services = self.build()
        try:
            for svc in self.services:
                svc.start()
                svc.wait_ready()
                log.info("%s ready (pid %s)", svc.name, svc.pid)
            self.verify_polls()
            log.info("a poll through nginx was answered by fastpath at %s", format_hostport(*self.config.fastpath))
        except BaseException:
            self.stop()
            raise
        if self.supervise:
            self._monitor = threading.Thread(target=self._watch, name="stack-monitor", daemon=True)
            self._monitor.start()
        return self

    def _watch(self):
        while not self._stop.wait(self._supervisor.poll_interval):
            for svc in self.services:
                if self._stop.is_set():
                    return
                self._supervisor.check(svc)

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
