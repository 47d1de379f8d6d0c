"""A throwaway PostgreSQL cluster in a temporary directory: the cluster's db host, the tests'
(tests/support/postgres.py) and the benchmarks'.

initdb refuses to run as root, so when we are root the cluster is created and run as the
``postgres`` user (``runuser``) in a temporary directory that user owns.  Authentication is
``trust`` on 127.0.0.1 and on the networks given (``trust=("10.77.0.0/24",)``); durability is
switched off (fsync, synchronous_commit) for speed.  ``argv_prefix`` runs the server elsewhere,
for example inside a network namespace (``ip netns exec plk-db``).

    with PostgresCluster() as pg:
        url = pg.url("plurk")      # postgres://postgres@127.0.0.1:<port>/plurk

``halt()`` stops the server and keeps its data, so ``start()`` brings the same database back
(a restart); ``stop()`` also removes the data.
"""
import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time

from plurksite.services import ServiceError, free_port, wait_for_port


def find_bindir():
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if candidates:
        return os.path.dirname(candidates[-1])
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(found)
    raise ServiceError("PostgreSQL server binaries not found (apt-get install postgresql)")


class PostgresCluster:
    def __init__(self, port=None, user="postgres", host="127.0.0.1", trust=(), argv_prefix=(),
                 log_path=None, max_connections=50):
        self.bindir = find_bindir()
        self.host = host
        self.port = port or free_port()
        self.superuser = user
        self.trust = tuple(trust)
        self.argv_prefix = list(argv_prefix)
        self.log_path = log_path            # None: postgres.log in the temporary directory
        self.max_connections = max_connections
        self.process = None
        self.tmp = None
        self._log = None
        self.version = os.path.basename(os.path.dirname(self.bindir))

    def _as_owner(self, argv):
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *argv]
        return argv

    @property
    def data_dir(self):
        return os.path.join(self.tmp, "data")

    def init(self):
        """initdb into a new temporary directory, trusting 127.0.0.1 and ``trust``."""
        self.tmp = tempfile.mkdtemp(prefix="plurk-pg-")
        if os.geteuid() == 0:
            shutil.chown(self.tmp, "postgres", "postgres")
            os.chmod(self.tmp, 0o700)
        init = subprocess.run(self._as_owner([os.path.join(self.bindir, "initdb"), "-D", self.data_dir,
                                              "-U", self.superuser, "-A", "trust", "-E", "UTF8",
                                              "--locale=C", "--no-sync"]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.tmp)
        if init.returncode != 0:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
            raise ServiceError(f"initdb failed: {init.stderr.decode(errors='replace').strip()}")
        if self.trust:
            # appended as the postgres user: the file is that user's and must stay so
            lines = "".join(f"host all all {cidr} trust\n" for cidr in self.trust)
            subprocess.run(self._as_owner(["sh", "-c", f"cat >> {self.data_dir}/pg_hba.conf"]),
                           input=lines.encode(), check=True, cwd=self.tmp)

    def start(self):
        """Start the server (after initdb the first time) and wait until it takes connections."""
        fresh = self.tmp is None
        if fresh:
            self.init()
        self._remove_stale_pidfile()
        self._log = open(self.log_path or os.path.join(self.tmp, "postgres.log"), "ab")
        self.process = subprocess.Popen(
            self.argv_prefix + self._as_owner(
                [os.path.join(self.bindir, "postgres"), "-D", self.data_dir, "-p", str(self.port),
                 "-k", self.tmp, "-c", f"listen_addresses={self.host}", "-c", "fsync=off",
                 "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", f"max_connections={self.max_connections}"]),
            stdout=subprocess.DEVNULL, stderr=self._log, cwd=self.tmp, start_new_session=True)
        try:
            wait_for_port(self.host, self.port, process=self.process, name="postgres")
            self._wait_ready()
        except Exception:
            # a restart that fails keeps the data (a later start may succeed); a first start
            # leaves nothing behind
            if fresh:
                self.stop()
            else:
                self.halt()
            raise
        return self

    def _remove_stale_pidfile(self):
        """After a crash (SIGKILL), postmaster.pid names a dead process or a zombie not yet
        reaped: postgres would refuse to start ("lock file already exists").  A rebooted host
        has no such process either, so the file goes."""
        path = os.path.join(self.data_dir, "postmaster.pid")
        try:
            with open(path) as fh:
                pid = int(fh.readline().strip() or 0)
        except (OSError, ValueError):
            return
        try:
            with open(f"/proc/{pid}/stat") as fh:
                alive = fh.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            alive = False
        if not alive:
            os.unlink(path)

    def _wait_ready(self, timeout=30):
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def url(self, dbname, user=None):
        return f"postgres://{user or self.superuser}@{self.host}:{self.port}/{dbname}"

    def create_database(self, dbname, owner=None):
        """Create ``dbname`` (and the login role ``owner``, which then owns it) unless it exists."""
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            if owner and not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (owner,)).fetchone():
                conn.execute(f'CREATE ROLE "{owner}" LOGIN')
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{dbname}"' + (f' OWNER "{owner}"' if owner else ""))
        return self.url(dbname, owner)

    def _postmaster_pid(self):
        try:
            with open(os.path.join(self.data_dir, "postmaster.pid")) as fh:
                return int(fh.readline().strip() or 0) or None
        except (OSError, ValueError, TypeError):
            return None

    def halt(self, timeout=20):
        """Stop the server and keep the data, as ``pg_ctl stop`` (and systemd's unit) does:
        "fast" shutdown (SIGINT to the postmaster: clients are disconnected, not waited for),
        then "immediate" (SIGQUIT: the postmaster ends its backends), SIGKILL last.  The signal
        goes to the postmaster itself, named in postmaster.pid: our child is ``runuser`` (and
        ``ip netns exec``), which need not pass it on."""
        if self.process is not None:
            for sig in (signal.SIGINT, signal.SIGQUIT):
                if self.process.poll() is not None:
                    break
                pid = self._postmaster_pid()
                with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                    os.kill(pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=timeout / 2)
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(timeout=10)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def running(self):
        return self.process is not None and self.process.poll() is None

    def stop(self):
        self.halt()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
