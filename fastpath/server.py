"""Lifecycle in Python: validate options, open sockets, fork workers, restart crashed ones,
drain on SIGTERM.  The per-request work happens in C (``fastpath._server``)."""
import ctypes
import dataclasses
import errno
import mmap
import os
import re
import signal
import socket
import sys
import time

from .errors import ConfigurationError, FastpathError

DEFAULT_RESOURCES = ("getMessages", "getUnreadCount")
_RESOURCE_RE = re.compile(r"\A[A-Za-z0-9_]{1,32}\Z")
_SECRET_MIN, _SECRET_MAX = 32, 1024
_BACKENDS = ("epoll", "poll", "select")


def parse_address(text, what="address"):
    """``host:port`` / ``[v6]:port`` -> (host, port)."""
    text = text.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(f"bad {what} {text!r}: expected host:port")
    return host, int(port)


def parse_listen(text):
    """``host:port``, or ``unix:/path`` for a unix-domain socket (nginx on the same host)."""
    if text.startswith("unix:"):
        path = text[5:]
        if not path or len(os.fsencode(path)) > 107:
            raise ConfigurationError(f"bad --listen {text!r}: unix:<path of at most 107 bytes>")
        return ("unix", os.path.abspath(path))
    return parse_address(text, "--listen")


def read_secret(path):
    """The key bytes of docs/contract.md section 1."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_SECRET_MAX + 64)
    except OSError as exc:
        raise FastpathError(f"cannot read secret file {path}: {exc.strerror}") from None
    key = raw.strip(b" \t\r\n")
    if not _SECRET_MIN <= len(key) <= _SECRET_MAX:
        raise FastpathError(f"secret file {path} must hold {_SECRET_MIN}..{_SECRET_MAX} bytes, has {len(key)}")
    return key


@dataclasses.dataclass
class Options:
    listen: str = "127.0.0.1:8001"
    memcached: tuple = ("127.0.0.1:11211",)
    secret_file: str = "var/secret.key"
    secret: bytes = None                 # overrides secret_file when given
    admin: str = None                    # loopback host:port serving /metrics
    workers: int = 1                     # 0: one per CPU
    timeout_ms: int = 50
    idle_timeout: int = 10
    drain_timeout: int = 5
    max_body: int = 65536
    max_headers: int = 8192
    max_connections: int = 16384         # per worker
    resources: tuple = DEFAULT_RESOURCES
    backend: str = None                  # epoll | poll | select (None: libevent's choice)

    def validate(self):
        self.listen_addr = parse_listen(self.listen)
        self.admin_addr = parse_address(self.admin, "--admin") if self.admin else None
        if self.admin_addr and not _is_loopback(self.admin_addr[0]):
            raise ConfigurationError("--admin must be a loopback address (stats are not public)")
        servers = [s for s in self.memcached if s.strip()]
        if not 0 < len(servers) <= 64:
            raise ConfigurationError("--memcached needs 1..64 host:port servers")
        parsed = [parse_address(s, "--memcached server") for s in servers]
        # node names as pymemcache spells them (v6 host without brackets); connect addresses
        # as libevent parses them (v6 in brackets)
        self.node_names = [f"{h}:{p}" for h, p in parsed]
        self.node_addrs = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in parsed]
        if len(set(self.node_names)) != len(self.node_names):
            raise ConfigurationError("--memcached lists a server twice")
        for res in self.resources:
            if not _RESOURCE_RE.match(res):
                raise ConfigurationError(f"bad resource name {res!r}: 1-32 letters, digits or _")
        if not 0 < len(self.resources) <= 16:
            raise ConfigurationError("--resources needs 1..16 names")
        for name, value, low, high in [("--workers", self.workers, 0, 256),
                                       ("--timeout-ms", self.timeout_ms, 1, 60000),
                                       ("--idle-timeout", self.idle_timeout, 1, 3600),
                                       ("--drain-timeout", self.drain_timeout, 0, 600),
                                       ("--max-body", self.max_body, 0, 1 << 24),
                                       ("--max-headers", self.max_headers, 512, 1 << 20),
                                       ("--max-connections", self.max_connections, 1, 1 << 20)]:
            if not low <= value <= high:
                raise ConfigurationError(f"{name} must be in {low}..{high}, got {value}")
        if self.backend not in (None,) + _BACKENDS:
            raise ConfigurationError(f"--backend must be one of {', '.join(_BACKENDS)}")
        if self.secret is None:
            self.secret = read_secret(self.secret_file)
        elif not _SECRET_MIN <= len(self.secret) <= _SECRET_MAX:
            raise ConfigurationError("secret must be 32..1024 bytes")
        if self.workers == 0:
            self.workers = os.cpu_count() or 1
        return self

    def avoid_backends(self):
        return [b for b in _BACKENDS if self.backend and b != self.backend]


def _is_loopback(host):
    import ipaddress
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listen_socket(addr, what, reuse_port=True):
    host, port = addr
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise FastpathError(f"{what} {host}:{port} is already in use") from None
        raise FastpathError(f"cannot listen on {what} {host}:{port}: {exc.strerror}") from None
    sock.listen(4096)
    sock.setblocking(False)
    return sock


def _unix_listen_socket(path):
    """Bound before the workers fork, so they all accept on it (SO_REUSEPORT is TCP-only).
    A socket file left by a dead fastpath is replaced; one that still answers is refused."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        raise FastpathError(f"--listen unix:{path} is already in use")
    except (FileNotFoundError, ConnectionRefusedError):
        pass
    except OSError as exc:
        raise FastpathError(f"cannot listen on unix:{path}: {exc.strerror}") from None
    finally:
        probe.close()
    if os.path.lexists(path):
        import stat
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise FastpathError(f"--listen unix:{path} exists and is not a socket")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        # as reachable as a loopback TCP port (nginx's workers may run as another user); limit
        # who can reach it with the permissions of the directory it is in
        os.chmod(path, 0o666)
    except OSError as exc:
        sock.close()
        raise FastpathError(f"cannot listen on unix:{path}: {exc.strerror}") from None
    sock.listen(4096)
    sock.setblocking(False)
    return sock


def _check_port_free(addr, what):
    """Without SO_REUSEPORT, so that a port held by anyone (even another fastpath) is refused."""
    _listen_socket(addr, what, reuse_port=False).close()


def _raise_fd_limit(needed):
    """Each connection is a descriptor: lift the soft limit toward the hard one, or say how."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            raise ConfigurationError(
                f"--max-connections needs {needed} file descriptors but the hard limit is {hard}; "
                f"raise it (ulimit -Hn, LimitNOFILE=) or lower --max-connections")


def _die_with_parent():
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)
    except OSError:
        pass


def _log(message):
    print(f"fastpath[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def _run_worker(opts, index, stats, shared_listener=None):
    from . import _server

    _die_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    listener = shared_listener or _listen_socket(opts.listen_addr, "--listen")
    admin = _listen_socket(opts.admin_addr, "--admin") if opts.admin_addr else None
    try:
        _server.run_worker(listener.fileno(), admin.fileno() if admin else -1,
                           opts.node_names, opts.node_addrs, opts.secret, opts.timeout_ms,
                           opts.idle_timeout, opts.drain_timeout, opts.max_body, opts.max_headers,
                           list(opts.resources), opts.avoid_backends(), stats, opts.workers, index,
                           opts.max_connections)
    finally:
        listener.close()
        if admin:
            admin.close()


def serve(options=None, **kwargs):
    """Run fastpath in the foreground until SIGTERM/SIGINT.  With ``workers > 1`` (or 0: one
    per CPU) the parent forks workers sharing the port (SO_REUSEPORT) and restarts any that
    crashes; SIGTERM drains in-flight requests in every worker, then returns."""
    from . import _server

    opts = (options or Options(**kwargs)).validate()
    _raise_fd_limit(opts.max_connections + 64 + len(opts.node_names))
    unix_listener = None
    if opts.listen_addr[0] == "unix":
        unix_listener = _unix_listen_socket(opts.listen_addr[1])
    else:
        _check_port_free(opts.listen_addr, "--listen")
    if opts.admin_addr:
        _check_port_free(opts.admin_addr, "--admin")
    stats = mmap.mmap(-1, max(_server.STATS_SLOT_SIZE * opts.workers, 1))   # shared with children

    children = {}
    stopping = False

    def spawn(index):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _run_worker(opts, index, stats, unix_listener)
            except FastpathError as exc:
                _log(f"worker {index}: {exc}")
                code = 1
            except BaseException:  # never fall back into the parent's code in a child
                import traceback
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        children[pid] = index

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    old_term = signal.signal(signal.SIGTERM, on_signal)
    old_int = signal.signal(signal.SIGINT, on_signal)
    try:
        for index in range(opts.workers):
            spawn(index)
        _log(f"listening on {opts.listen} ({opts.workers} workers, memcached "
             f"{','.join(opts.node_addrs)}{', metrics on ' + opts.admin + '/metrics' if opts.admin else ''})")
        failures = {}
        while children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            index = children.pop(pid, None)
            if index is None or stopping:
                continue
            code = os.waitstatus_to_exitcode(status)
            now = time.monotonic()
            recent = [t for t in failures.get(index, []) if now - t < 10] + [now]
            failures[index] = recent
            if len(recent) > 5:
                _log(f"worker {index} keeps failing (exit {code}); giving up")
                on_signal(None, None)
                raise FastpathError(f"worker {index} failed {len(recent)} times in 10 s")
            _log(f"worker {index} (pid {pid}) exited with {code}; restarting")
            time.sleep(0.05 * len(recent))
            spawn(index)
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)
        if unix_listener is not None:
            unix_listener.close()
            try:
                os.unlink(opts.listen_addr[1])
            except OSError:
                pass
    _log("stopped")
