"""Socket activation (fastpath/activation.py, docs/fastpath.md "Restarts without dropping held
polls"): the test owns the listening socket, as systemd's fastpath.socket does, and starts
fastpath with it (descriptor 3, LISTEN_FDS, LISTEN_PID).  Real processes and sockets."""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest
from pymemcache.client.base import Client

import fastpath._server  # noqa: F401  (a build that does not import fails here, never skips)
from fastpath import activation
from fastpath.errors import ConfigurationError
from plurksite.services import free_port, wait_for_port
from tests.fastpath.conftest import RESOURCES, SECRET, asan_reports, fastpath_env
from tests.fastpath.test_longpoll import SLACK, Poll, etag, held, key

# python -c: pass the sockets whose descriptors are argv[1] (comma list) from 3 on, LISTEN_PID
# argv[2] (empty: this pid), then exec fastpath with argv[3:] -- what activated_command() cannot
# be asked to do wrong (several sockets, another process's pid)
EXEC_WITH_FDS = """
import os, sys
fds = [os.dup(int(fd)) for fd in sys.argv[1].split(",")]   # above 3..3+n first: no overlap
for i, fd in enumerate(fds):
    os.dup2(fd, 3 + i)
    os.set_inheritable(3 + i, True)                          # dup2(3, 3) keeps close-on-exec
os.environ.update(LISTEN_FDS=str(len(fds)), LISTEN_PID=sys.argv[2] or str(os.getpid()))
os.execv(sys.executable, [sys.executable, "-m", "fastpath", *sys.argv[3:]])
"""


@pytest.fixture
def cache(memcached):
    client = Client(memcached.spec, default_noreply=False)
    yield client
    client.close()


class Activated:
    """One ``python -m fastpath`` on a socket this test owns (kept open across its runs)."""

    def __init__(self, tmp_path, memcached, sock, listen, *extra, workers=1):
        self.admin_port = free_port()
        secret = tmp_path / "secret.key"
        secret.write_bytes(SECRET + b"\n")
        self.fastpath_argv = [sys.executable, "-m", "fastpath", "--listen", listen,
                              "--admin", f"127.0.0.1:{self.admin_port}", "--memcached", memcached.spec,
                              "--secret-file", str(secret), "--workers", str(workers),
                              "--resources", RESOURCES, *extra]
        self.sock, self.tmp_path = sock, tmp_path
        self.log = tmp_path / f"fastpath-{self.admin_port}.log"
        self.proc = None

    def start(self):
        argv, fds = activation.activated_command(self.sock, self.fastpath_argv)
        env, cwd = fastpath_env(self.tmp_path)
        self.proc = subprocess.Popen(argv, pass_fds=fds, cwd=cwd, env=env, stdout=open(self.log, "ab"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        # the passed socket accepts (into its backlog) before fastpath runs: ready is the admin port
        wait_for_port("127.0.0.1", self.admin_port, process=self.proc, name="fastpath")
        return self

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=SLACK)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        asan_reports(self.tmp_path)
        return self.proc.returncode

    def output(self):
        return self.log.read_text()


@pytest.fixture
def activated(tmp_path, memcached):
    started = []

    def start(sock, listen, *extra, workers=1):
        fp = Activated(tmp_path, memcached, sock, listen, *extra, workers=workers).start()
        started.append(fp)
        return fp

    yield start
    for fp in started:
        fp.stop()


def connect(address):
    """A connected socket to ("unix", path) or (host, port)."""
    if address[0] == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(SLACK + 60)
        sock.connect(address[1])
        return sock
    return socket.create_connection(address, timeout=SLACK + 60)


def poll_on(address, uid, tag=None, wait=None):
    """test_longpoll's raw poll, on a unix socket or a TCP port."""
    return Poll(None, uid, tag, wait, sock=connect(address))


def listen_pair(tmp_path, kind):
    """(socket, --listen, address) of a listening socket this test owns."""
    if kind == "unix":
        path = str(tmp_path / "fp.sock")
        return activation.listen_socket(f"unix:{path}"), f"unix:{path}", ("unix", path)
    port = free_port()
    return activation.listen_socket(f"127.0.0.1:{port}"), f"127.0.0.1:{port}", ("127.0.0.1", port)


# ---- the passed socket is used --------------------------------------------------------------

@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_a_passed_socket_is_used_and_outlives_fastpath(tmp_path, activated, cache, kind):
    """Polls are answered on the test's socket by every worker; fastpath never binds --listen
    itself (a unix path in use or a TCP port taken without SO_REUSEPORT would stop it), and at
    exit it neither unlinks the path nor closes the socket: it still takes connections."""
    sock, listen, address = listen_pair(tmp_path, kind)
    inode = os.stat(address[1]).st_ino if kind == "unix" else None
    with sock:
        fp = activated(sock, listen, workers=2)
        for uid in range(1, 5):
            cache.set(key(uid), b'{"mine":%d}' % uid)
            status, _, body = poll_on(address, uid).answer()
            assert (status, body) == (200, b'{"mine":%d}' % uid)
        assert fp.stop() == 0
        assert "using the socket passed by the supervisor (descriptor 3, LISTEN_FDS)" in fp.output()
        if kind == "unix":
            assert os.stat(address[1]).st_ino == inode      # neither unlinked nor bound again
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        connect(address).close()              # still listening: the connection waits in the backlog


def _refused(tmp_path, memcached, fds, pid, listen):
    secret = tmp_path / "secret.key"
    secret.write_bytes(SECRET + b"\n")
    env, cwd = fastpath_env(tmp_path)
    argv = [sys.executable, "-c", EXEC_WITH_FDS, ",".join(str(fd) for fd in fds), pid, "--listen", listen,
            "--memcached", memcached.spec, "--secret-file", str(secret), "--resources", RESOURCES]
    return subprocess.run(argv, pass_fds=fds, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=SLACK + 20)


@pytest.mark.parametrize("case, message", [
    ("other path", "listens on unix:{other}, not on --listen unix:{path}; pass the socket of --listen"),
    ("tcp for unix", "listens on 127.0.0.1:{port}, not on --listen unix:{path}"),
    ("not listening", "descriptor 3 (LISTEN_FDS) is not listening; the supervisor must listen()"),
    ("datagram", "descriptor 3 (LISTEN_FDS) is not a stream socket"),
    ("two sockets", "LISTEN_FDS=2: fastpath takes one socket, for --listen unix:{path}; pass only that one"),
])
def test_a_socket_that_is_not_the_listen_address_is_refused(tmp_path, memcached, case, message):
    """Anything but one listening stream socket on --listen stops fastpath with one line."""
    path, other, port = str(tmp_path / "fp.sock"), str(tmp_path / "other.sock"), free_port()
    socks = []
    try:
        if case == "other path":
            socks.append(activation.listen_socket(f"unix:{other}"))
        elif case == "tcp for unix":
            socks.append(activation.listen_socket(f"127.0.0.1:{port}"))
        elif case == "not listening":
            socks.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            socks[0].bind(path)
        elif case == "datagram":
            socks.append(socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
            socks[0].bind(path)
        else:
            socks += [activation.listen_socket(f"unix:{path}"), activation.listen_socket(f"unix:{other}")]
        result = _refused(tmp_path, memcached, [s.fileno() for s in socks], "", f"unix:{path}")
    finally:
        for s in socks:
            s.close()
    assert result.returncode == 1
    err = result.stderr.strip()
    assert err.startswith("fastpath: error: ") and "\n" not in err
    assert message.format(path=path, other=other, port=port) in err


def test_sockets_passed_to_another_process_are_ignored(tmp_path, memcached, cache):
    """LISTEN_PID of another process (inherited from an activated ancestor): fastpath binds
    --listen itself, says why, and leaves the passed socket alone."""
    path, passed_path = str(tmp_path / "fp.sock"), str(tmp_path / "passed.sock")
    passed = activation.listen_socket(f"unix:{passed_path}")
    secret = tmp_path / "secret.key"
    secret.write_bytes(SECRET + b"\n")
    env, cwd = fastpath_env(tmp_path)
    argv = [sys.executable, "-c", EXEC_WITH_FDS, str(passed.fileno()), "1", "--listen", f"unix:{path}",
            "--memcached", memcached.spec, "--secret-file", str(secret), "--resources", RESOURCES]
    with passed:
        proc = subprocess.Popen(argv, pass_fds=[passed.fileno()], cwd=cwd, env=env,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            wait_for_port_file(path, proc)
            cache.set(key(7), b'{"mine":7}')
            assert poll_on(("unix", path), 7).answer()[2] == b'{"mine":7}'
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=SLACK) == 0
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        err = proc.stderr.read()
        assert "LISTEN_FDS=1 is for pid 1, not this process: binding --listen itself" in err
        assert "using the socket passed" not in err
        assert not os.path.exists(path)                 # its own socket: unlinked at exit
        assert os.path.exists(passed_path)              # not its own: untouched


def wait_for_port_file(path, proc):
    import time
    deadline = time.monotonic() + SLACK
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(path)
            return
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {path}")


def test_listen_fds_follows_sd_listen_fds(monkeypatch):
    """The variables are for this pid only, and are unset whoever they were for."""
    monkeypatch.setenv("LISTEN_PID", str(os.getppid()))
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("LISTEN_FDNAMES", "fastpath")
    assert activation.listen_fds() == []
    assert not {"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} & set(os.environ)
    monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
    monkeypatch.setenv("LISTEN_FDS", "0")
    assert activation.listen_fds() == []
    monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
    for count in ("one", "\u00b2"):             # isdigit() is true of '²'; int() is not
        monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
        monkeypatch.setenv("LISTEN_FDS", count)
        with pytest.raises(ConfigurationError, match=f"LISTEN_FDS='{count}'"):
            activation.listen_fds()
    monkeypatch.setenv("LISTEN_PID", "\u00b2")
    monkeypatch.setenv("LISTEN_FDS", "1")
    assert activation.listen_fds() == []


# ---- the handover ---------------------------------------------------------------------------

class PageClient:
    """A page's poll loop, twice: a long-poll held by fastpath A, and the re-poll it sends at
    once when A answers 304 (as plurkweb does).  Every error is kept, none raised."""

    def __init__(self, address, uid, tag):
        self.address, self.uid, self.tag = address, uid, tag
        self.first = self.second = self.error = None
        self.repolled = threading.Event()
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        try:
            poll = poll_on(self.address, self.uid, self.tag, wait=50)
            self.first = poll.answer(timeout=SLACK + 60)
            poll.close()
            repoll = poll_on(self.address, self.uid, self.tag, wait=50)
            self.repolled.set()
            self.second = repoll.answer(timeout=SLACK + 60)
            repoll.close()
        except Exception as exc:          # refused, reset, closed: what must not happen
            self.error = exc
        finally:
            self.repolled.set()
            self.done.set()


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_a_restart_on_the_passed_socket_drops_no_held_poll(tmp_path, activated, cache, kind):
    """fastpath A holds 20 long-polls; SIGTERM answers each 304 and every client re-polls at
    once; fastpath B, started once A has exited, on the same socket, accepts every re-poll from
    the backlog (and 3 polls made while neither ran), holds them and answers them when their
    answer changes.  Nothing is refused, reset or closed unanswered."""
    old, new = b'{"n":0}', b'{"n":1}'
    sock, listen, address = listen_pair(tmp_path, kind)
    with sock:
        for uid in range(1, 24):
            cache.set(key(uid), old)
        a = activated(sock, listen, "--max-wait", "50", "--reread-interval", "60", "--timeout-ms", "2000")
        clients = [PageClient(address, uid, etag(old)) for uid in range(1, 21)]
        held(a, 20)
        assert a.stop() == 0
        assert all(c.repolled.wait(SLACK) for c in clients)
        assert [c.error for c in clients] == [None] * 20
        for c in clients:                 # answered by A: its drain, its own tag, then close
            status, headers, _ = c.first
            assert (status, headers["etag"], headers["connection"]) == (304, etag(old), "close")
            assert headers["preference-applied"] == "wait=50"
        late = [poll_on(address, uid, etag(old), wait=50) for uid in (21, 22, 23)]   # no fastpath runs
        assert not any(c.done.is_set() for c in clients) and not any(p.ready() for p in late)

        b = activated(sock, listen, "--max-wait", "40", "--reread-interval", "1", "--timeout-ms", "2000",
                      workers=2)
        held(b, 23)                       # every waiting connection accepted by B, and held
        for uid in range(1, 24):
            cache.set(key(uid), new)      # B re-reads within a second and answers
        assert all(c.done.wait(SLACK) for c in clients)
        assert [c.error for c in clients] == [None] * 20
        for status, headers, body in [c.second for c in clients] + [p.answer() for p in late]:
            # B's answer: its --max-wait is 40, A's was 50
            assert (status, body, headers["preference-applied"]) == (200, new, "wait=40")
        for p in late:
            p.close()
        assert b.stop() == 0


# -- the listen backlog: where a restart's re-polls wait ------------------------------------
# python -c, run in a network namespace of its own: the backlogs (ss's Send-Q of a listening
# socket) of a unix and a TCP socket made as fastpath makes them
BACKLOGS = """
import subprocess, sys
from fastpath import activation
unix = activation.unix_listen_socket(sys.argv[1])
tcp = activation.tcp_listen_socket(("127.0.0.1", 0))
out = subprocess.run(["ss", "-H", "-l", "-x", "-t", "-n"], capture_output=True, text=True, check=True).stdout
print(" ".join(line.split()[3] for line in out.splitlines() if sys.argv[1] in line or ":%d " % tcp.getsockname()[1] in line + " "))
"""


def _in_netns(somaxconn, argv, tmp_path):
    """``argv`` started in a new network namespace (its loopback up) whose net.core.somaxconn is
    ``somaxconn``: the kernel caps every listen() backlog made there at it."""
    env, cwd = fastpath_env(tmp_path)
    return subprocess.Popen(["unshare", "--net", "sh", "-c",
                             f'ip link set lo up && sysctl -qw net.core.somaxconn={somaxconn} && exec "$@"',
                             "sh", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_a_listen_backlog_takes_all_the_kernel_allows(tmp_path):
    """A restart answers every held poll and each comes back at once, to wait in the backlog for
    the next fastpath; past the backlog a unix socket refuses (nginx then hands the poll to
    Django) and TCP drops the SYN.  So fastpath asks for 65535 and gets what
    net.core.somaxconn allows.  Measured (a restart of fastpath holding 9,000 polls, each
    re-polling at once on a unix socket): 4,903 refused at somaxconn 4096, none at 65535."""
    proc = _in_netns(20000, [sys.executable, "-c", BACKLOGS, str(tmp_path / "fp.sock")], tmp_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.split() == ["20000", "20000"], out
    assert activation.BACKLOG == 65535


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
@pytest.mark.parametrize("somaxconn, max_connections, warned", [(1000, 16384, True), (1000, 1000, False),
                                                                 (70000, 16384, False)])
def test_a_backlog_too_small_for_a_restart_is_said_at_start(tmp_path, somaxconn, max_connections, warned):
    """fastpath may hold --max-connections polls per worker; when net.core.somaxconn is below
    that (and below 65535), it says so in one line at start, naming the sysctl to raise."""
    secret = tmp_path / "secret.key"
    secret.write_bytes(SECRET + b"\n")
    # unshare and sh exec: the process is fastpath's supervisor, which SIGTERM stops
    proc = _in_netns(somaxconn, [sys.executable, "-m", "fastpath", "--listen", f"unix:{tmp_path / 'fp.sock'}",
                                 "--memcached", "127.0.0.1:1", "--secret-file", str(secret), "--workers", "1",
                                 "--resources", RESOURCES, "--max-connections", str(max_connections)], tmp_path)
    try:
        lines = []
        while not lines or "listening on" not in lines[-1]:
            line = proc.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        proc.terminate()
        lines += proc.stderr.readlines()
        assert proc.wait(timeout=30) == 0, "".join(lines)
    finally:
        proc.kill()
        proc.wait()
    said = [line.rstrip("\n") for line in lines if "somaxconn" in line]
    if warned:
        assert len(said) == 1, lines
        assert said[0].endswith(f"net.core.somaxconn is {somaxconn}: on a restart only {somaxconn} of the up to "
                                f"{max_connections} held polls can wait in the listen backlog for the next "
                                f"fastpath, and nginx hands the others to Django at once; raise it: sysctl -w "
                                f"net.core.somaxconn=65535 (docs/deploy.md, section 3)"), said
    else:
        assert said == [], lines
