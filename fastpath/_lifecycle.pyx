# cython: language_level=3
"""Lifecycle: open sockets, fork the workers, restart any that fails, drain on SIGTERM.  The
supervisor takes its signals synchronously (blocked, then sigtimedwait without the GIL) and forks
the way os.fork() does; each worker runs the C event loop of ``fastpath._server``.  The options
and their validation are pure Python (``fastpath/options.py``), and so is the CLI."""
from libc.errno cimport errno, EINTR
from libc.string cimport strerror
from posix.signal cimport kill, sigemptyset, sigaddset, siginfo_t
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from posix.types cimport pid_t, sigset_t
from posix.wait cimport waitpid, WNOHANG, WIFEXITED, WEXITSTATUS, WIFSIGNALED, WTERMSIG

cimport fastpath.includes.process as proc

import mmap
import os
import signal
import socket
import sys

from fastpath import activation
from fastpath.errors import ConfigurationError, FastpathError
from fastpath.options import Options

def _listen_socket(addr, what, reuse_port=True):
    return activation.tcp_listen_socket(addr, what, reuse_port)


def _check_port_free(addr, what):
    """Without SO_REUSEPORT, so that a port held by anyone (even another fastpath) is refused."""
    _listen_socket(addr, what, reuse_port=False).close()


def _check_notify_udp(addr, workers):
    """Every worker's notice port bindable now, so that a port taken or an address not of this
    host stops fastpath with one line instead of a worker restart loop (each worker binds its
    own again: nothing crosses the fork)."""
    host, first = addr
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for i in range(workers):
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind((host, first + i))
            except OSError as exc:
                raise ConfigurationError(
                    f"--notify-udp {host}:{first}: worker {i} cannot bind UDP port {first + i} "
                    f"({exc.strerror}); give an address of this host and {workers} free ports") from None


def _inherited_listener(opts):
    """The listening socket passed by whoever started fastpath (systemd's fastpath.socket, a
    runner: docs/fastpath.md "Restarts without dropping held polls"), checked against --listen;
    None when nothing was passed to this process, and fastpath binds --listen itself."""
    pid, count = os.environ.get("LISTEN_PID"), os.environ.get("LISTEN_FDS")
    fds = activation.listen_fds()
    if not fds:
        if count is not None and count != "0":      # an activated ancestor's, most likely
            whose = f"pid {pid}" if pid else "no pid (LISTEN_PID unset)"
            _log(f"LISTEN_FDS={count} is for {whose}, not this process: binding --listen itself")
        return None
    sock = activation.inherited_listener(fds, opts.listen, opts.listen_addr)
    _log(f"--listen {opts.listen}: using the socket passed by the supervisor (descriptor "
         f"{sock.fileno()}, LISTEN_FDS); it outlives this fastpath")
    return sock


def _raise_fd_limit(needed):
    """Each connection is a descriptor: lift the soft limit toward the hard one, or say how."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            raise ConfigurationError(
                f"--max-connections (with --edge-max-connections when --edge is set) needs {needed} "
                f"file descriptors but the hard limit is {hard}; raise it (ulimit -Hn, LimitNOFILE=) "
                f"or lower --max-connections")


def _log(message):
    print(f"fastpath[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def _run_worker(opts, int index, stats, shared_listener=None):
    """The body of one worker process: its own SO_REUSEPORT socket (or the shared one: unix, or
    inherited), then the C event loop until SIGTERM/SIGINT."""
    from fastpath import _server

    listener = shared_listener or _listen_socket(opts.listen_addr, "--listen")
    admin = _listen_socket(opts.admin_addr, "--admin") if opts.admin_addr else None
    edge = _listen_socket(opts.edge_addr, "--edge") if opts.edge_addr else None
    try:
        _server.run_worker(opts, index, listener.fileno(), admin.fileno() if admin else -1, stats,
                           edge.fileno() if edge else -1)
    finally:
        listener.close()
        if admin:
            admin.close()
        if edge:
            edge.close()


cdef enum:
    MAX_WORKERS = 256
# a worker that fails more than CRASH_LIMIT times within CRASH_WINDOW_S seconds is not restarted
# again: fastpath exits 1 and nginx keeps falling back to Django
CRASH_LIMIT = 5
CRASH_WINDOW_S = 10.0
RESTART_DELAY_S = 0.05           # times the number of recent failures
KILL_GRACE_S = 5.0               # after --drain-timeout, SIGKILL what is still running


cdef double _monotonic() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


cdef class Supervisor:
    """Forks ``n_workers`` processes that each run ``worker_main(index)``, restarts one that
    exits while fastpath is not stopping (with a growing delay, and not after CRASH_LIMIT failures
    in CRASH_WINDOW_S), and turns SIGTERM/SIGINT into SIGTERM for every worker (each drains its
    in-flight requests), escalating to SIGKILL after ``drain_timeout`` + KILL_GRACE_S.

    SIGTERM, SIGINT and SIGCHLD are blocked while it runs and taken with sigtimedwait(), so no
    signal handler ever interrupts the supervisor half-way through a fork or a restart."""
    cdef object worker_main
    cdef int n_workers
    cdef double drain_timeout
    cdef pid_t pids[MAX_WORKERS]
    cdef double restart_at[MAX_WORKERS]       # 0: not waiting for a restart
    cdef list failures                        # per worker: monotonic times of recent failures
    cdef int n_alive
    cdef bint stopping
    cdef double kill_at
    cdef pid_t parent_pid
    cdef sigset_t wanted, saved_mask
    cdef object error

    def __init__(self, worker_main, int n_workers, double drain_timeout=5.0):
        if not 0 < n_workers <= MAX_WORKERS:
            raise ConfigurationError(f"--workers must be in 1..{MAX_WORKERS}")
        self.worker_main = worker_main
        self.n_workers = n_workers
        self.drain_timeout = drain_timeout
        self.failures = [[] for _ in range(n_workers)]
        for i in range(MAX_WORKERS):
            self.pids[i] = 0
            self.restart_at[i] = 0
        self.n_alive = 0
        self.stopping = False
        self.kill_at = 0
        self.error = None

    def run(self, ready_message=None):
        """Fork the workers and supervise them until they have all exited after SIGTERM/SIGINT
        (returns) or one keeps failing (raises FastpathError)."""
        sigemptyset(&self.wanted)
        sigaddset(&self.wanted, signal.SIGTERM)
        sigaddset(&self.wanted, signal.SIGINT)
        sigaddset(&self.wanted, signal.SIGCHLD)
        if proc.pthread_sigmask(proc.SIG_BLOCK, &self.wanted, &self.saved_mask) != 0:
            raise FastpathError("cannot block signals in the supervisor")
        self.parent_pid = proc.getpid()
        try:
            for i in range(self.n_workers):
                self._spawn(i)
            if ready_message:
                _log(ready_message)
            while self.n_alive > 0 or (not self.stopping and self._restart_pending()):
                self._wait_for_event()
                self._reap()
                self._restart_due()
                self._escalate()
        finally:
            if self.n_alive > 0:          # an exception above: never leave workers behind
                self._begin_stop()
                while self.n_alive > 0:
                    self._wait_for_event()
                    self._reap()
                    self._escalate()
            self._discard_pending_signals()
            proc.pthread_sigmask(proc.SIG_SETMASK, &self.saved_mask, NULL)
        if self.error is not None:
            raise FastpathError(self.error)

    cdef void _wait_for_event(self):
        """Sleep until a signal arrives or the next timed action (a restart, SIGKILL) is due."""
        cdef siginfo_t info
        cdef timespec ts
        cdef int sig
        cdef double timeout = self._next_timeout()
        ts.tv_sec = <long>timeout
        ts.tv_nsec = <long>((timeout - <double>ts.tv_sec) * 1e9)
        with nogil:
            sig = proc.sigtimedwait(&self.wanted, &info, &ts)
        if sig == signal.SIGTERM or sig == signal.SIGINT:
            if not self.stopping:
                _log(f"{signal.Signals(sig).name}: draining the workers")
            self._begin_stop()
        # sig == SIGCHLD, a timeout (EAGAIN) or EINTR: the caller reaps and restarts

    cdef double _next_timeout(self):
        cdef double now = _monotonic(), due = now + 1.0      # reap at least once a second
        cdef int i
        for i in range(self.n_workers):
            if self.restart_at[i] > 0 and self.restart_at[i] < due:
                due = self.restart_at[i]
        if self.kill_at > 0 and self.kill_at < due:
            due = self.kill_at
        return due - now if due > now else 0.0

    cdef bint _restart_pending(self):
        cdef int i
        for i in range(self.n_workers):
            if self.restart_at[i] > 0:
                return True
        return False

    cdef _spawn(self, int index):
        cdef pid_t pid
        cdef int saved_errno
        proc.PyOS_BeforeFork()
        pid = proc.fork()
        if pid == 0:
            proc.PyOS_AfterFork_Child()
            self._child(index)           # never returns
        saved_errno = errno
        proc.PyOS_AfterFork_Parent()
        if pid < 0:
            raise FastpathError(f"cannot fork worker {index}: {strerror(saved_errno).decode()}")
        self.pids[index] = pid
        self.restart_at[index] = 0
        self.n_alive += 1

    cdef void _child(self, int index):
        """In the forked worker: default signal dispositions, the caller's mask, die with the
        supervisor, run ``worker_main(index)`` and exit with its status (never return into the
        supervisor's code)."""
        cdef int code = 1
        proc.signal(signal.SIGTERM, proc.SIG_DFL)
        proc.signal(signal.SIGINT, proc.SIG_DFL)
        proc.pthread_sigmask(proc.SIG_SETMASK, &self.saved_mask, NULL)
        proc.prctl(proc.PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if proc.getppid() != self.parent_pid:      # the supervisor died before prctl took effect
            proc._exit(1)
        try:
            self.worker_main(index)
            code = 0
        except FastpathError as exc:
            _log(f"worker {index}: {exc}")
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                proc._exit(code)

    cdef void _reap(self):
        cdef int i, status
        cdef pid_t pid, got
        for i in range(self.n_workers):
            pid = self.pids[i]
            if pid <= 0:
                continue
            got = waitpid(pid, &status, WNOHANG)
            if got == 0 or (got < 0 and errno == EINTR):
                continue
            self.pids[i] = 0
            self.n_alive -= 1
            if got < 0:                  # ECHILD: someone else reaped it; treat as a failure
                status = 1 << 8
            if not self.stopping:
                self._worker_failed(i, pid, status)

    cdef void _worker_failed(self, int index, pid_t pid, int status):
        cdef double now = _monotonic()
        if WIFEXITED(status):
            how = f"exited with {WEXITSTATUS(status)}"
        elif WIFSIGNALED(status):
            how = f"was killed by {signal.Signals(WTERMSIG(status)).name}"
        else:
            how = f"ended with status {status}"
        recent = [t for t in self.failures[index] if now - t < CRASH_WINDOW_S] + [now]
        self.failures[index] = recent
        if len(recent) > CRASH_LIMIT:
            _log(f"worker {index} (pid {pid}) {how}; it failed {len(recent)} times in "
                 f"{CRASH_WINDOW_S:.0f} s, giving up")
            self.error = f"worker {index} failed {len(recent)} times in {CRASH_WINDOW_S:.0f} s"
            self._begin_stop()
            return
        _log(f"worker {index} (pid {pid}) {how}; restarting")
        self.restart_at[index] = now + RESTART_DELAY_S * len(recent)

    cdef _restart_due(self):
        cdef double now = _monotonic()
        cdef int i
        if self.stopping:
            return
        for i in range(self.n_workers):
            if self.restart_at[i] > 0 and self.restart_at[i] <= now:
                self._spawn(i)

    cdef void _begin_stop(self):
        cdef int i
        if not self.stopping:
            self.stopping = True
            self.kill_at = _monotonic() + self.drain_timeout + KILL_GRACE_S
        for i in range(self.n_workers):
            self.restart_at[i] = 0
            if self.pids[i] > 0:
                kill(self.pids[i], signal.SIGTERM)

    cdef void _escalate(self):
        cdef int i
        if self.kill_at <= 0 or _monotonic() < self.kill_at or self.n_alive == 0:
            return
        for i in range(self.n_workers):
            if self.pids[i] > 0:
                _log(f"worker {i} (pid {self.pids[i]}) still running {self.drain_timeout:.0f} s "
                     f"+ {KILL_GRACE_S:.0f} s after SIGTERM; killing it")
                kill(self.pids[i], signal.SIGKILL)
        self.kill_at = 0

    cdef void _discard_pending_signals(self):
        """Take what arrived during shutdown, so that unblocking cannot deliver a late SIGTERM
        to the caller's default handler (which would kill the process serve() returns to)."""
        cdef siginfo_t info
        cdef timespec zero
        zero.tv_sec = 0
        zero.tv_nsec = 0
        while proc.sigtimedwait(&self.wanted, &info, &zero) > 0:
            pass


def serve(options=None, **kwargs):
    """Run fastpath in the foreground until SIGTERM/SIGINT.  Forks ``workers`` processes (0: one
    per CPU) sharing the port (SO_REUSEPORT), the unix socket, or the socket passed by the
    caller's supervisor (LISTEN_FDS: fastpath/activation.py), restarts any that crashes;
    SIGTERM drains in-flight requests in every worker, then returns."""
    from fastpath import _server
    import threading

    opts = (options or Options(**kwargs)).validate()
    if threading.current_thread() is not threading.main_thread():
        # the supervisor blocks its signals in the calling thread only: anywhere else, SIGTERM
        # would reach the main thread's default handler and kill the process instead
        raise ConfigurationError("fastpath.serve() must run in the main thread")
    _raise_fd_limit(opts.max_connections + (opts.edge_max_connections if opts.edge_addr else 0) + 64
                    + len(opts.node_names))
    if opts.notify_dir:
        # made here, with its parents, so that every worker (and a restarted one) finds it; a
        # directory that cannot be made stops fastpath now with one line, not in a restart loop
        try:
            os.makedirs(opts.notify_dir, mode=0o755, exist_ok=True)
        except OSError as exc:
            raise FastpathError(f"--notify-dir {opts.notify_dir}: cannot make it ({exc.strerror})") from None
    if opts.notify_udp_addr:
        _check_notify_udp(opts.notify_udp_addr, opts.workers)
    if opts.admin_addr:
        _check_port_free(opts.admin_addr, "--admin")
    if opts.edge_addr:
        _check_port_free(opts.edge_addr, "--edge")
    stats = mmap.mmap(-1, max(_server.STATS_SLOT_SIZE * opts.workers, 1))   # shared with children
    # a passed socket (never bound, unlinked or closed here), or a unix one bound now, before
    # the workers fork, so that they all accept on it (SO_REUSEPORT is TCP-only); without
    # either, each worker binds its own SO_REUSEPORT socket
    shared_listener, inherited = _inherited_listener(opts), True
    try:
        if shared_listener is None:
            inherited = False
            if opts.listen_addr[0] == "unix":
                shared_listener = activation.unix_listen_socket(opts.listen_addr[1])
            else:
                _check_port_free(opts.listen_addr, "--listen")
        # said once everything else was accepted: a refused start prints its one error line only
        warning = activation.small_backlog_warning(opts.max_connections * opts.workers)
        if warning:
            _log(warning)
        supervisor = Supervisor(lambda index: _run_worker(opts, index, stats, shared_listener),
                                opts.workers, opts.drain_timeout)
        supervisor.run(f"listening on {opts.listen} ({opts.workers} workers, memcached "
                       f"{','.join(opts.node_addrs)}"
                       f"{', metrics on ' + opts.admin + '/metrics' if opts.admin else ''}"
                       f"{', edge on ' + opts.edge if opts.edge else ''})")
    finally:
        if inherited:
            shared_listener.detach()      # the supervisor's: it stays open, and its path stays
        elif shared_listener is not None:
            shared_listener.close()
            try:
                os.unlink(opts.listen_addr[1])
            except OSError:
                pass
    _log("stopped")
