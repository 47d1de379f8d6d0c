"""A whole stack (memcached, gunicorn, fastpath, nginx) on free loopback ports, for tests."""
import contextlib
import os
import subprocess
import threading
import sys
import time
import uuid

import requests

from plurksite.config import ROOT, StackConfig, format_hostport
from plurksite.services import free_ports
from plurksite.stack import Stack


def stack_config(var_dir, memcached_count=1, **overrides):
    """A StackConfig on free ports with everything (database, secret, logs) under ``var_dir``;
    ``PLURK_EDGE=""`` in ``overrides`` runs it without the edge."""
    ports = free_ports(5 + memcached_count)
    env = {
        # fastpath's edge (stack.config.edge: (host, port); stack.edge_url), as `make run` has it
        "PLURK_EDGE": f"127.0.0.1:{ports.pop()}",
        "PLURK_HTTP": f"127.0.0.1:{ports[0]}",
        "PLURK_DJANGO": f"127.0.0.1:{ports[1]}",
        "PLURK_FASTPATH": f"127.0.0.1:{ports[2]}",
        "PLURK_FASTPATH_ADMIN": f"127.0.0.1:{ports[3]}",
        "PLURK_MEMCACHED": ",".join(f"127.0.0.1:{p}" for p in ports[4:]),
        "PLURK_DATABASE_URL": f"sqlite:///{os.path.join(var_dir, 'plurk.sqlite3')}",
        "PLURK_SECRET_FILE": os.path.join(var_dir, "secret.key"),
        "PLURK_VAR_DIR": str(var_dir),
        "PLURK_GUNICORN_WORKERS": "2",
        "PLURK_FASTPATH_WORKERS": "1",
        # tests hold hundreds of polls of one user (tests/e2e/test_public_face.py sets a cap)
        "PLURK_MAX_HELD_PER_USER": "0",
    }
    env.update(overrides)
    return StackConfig.from_env(env)


def manage(config, *args, check=True, timeout=120):
    env = dict(os.environ, **config.to_env(), DJANGO_SETTINGS_MODULE="plurksite.settings")
    return subprocess.run([sys.executable, os.path.join(ROOT, "manage.py"), *args], env=env,
                          cwd=ROOT, check=check, capture_output=True, text=True, timeout=timeout)


def start_runstack(config, *args, extra_env=None, **popen):
    """`manage.py runstack --nginx-workers 1 *args` (what `make run` ends in) for ``config``, with
    ``extra_env`` over its PLURK_* variables; its output, stderr too, as text on ``proc.stdout``.
    ``popen``: more Popen arguments (``start_new_session=True`` to stop it with its children)."""
    env = dict(os.environ, **config.to_env(), DJANGO_SETTINGS_MODULE="plurksite.settings")
    env.update(extra_env or {})
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "manage.py"), "runstack", "--nginx-workers", "1",
                             *args], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **popen)


def output_until(proc, marker, timeout):
    """What ``proc`` prints up to its first line holding ``marker`` (that line included), or
    until its output ends or ``timeout`` seconds have passed."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            break
    return "".join(lines)


class TestStack(Stack):
    """A Stack with a migrated database of its own and small HTTP helpers."""

    __test__ = False

    def start(self):
        os.makedirs(self.config.var_dir, exist_ok=True)
        manage(self.config, "migrate", "--noinput", "-v", "0")
        super().start()
        return self

    def url(self, path):
        return self.base_url + path

    @property
    def django_url(self):
        return f"http://{format_hostport(*self.config.django)}"

    @property
    def fastpath_url(self):
        return f"http://{format_hostport(*self.config.fastpath)}"

    def signup(self, prefix="user"):
        """Create a user through the public API; return (username, token)."""
        username = f"{prefix}{uuid.uuid4().hex[:10]}"
        resp = requests.post(self.url("/api/signup"), json={"username": username, "password": "secret-pass-1"},
                             timeout=10)
        assert resp.status_code == 201, resp.text
        return username, resp.json()["token"]

    def follow(self, token, username):
        """The user of ``token`` follows ``username`` through the public API."""
        resp = self.api("POST", "/api/follow", token, json={"username": username})
        assert resp.status_code in (200, 201), resp.text

    def follower_pair(self):
        """(writer, reader): two new users, the reader following the writer; each (name, token)."""
        writer, reader = self.signup("writer"), self.signup("reader")
        self.follow(reader[1], writer[0])
        return writer, reader

    def api(self, method, path, token, **kwargs):
        headers = kwargs.pop("headers", {})
        headers["Authorization"] = f"Bearer {token}"
        return requests.request(method, self.url(path), headers=headers, timeout=10, **kwargs)

    def poll(self, resource, token, method="GET", base=None, **kwargs):
        headers = kwargs.pop("headers", {})
        headers["Authorization"] = f"Bearer {token}"
        return requests.request(method, (base or self.base_url) + f"/Poll/{resource}",
                                headers=headers, timeout=10, **kwargs)


@contextlib.contextmanager
def longpoll_stack(tmp_path_factory, name, max_wait_s, **kwargs):
    """A whole stack whose long-polls are held at most ``max_wait_s`` (the long-poll tests')."""
    config = stack_config(tmp_path_factory.mktemp(name), PLURK_LONGPOLL_MAX_WAIT_S=str(max_wait_s))
    with TestStack(config, nginx_workers=1, **kwargs) as running:
        yield running


@contextlib.contextmanager
def nginx_in_front_of(config, handlers):
    """The stack's rendered nginx (one worker) alone, with small HTTP servers standing in for the
    upstreams: ``handlers`` maps an address of ``config`` (config.django, config.fastpath) to a
    BaseHTTPRequestHandler class.  Yields once nginx listens; stops everything afterwards."""
    from http.server import ThreadingHTTPServer

    from plurksite import nginxconf, services

    class StandIn(ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            # nginx resets its upstream connection when the tests' clients go away: not an error
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)

    servers = [StandIn(address, handler) for address, handler in handlers.items()]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    proc = None
    try:
        conf = nginxconf.render(config, worker_processes=1)
        services.nginx_test(conf, config.var_dir)
        proc = subprocess.Popen(services.nginx_command(conf, config.var_dir),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        services.wait_for_port(*config.http, process=proc, name="nginx")
        yield
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        for server in servers:
            server.shutdown()
            server.server_close()
