"""Socket activation (sd_listen_fds(3)): the listening socket belongs to whoever starts fastpath.

systemd's ``fastpath.socket`` in production, a runner or a test otherwise, creates the socket of
``--listen`` and keeps it across restarts of fastpath: connections made while no fastpath runs
wait in the kernel's backlog and the next fastpath accepts them, instead of being refused.

fastpath's side is ``listen_fds()`` (read and unset ``LISTEN_PID``/``LISTEN_FDS``; serve()
then checks the socket against ``--listen``).  A supervisor's side is ``listen_socket()`` and
``activated_command()``::

    sock = activation.listen_socket("unix:/run/plurk/fastpath.sock")     # kept by the caller
    argv, fds = activation.activated_command(sock, [sys.executable, "-m", "fastpath", ...])
    subprocess.Popen(argv, pass_fds=fds)          # again after each exit: same socket

``python -m fastpath.activation FD -- ARGV...`` is the small trampoline that command runs: it
moves FD to 3, sets LISTEN_FDS=1 and LISTEN_PID to its own pid, and execs ARGV (same pid).
Pure Python: the runner imports it without the compiled extension.
"""
import errno
import os
import socket
import stat
import sys

from .errors import ConfigurationError, FastpathError
from .options import is_decimal, parse_listen

LISTEN_FDS_START = 3                  # SD_LISTEN_FDS_START: the first passed descriptor
# asked of listen(): on a restart every held poll comes back at once and waits here for the next
# fastpath; the kernel gives at most net.core.somaxconn (4096 by default), beyond which a unix
# socket refuses (nginx then hands the poll to Django) and a TCP one drops the SYN
BACKLOG = 65535
SOMAXCONN_PATH = "/proc/sys/net/core/somaxconn"
_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


# ---- fastpath's side ------------------------------------------------------------------------

def listen_fds(unset_environment=True):
    """The descriptors passed to this process (3, 4, ...), as sd_listen_fds(3) finds them: none
    unless LISTEN_PID is this process's pid (variables inherited from an activated ancestor
    are not ours).  The variables are unset (when asked) in every case, so that nothing this
    process starts mistakes them for its own; the descriptors are made close-on-exec."""
    pid, count = os.environ.get("LISTEN_PID"), os.environ.get("LISTEN_FDS")
    if unset_environment:
        for name in _VARIABLES:
            os.environ.pop(name, None)
    if count is None or pid is None:
        return []
    if not is_decimal(pid) or int(pid) != os.getpid():
        return []
    if not is_decimal(count):
        raise ConfigurationError(f"LISTEN_FDS={count!r}: expected the number of sockets passed")
    fds = list(range(LISTEN_FDS_START, LISTEN_FDS_START + int(count)))
    for fd in fds:
        try:
            os.set_inheritable(fd, False)
        except OSError:
            raise FastpathError(f"LISTEN_FDS={count} but descriptor {fd} is not open; "
                                f"the supervisor must pass its sockets from descriptor 3 on") from None
    return fds


def _describe(sock):
    if sock.family == socket.AF_UNIX:
        name = sock.getsockname()
        return f"unix:{name if name else '(unnamed)'}"
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _same_tcp_address(bound, wanted):
    import ipaddress
    host, port = wanted
    try:
        hosts = {ipaddress.ip_address(host)}
    except ValueError:              # a host name: any address it resolves to
        try:
            hosts = {ipaddress.ip_address(info[4][0].split("%")[0])
                     for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
        except socket.gaierror:
            return False
    return bound[1] == port and ipaddress.ip_address(bound[0].split("%")[0]) in hosts


def inherited_listener(fds, listen, listen_addr):
    """The socket of ``fds`` (from listen_fds()) checked against ``--listen``: one listening
    SOCK_STREAM socket of the same family and address.  FastpathError (one line, naming the
    fix) otherwise.  The socket stays the supervisor's: the caller must never unlink its path,
    and detaches the object instead of closing it."""
    fix = "pass the socket of --listen (fastpath.socket's ListenStream= and --listen must agree)"
    if len(fds) != 1:
        raise FastpathError(f"LISTEN_FDS={len(fds)}: fastpath takes one socket, for --listen {listen}; "
                            f"pass only that one (one ListenStream= in fastpath.socket)")
    fd = fds[0]
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        raise FastpathError(f"descriptor {fd} (LISTEN_FDS) is not a socket; {fix}")
    sock = socket.socket(fileno=fd)           # family and type as the kernel reports them
    try:
        if sock.type != socket.SOCK_STREAM:
            raise FastpathError(f"descriptor {fd} (LISTEN_FDS) is not a stream socket; {fix} "
                                f"(ListenStream=, not ListenDatagram=)")
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise FastpathError(f"descriptor {fd} (LISTEN_FDS) is not listening; the supervisor "
                                f"must listen() on it before it starts fastpath")
        if listen_addr[0] == "unix":
            name = sock.getsockname() if sock.family == socket.AF_UNIX else None
            same = isinstance(name, str) and name and (
                os.path.abspath(name) == listen_addr[1]
                or os.path.realpath(name) == os.path.realpath(listen_addr[1]))
        else:
            same = (sock.family in (socket.AF_INET, socket.AF_INET6)
                    and _same_tcp_address(sock.getsockname(), listen_addr))
        if not same:
            raise FastpathError(f"descriptor {fd} (LISTEN_FDS) listens on {_describe(sock)}, "
                                f"not on --listen {listen}; {fix}")
        # libevent accepts until EAGAIN.  O_NONBLOCK is on the open file, shared with the
        # supervisor, which only holds the socket and never accepts on it.
        sock.setblocking(False)
    except BaseException:
        sock.detach()                         # not ours to close, even on the way out
        raise
    return sock


# ---- creating sockets (fastpath itself, or a supervisor) ------------------------------------

def backlog_limit(path=SOMAXCONN_PATH):
    """The largest backlog a socket made in this network namespace gets (net.core.somaxconn),
    or None when it cannot be read."""
    try:
        with open(path) as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return None


def small_backlog_warning(held, limit=None):
    """One line when ``held`` polls (what fastpath may hold on its poll listener) cannot all
    wait in the listen backlog during a restart; None when they can, or the limit is unknown."""
    limit = backlog_limit() if limit is None else limit
    wanted = min(held, BACKLOG)
    if limit is None or limit >= wanted:
        return None
    return (f"net.core.somaxconn is {limit}: on a restart only {limit} of the up to {held} held polls "
            f"can wait in the listen backlog for the next fastpath, and nginx hands the others to "
            f"Django at once; raise it: sysctl -w net.core.somaxconn={BACKLOG} (docs/deploy.md, section 3)")


def _reason(exc):
    """An OSError's reason: the socket module raises some without an errno (strerror None)."""
    return exc.strerror or str(exc)


def tcp_listen_socket(addr, what="--listen", reuse_port=False):
    """A listening TCP socket on (host, port), backlog BACKLOG; one line if the port is taken."""
    host, port = addr
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise FastpathError(f"{what} {host}:{port} is already in use") from None
        raise FastpathError(f"cannot listen on {what} {host}:{port}: {_reason(exc)}") from None
    sock.setblocking(False)
    return sock


def unix_listen_socket(path):
    """A listening unix socket at ``path`` (mode 0666), backlog BACKLOG.  A socket file left by
    a dead owner is replaced; one that still answers is refused."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        raise FastpathError(f"--listen unix:{path} is already in use")
    except (FileNotFoundError, ConnectionRefusedError):
        pass
    except OSError as exc:
        raise FastpathError(f"cannot listen on unix:{path}: {_reason(exc)}") from None
    finally:
        probe.close()
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise FastpathError(f"--listen unix:{path} exists and is not a socket")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        # as reachable as a loopback TCP port (nginx's workers may run as another user); limit
        # who can reach it with the permissions of the directory it is in
        os.chmod(path, 0o666)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise FastpathError(f"cannot listen on unix:{path}: {_reason(exc)}") from None
    sock.setblocking(False)
    return sock


def listen_socket(listen):
    """The socket a supervisor keeps for ``--listen`` (``host:port`` or ``unix:/path``): what
    systemd's fastpath.socket makes.  No SO_REUSEPORT: no other process may join it."""
    addr = parse_listen(listen)
    if addr[0] == "unix":
        return unix_listen_socket(addr[1])
    return tcp_listen_socket(addr)


# ---- starting an activated process ----------------------------------------------------------

def activated_command(sock, argv):
    """(argv, pass_fds) that run ``argv`` with ``sock`` passed as systemd passes it: descriptor 3,
    LISTEN_FDS=1, LISTEN_PID=the pid of the process that reads them.

    That pid is known only in the child, after fork: Popen's ``env`` is built before the fork,
    and a ``preexec_fn`` that edits os.environ is unsafe in a threaded parent (and its edit is
    lost when ``env`` is given).  ``sh -c 'LISTEN_PID=$$ exec "$0" "$@"'`` gets the pid right
    (exec keeps it), but it must also move the socket to descriptor 3, and dash (Debian's sh)
    cannot name a descriptor above 9 in a redirection.  So the child execs this module's
    trampoline, which dup2()s the socket to 3, sets both variables and execs ``argv``: same pid."""
    fd = sock.fileno()
    if fd < 0:
        raise ValueError("the socket is closed")
    return [sys.executable, "-m", "fastpath.activation", str(fd), "--", *argv], (fd,)


def _trampoline(args):
    if len(args) < 3 or not is_decimal(args[0]) or args[1] != "--":
        sys.exit("usage: python -m fastpath.activation FD -- ARGV...")
    fd = int(args[0])
    if fd != LISTEN_FDS_START:
        os.dup2(fd, LISTEN_FDS_START)         # inheritable, unlike fd's own close-on-exec copy
        os.close(fd)
    else:
        os.set_inheritable(fd, True)
    for name in _VARIABLES:
        os.environ.pop(name, None)
    os.environ["LISTEN_FDS"] = "1"
    os.environ["LISTEN_PID"] = str(os.getpid())
    try:
        os.execvp(args[2], args[2:])
    except OSError as exc:
        sys.exit(f"fastpath.activation: cannot run {args[2]}: {exc.strerror}")


if __name__ == "__main__":
    _trampoline(sys.argv[1:])
