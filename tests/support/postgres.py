"""A throwaway PostgreSQL cluster on a free loopback port, for tests and benchmarks.

initdb refuses to run as root, so when we are root the cluster is created and run as the
``postgres`` user (``runuser``) in a temporary directory that user owns.  Authentication is
``trust`` on 127.0.0.1 only; durability is switched off (fsync, synchronous_commit) for speed.

    with PostgresCluster() as pg:
        url = pg.url("plurk")      # postgres://postgres@127.0.0.1:<port>/plurk

``use_database_url(url)`` points an already configured Django project at it (before any
connection is opened), which is what ``PLURK_TEST_POSTGRES=1`` in tests/plurkcore does.
"""
import glob
import os
import shutil
import subprocess
import tempfile
import time

from plurksite.services import free_port, wait_for_port


def find_bindir():
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if candidates:
        return os.path.dirname(candidates[-1])
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(found)
    raise RuntimeError("PostgreSQL server binaries not found (apt-get install postgresql)")


class PostgresCluster:
    def __init__(self, port=None, user="postgres"):
        self.bindir = find_bindir()
        self.port = port or free_port()
        self.superuser = user
        self.process = None
        self.tmp = None
        self._log = None
        self.version = os.path.basename(os.path.dirname(self.bindir))

    def _as_owner(self, argv):
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *argv]
        return argv

    def start(self):
        self.tmp = tempfile.mkdtemp(prefix="plurk-pg-")
        data = os.path.join(self.tmp, "data")
        if os.geteuid() == 0:
            shutil.chown(self.tmp, "postgres", "postgres")
            os.chmod(self.tmp, 0o700)
        init = subprocess.run(self._as_owner([os.path.join(self.bindir, "initdb"), "-D", data,
                                              "-U", self.superuser, "-A", "trust", "-E", "UTF8",
                                              "--locale=C", "--no-sync"]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.tmp)
        if init.returncode != 0:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise RuntimeError(f"initdb failed: {init.stderr.decode(errors='replace').strip()}")
        self._log = open(os.path.join(self.tmp, "postgres.log"), "wb")
        self.process = subprocess.Popen(
            self._as_owner([os.path.join(self.bindir, "postgres"), "-D", data, "-p", str(self.port),
                            "-k", self.tmp, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                            "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                            "-c", "max_connections=50"]),
            stdout=subprocess.DEVNULL, stderr=self._log, cwd=self.tmp, start_new_session=True)
        try:
            wait_for_port("127.0.0.1", self.port, process=self.process, name="postgres")
            self._wait_ready()
        except Exception:
            self.stop()
            raise
        return self

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

    def url(self, dbname):
        return f"postgres://{self.superuser}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, dbname):
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{dbname}"')
        return self.url(dbname)

    def stop(self):
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()        # "smart" shutdown: SIGTERM
                try:
                    self.process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=10)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def use_database_url(url):
    """Point the configured Django project's default database at ``url`` (no connection may be
    open yet).  Used when settings were loaded before the cluster existed (pytest-django)."""
    from urllib.parse import unquote, urlsplit

    from django.conf import settings
    from django.db import connections

    parts = urlsplit(url)
    settings.DATABASES["default"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "CONN_MAX_AGE": 0,
        "TEST": {},
    }
    connections.__dict__.pop("settings", None)
    from asgiref.local import Local

    connections._connections = Local(connections.thread_critical)
