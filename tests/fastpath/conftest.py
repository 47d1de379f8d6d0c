import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from plurksite.services import ServiceError, free_ports, wait_for_port

SECRET = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# `make test-asan` points these at an AddressSanitizer build of the extension and its runtime:
# every fastpath these tests start then runs instrumented, and any report fails the test.
ASAN_ROOT = os.environ.get("FASTPATH_ASAN_ROOT")
ASAN_RUNTIME = os.environ.get("FASTPATH_ASAN_RUNTIME")


def fastpath_env(tmp_path, preload=(), env=None):
    """(env, cwd) for a ``python -m fastpath`` subprocess: the AddressSanitizer build under
    `make test-asan` (its runtime preloaded first), plus any ``preload``ed shims."""
    env, cwd = dict(os.environ, **(env or {})), ROOT
    preloads = list(preload)
    if ASAN_ROOT:
        cwd = ASAN_ROOT
        preloads.insert(0, ASAN_RUNTIME)
        # Python itself is not instrumented and keeps memory to exit: leaks are not ours.  A
        # failed debug check (FP_ASSERT, compiled into this build) aborts: that is a report too.
        env["ASAN_OPTIONS"] = f"detect_leaks=0:handle_abort=1:log_path={tmp_path / 'asan'}"
        env["UBSAN_OPTIONS"] = f"print_stacktrace=1:log_path={tmp_path / 'asan'}"
    if preloads:
        env["LD_PRELOAD"] = " ".join(preloads)
    return env, cwd


@contextlib.contextmanager
def python_script(tmp_path, script):
    """``python -c script`` (under fastpath_env) in a session of its own: it forks, so it never
    runs inside pytest.  Killed with its whole group if the test leaves it running."""
    env, cwd = fastpath_env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def asan_reports(tmp_path):
    """Raise if an AddressSanitizer run under tmp_path reported anything."""
    reports = sorted(tmp_path.glob("asan.*"))
    if reports:
        raise AssertionError("AddressSanitizer: " + reports[0].read_text()[:4000])


#: the per-user resources a test's fastpath serves unless it names its own (--resources has no default)
RESOURCES = "getMessages,getUnreadCount"


class Fastpath:
    def __init__(self, servers, tmp_path, workers=1, extra=(), preload=(), env=None, edge=False, unix=False,
                 resources=RESOURCES):
        self.unix_path = str(tmp_path / "fastpath.sock") if unix else None   # --listen unix:
        self.servers, self.workers, self.extra, self.edge = servers, workers, tuple(extra), edge
        if resources is not None and "--resources" not in self.extra:       # None: leave it out
            self.extra = ("--resources", resources, *self.extra)
        self.secret_file = tmp_path / "secret.key"
        self.secret_file.write_bytes(SECRET + b"\n")
        self.log = tmp_path / "fastpath.log"
        self.tmp_path = tmp_path
        self.preload, self.env = preload, env
        self.proc = None
        self._choose_ports()

    def _choose_ports(self):
        self.port, self.admin_port, self.edge_port = free_ports(3)
        if not self.edge:
            self.edge_port = None                          # --edge (docs/contract.md section 10)
        listen = f"unix:{self.unix_path}" if self.unix_path else f"127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "fastpath", "--listen", listen,
                     "--admin", f"127.0.0.1:{self.admin_port}",
                     "--memcached", ",".join(s.spec for s in self.servers),
                     "--secret-file", str(self.secret_file), "--workers", str(self.workers), *self.extra]
        if self.edge_port:
            self.argv += ["--edge", f"127.0.0.1:{self.edge_port}"]

    def start(self):
        # A first start may find a port taken since it was chosen (another process's connection
        # got it as its source port): it chooses again.  A restart keeps its ports.
        for attempt in range(3 if self.proc is None else 1):
            if attempt:
                self._choose_ports()
            try:
                return self._start()
            except ServiceError as exc:
                if "is already in use" not in str(exc) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _start(self):
        env, cwd = fastpath_env(self.tmp_path, self.preload, self.env)
        self.proc = subprocess.Popen(self.argv, cwd=cwd, env=env, stdout=open(self.log, "ab"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_listening()
        except ServiceError as exc:       # say why: fastpath's last line names it
            lines = self.log.read_text(errors="replace").strip().splitlines()
            raise ServiceError(f"{exc}: {lines[-1] if lines else 'it printed nothing'}") from None
        return self

    def _wait_listening(self):
        if self.unix_path:
            wait_for_port("127.0.0.1", self.admin_port, process=self.proc, name="fastpath's admin")
            assert os.path.exists(self.unix_path), self.unix_path
        else:
            wait_for_port("127.0.0.1", self.port, process=self.proc, name="fastpath")
        if self.edge_port:
            wait_for_port("127.0.0.1", self.edge_port, process=self.proc, name="fastpath's edge")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        asan_reports(self.tmp_path)


@pytest.fixture
def fastpath_factory(tmp_path):
    started = []

    def make(servers, **kwargs):
        fp = Fastpath(servers, tmp_path, **kwargs).start()
        started.append(fp)
        return fp

    yield make
    for fp in started:
        fp.stop()


def token(uid, epoch=0, ttl=3600, key=SECRET):
    from fastpoll import tokens
    return tokens.sign(key, uid, epoch, int(time.time()) + ttl)


class FakeMemcached:
    """A memcached stand-in on a free loopback port for replies a real one would not give.  It
    answers each ``get k1 k2 ...`` with the VALUE blocks of ``entries`` (key -> the exact bytes,
    so one can be malformed), in order, then END.  While ``answering`` is clear, replies wait
    (a slow server); ``asked`` lists every key requested."""

    def __init__(self):
        self.entries = {}
        self.asked = []
        self.answering = threading.Event()
        self.answering.set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def spec(self):
        return f"127.0.0.1:{self.port}"

    def set(self, key, value, flags=b"0"):
        self.entries[key] = b"VALUE %s %s %d\r\n%s\r\n" % (key, flags, len(value), value)

    def _accept(self):
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf, waiting = b"", []
        with contextlib.suppress(OSError, ValueError):
            while True:
                # keep reading (and recording) while replies are held back
                if select.select([conn], [], [], 0.01)[0]:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                while b"\r\n" in buf:
                    line, buf = buf.split(b"\r\n", 1)
                    waiting.append(line.split()[1:])
                    self.asked.extend(waiting[-1])
                if waiting and self.answering.is_set():
                    conn.sendall(b"".join(b"".join(self.entries.get(k, b"") for k in keys) + b"END\r\n"
                                          for keys in waiting))
                    waiting = []

    def close(self):
        self.answering.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)    # wakes the accept() above
        self._listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


class AnswerHoldingProxy:
    """A TCP proxy in front of a real memcached: requests pass at once, so memcached reads its
    entries when they arrive, while answers wait here as long as ``answering`` is clear.  It
    pins an order a paused memcached cannot: a get is answered from the old value, and a store
    and its notice complete while that answer is still on its way."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.answering = threading.Event()
        self.answering.set()
        self.held_bytes = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def spec(self):
        return f"127.0.0.1:{self.port}"

    def _accept(self):
        host, port = self.upstream.spec.rsplit(":", 1)
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection((host, int(port)))
            self._socks += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src, dst, answers):
        held = b""
        with contextlib.suppress(OSError, ValueError):
            while True:
                if select.select([src], [], [], 0.01)[0]:
                    data = src.recv(65536)
                    if not data:
                        return
                    held += data
                    if answers:
                        self.held_bytes += len(data)
                if held and (not answers or self.answering.is_set()):
                    dst.sendall(held)
                    held = b""

    def close(self):
        self.answering.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@pytest.fixture
def holding_proxy(memcached):
    proxy = AnswerHoldingProxy(memcached)
    yield proxy
    proxy.close()


@pytest.fixture
def fake_memcached():
    fake = FakeMemcached()
    yield fake
    fake.close()
