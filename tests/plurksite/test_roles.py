"""PLURK_ROLES: one host's share of a cluster (web, memcached, repair, balancer), configured by the
same PLURK_* variables on every host.  Real processes on loopback: each "host" is a set of
127.0.0.x addresses (all local here), with its own var dir and ports."""
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
import requests

from plurksite import nginxconf, services
from plurksite.config import ROOT, ConfigError, StackConfig
from plurksite.services import ServiceError, free_port, free_ports
from plurksite.stack import Stack
from tests.support.stack import manage, nginx_in_front_of


# -- parsing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, roles", [
    ("all", ("all",)),
    ("web", ("web",)),
    (" Memcached , repair ", ("memcached", "repair")),
    ("repair,web,web", ("web", "repair")),
])
def test_roles_are_parsed_into_one_order(value, roles):
    assert StackConfig.from_env({"PLURK_ROLES": value}).roles == roles


def test_all_is_web_memcached_and_repair_but_no_balancer():
    config = StackConfig.from_env({})
    assert config.roles == ("all",)
    assert [config.runs(r) for r in ("web", "memcached", "repair", "balancer")] == [True, True, True, False]
    web = StackConfig.from_env({"PLURK_ROLES": "web"})
    assert [web.runs(r) for r in ("web", "memcached", "repair", "balancer")] == [True, False, False, False]


def test_roles_and_web_hosts_round_trip_through_the_environment():
    config = StackConfig.from_env({"PLURK_ROLES": "balancer,repair", "PLURK_HTTP": "127.0.0.10:80",
                                   "PLURK_WEB_HOSTS": "127.0.0.21:8080, [::1]:8080",
                                   "PLURK_PUBLIC_HOSTS": "127.0.0.10,.example.com"})
    assert config.web_hosts == (("127.0.0.21", 8080), ("::1", 8080))
    assert config.public_hosts == ("127.0.0.10", ".example.com")
    assert StackConfig.from_env(config.to_env()) == config


@pytest.mark.parametrize("env, words", [
    ({"PLURK_ROLES": " , "}, "PLURK_ROLES is empty: expected all, or a comma list of web"),
    ({"PLURK_ROLES": "web,db"}, "PLURK_ROLES='web,db': unknown role 'db'"),
    ({"PLURK_ROLES": "all,balancer"}, "all already means web, memcached and repair"),
    ({"PLURK_ROLES": "web,balancer", "PLURK_WEB_HOSTS": "127.0.0.21:1"}, "run them on two hosts"),
    ({"PLURK_ROLES": "balancer"}, "PLURK_WEB_HOSTS is empty: set it to the web hosts' PLURK_HTTP"),
    ({"PLURK_ROLES": "balancer", "PLURK_WEB_HOSTS": "127.0.0.1:8080"}, "is also in PLURK_WEB_HOSTS"),
    ({"PLURK_WEB_HOSTS": "127.0.0.21:1,127.0.0.21:1"}, "PLURK_WEB_HOSTS lists an address twice"),
    ({"PLURK_WEB_HOSTS": "nonsense"}, "PLURK_WEB_HOSTS='nonsense': expected host:port"),
    ({"PLURK_PUBLIC_HOSTS": "plurk.example.com:80"}, "PLURK_PUBLIC_HOSTS=.*without port"),
])
def test_bad_roles_are_one_line_naming_the_fix(env, words):
    with pytest.raises(ConfigError, match=words) as info:
        StackConfig.from_env(env)
    assert "\n" not in str(info.value)


def test_django_allows_the_public_hosts():
    code = "from plurksite import settings; print(' '.join(settings.ALLOWED_HOSTS))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env=dict(os.environ, PLURK_PUBLIC_HOSTS="127.0.0.10,plurk.example.com")).stdout
    assert {"127.0.0.10", "plurk.example.com"} <= set(out.split())


# -- what each role runs -------------------------------------------------------------------------
def test_all_runs_exactly_the_single_host_stack():
    config = StackConfig.from_env({"PLURK_MEMCACHED": "127.0.0.1:11211,198.51.100.1:11211"})
    names = [cmd.name for cmd in services.commands(config)]
    assert names == ["memcached:127.0.0.1:11211", "gunicorn", "repaircache", "fastpath", "nginx"]
    assert list(services.commands_by_role(config)) == ["memcached", "web", "repair"]


def test_each_role_runs_its_own_share():
    shared = {"PLURK_MEMCACHED": "127.0.0.31:11211,198.51.100.1:11211", "PLURK_WEB_HOSTS": "127.0.0.21:8080"}
    by_role = {roles: [c.name for c in services.commands(StackConfig.from_env(dict(shared, PLURK_ROLES=roles,
                                                                                  PLURK_HTTP="127.0.0.10:80")))]
               for roles in ("web", "memcached", "repair", "balancer", "memcached,repair")}
    assert by_role == {"web": ["gunicorn", "fastpath", "nginx"],
                       "memcached": ["memcached:127.0.0.31:11211"],     # 198.51.100.1 is another host's
                       "repair": ["repaircache"],
                       "balancer": ["balancer"],
                       "memcached,repair": ["memcached:127.0.0.31:11211", "repaircache"]}
    balancer = services.commands_by_role(StackConfig.from_env(dict(shared, PLURK_ROLES="balancer")))
    (name, argv), = balancer["balancer"]
    assert os.path.basename(argv[0]) == "nginx" and argv[argv.index("-c") + 1].endswith("nginx.conf")


def test_a_memcached_role_without_an_entry_of_its_own_is_refused():
    others = "198.51.100.1:11211,198.51.100.2:11211"                   # TEST-NET-2: no host here
    config = StackConfig.from_env({"PLURK_ROLES": "memcached", "PLURK_MEMCACHED": others})
    with pytest.raises(ServiceError, match=r"^PLURK_ROLES has memcached but no PLURK_MEMCACHED entry "
                                           rf"\({others}\) is an address of this host; add"):
        Stack(config).preflight()


# -- the balancer's nginx ------------------------------------------------------------------------
def _balancer_config(var_dir, web_hosts, **overrides):
    env = {"PLURK_ROLES": "balancer", "PLURK_HTTP": f"127.0.0.10:{free_port('127.0.0.10')}",
           "PLURK_WEB_HOSTS": ",".join(web_hosts), "PLURK_VAR_DIR": str(var_dir),
           "PLURK_SECRET_FILE": os.path.join(var_dir, "secret.key")}
    env.update(overrides)
    return StackConfig.from_env(env)


def test_the_balancer_template_renders_and_nginx_accepts_it(tmp_path):
    config = _balancer_config(tmp_path, ["127.0.0.21:8080", "127.0.0.22:8080"], PLURK_LONGPOLL_MAX_WAIT_S="30")
    path = nginxconf.render(config, worker_processes=1)
    text = open(path).read()
    assert "{{" not in text
    for line in ("server 127.0.0.21:8080 max_fails=1 fail_timeout=5s;", "server 127.0.0.22:8080 max_fails=1",
                 "keepalive 9500;", "proxy_read_timeout 50s;",        # max wait + 20: after the web host's 45
                 "proxy_next_upstream error timeout http_502;",      # not 503: "database busy"
                 "X-Forwarded-For $proxy_add_x_forwarded_for;", "worker_connections 19000;",
                 "worker_rlimit_nofile 20000;", f"listen 127.0.0.10:{config.http[1]} ",
                 "POST plurk_web_new_connection;"):     # never on a kept connection a dead host closed
        assert line in text
    directives = [ln.split("#")[0] for ln in text.splitlines()]
    assert not any("non_idempotent" in ln for ln in directives)      # a POST is never sent twice
    services.nginx_test(path, config.var_dir)


class _Recorder(BaseHTTPRequestHandler):
    """A stand-in web host that records what reached it; ``drop`` closes without answering."""
    protocol_version = "HTTP/1.1"
    drop = False
    seen = []

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        record = {"at": self.server.server_address[0], "method": self.command, "path": self.path,
                  "body": body.decode(), **{h: self.headers.get(h) for h in
                                            ("Host", "Prefer", "If-None-Match", "Authorization", "X-Forwarded-For",
                                             "X-Request-ID")}}
        type(self).seen.append(record)
        if self.drop:
            self.close_connection = True
            return
        out = json.dumps(record).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


def _web_addresses(count):
    return [(f"127.0.0.{21 + i}", free_port(f"127.0.0.{21 + i}")) for i in range(count)]


def test_the_balancer_passes_requests_whole(tmp_path):
    class Web(_Recorder):
        seen = []
    hosts = _web_addresses(1)
    config = _balancer_config(tmp_path, [f"{h}:{p}" for h, p in hosts])
    with nginx_in_front_of(config, {hosts[0]: Web}):
        base = config.base_url
        got = requests.get(base + "/Poll/getUnreadCount?x=1", timeout=10, headers={
            "Prefer": "wait=50", "If-None-Match": '"abc"', "Authorization": "Bearer t"})
        posted = requests.post(base + "/api/plurks", data=b'{"content": "hello"}', timeout=10)
    assert got.status_code == posted.status_code == 200
    get, post = Web.seen
    assert (get["method"], get["path"], get["Prefer"], get["If-None-Match"], get["Authorization"]) == \
        ("GET", "/Poll/getUnreadCount?x=1", "wait=50", '"abc"', "Bearer t")
    assert (post["method"], post["body"]) == ("POST", '{"content": "hello"}')
    assert get["Host"] == config.base_url[len("http://"):] and get["X-Forwarded-For"] == "127.0.0.1"
    assert len(get["X-Request-ID"]) == 32 and get["X-Request-ID"] != post["X-Request-ID"]   # made here


def test_the_balancer_closes_another_host_itself_and_keeps_its_web_hosts(tmp_path):
    """A Host that is not the site's is closed here (444): passed on, the web host would close it
    and the balancer would count that as the web host failing (max_fails=1), out for 5 s."""
    class Web(_Recorder):
        seen = []
    hosts = _web_addresses(1)
    config = _balancer_config(tmp_path, [f"{h}:{p}" for h, p in hosts])
    with nginx_in_front_of(config, {hosts[0]: Web}):
        for host in ("evil.example", "127.0.0.10.evil.example"):
            with pytest.raises(requests.ConnectionError):
                requests.get(config.base_url + "/Poll/getUnreadCount", headers={"Host": host}, timeout=10)
        assert Web.seen == []
        for _ in range(3):               # the web host was never marked failed
            assert requests.get(config.base_url + "/api/timeline", timeout=10).status_code == 200
    assert len(Web.seen) == 3


def test_only_the_runners_probe_writes_the_balancers_probe_log(tmp_path):
    class Web(_Recorder):
        seen = []
    hosts = _web_addresses(1)
    config = _balancer_config(tmp_path, [f"{h}:{p}" for h, p in hosts])
    probe_log = os.path.join(config.log_dir(), "nginx-probe.log")
    with nginx_in_front_of(config, {hosts[0]: Web}):
        key = nginxconf.probe_key(config)
        for probe in ("1", "x" * 40, key[:-1] + ("0" if key[-1] != "0" else "1") + "42"):   # one digit off
            assert requests.get(config.base_url + f"/Poll/getUnreadCount?plurk_probe={probe}", timeout=10).ok
        assert requests.get(config.base_url + f"/Poll/getUnreadCount?plurk_probe={nginxconf.probe_key(config)}42",
                            timeout=10).ok
    with open(probe_log) as fh:
        lines = fh.read().splitlines()
    assert len(lines) == 1 and f"plurk_probe={nginxconf.probe_key(config)}42" in lines[0], lines


def test_the_balancer_resends_a_get_but_never_a_post_that_reached_a_web_host(tmp_path):
    class Dropper(_Recorder):
        drop = True
        seen = []
    hosts = _web_addresses(2)
    config = _balancer_config(tmp_path, [f"{h}:{p}" for h, p in hosts])
    # a fresh balancer for each (a failed host is skipped for fail_timeout afterwards)
    with nginx_in_front_of(config, {hosts[0]: Dropper, hosts[1]: Dropper}):
        post = requests.post(config.base_url + "/api/plurks", data=b"{}", timeout=10)
    assert post.status_code == 502 and post.json() == {"error": "backend unavailable"}
    assert [r["method"] for r in Dropper.seen] == ["POST"]            # sent once, to one host
    Dropper.seen.clear()
    with nginx_in_front_of(config, {hosts[0]: Dropper, hosts[1]: Dropper}):
        get = requests.get(config.base_url + "/Poll/getMessages", timeout=10)
    assert get.status_code == 502
    assert sorted(r["at"] for r in Dropper.seen) == sorted(h for h, _ in hosts)    # tried on both


def test_a_busy_database_does_not_take_the_web_hosts_out(tmp_path):
    """Django's 503 ("database busy") is the same on every web host: the balancer passes it on,
    and does not count it against the host, whose polls fastpath still answers."""
    class Busy(_Recorder):
        seen = []

        def _answer(self):
            if self.path.startswith("/api/"):
                type(self).seen.append({"at": self.server.server_address[0], "path": self.path})
                out = b'{"error":"database busy, retry shortly"}'
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                return
            super()._answer()

        do_GET = do_POST = _answer
    hosts = _web_addresses(2)
    config = _balancer_config(tmp_path, [f"{h}:{p}" for h, p in hosts])
    with nginx_in_front_of(config, {hosts[0]: Busy, hosts[1]: Busy}):
        for _ in range(3):
            busy = requests.get(config.base_url + "/api/timeline", timeout=10)
            assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
        polls = [requests.get(config.base_url + "/Poll/getUnreadCount", timeout=10) for _ in range(4)]
    assert [p.status_code for p in polls] == [200] * 4
    assert sum(r["path"] == "/api/timeline" for r in Busy.seen) == 3     # each sent once, never on to the other


# -- real runners on loopback --------------------------------------------------------------------
def test_a_memcached_host_runs_its_own_entries_and_says_so(tmp_path):
    """runstack with PLURK_ROLES=memcached: the entries on this host's addresses, not another's."""
    mine = [f"127.0.0.31:{free_port('127.0.0.31')}", f"127.0.0.32:{free_port('127.0.0.32')}"]
    env = dict(os.environ, PLURK_ROLES="memcached", PLURK_MEMCACHED=",".join(mine + ["198.51.100.1:11211"]),
               PLURK_VAR_DIR=str(tmp_path), PLURK_SECRET_FILE=str(tmp_path / "secret.key"),
               PLURK_DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", DJANGO_SETTINGS_MODULE="plurksite.settings")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "manage.py"), "runstack"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = []
    try:
        threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()
        deadline = time.monotonic() + 30
        while not any("Press Ctrl-C" in line for line in out) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        text = "".join(out)
        assert "PLURK_ROLES=memcached" in text and f"memcached  {mine[0]}, {mine[1]}\n" in text, text
        for spec in mine:
            host, port = spec.split(":")
            with services.socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(b"version\r\n")
                assert sock.recv(100).startswith(b"VERSION ")
        assert "gunicorn" not in text and not os.path.exists(tmp_path / "nginx.conf")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    for spec in mine:
        assert not services.accepts(spec.split(":")[0], int(spec.split(":")[1]))     # stopped with it


@contextlib.contextmanager
def _running(stack):
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.mark.slow          # four runners on loopback: out of `make check`, in `make test`
def test_a_cluster_on_loopback_serves_through_the_balancer_and_survives_a_lost_web_host(tmp_path, caplog):
    """A balancer, two web hosts and a memcached host, each a runner of its own sharing one
    configuration; repair runs on two hosts at once (safe: docs/consistency.md)."""
    caplog.set_level(logging.INFO, logger="plurksite.stack")
    webs = _web_addresses(2)
    balancer_http = f"127.0.0.10:{free_port('127.0.0.10')}"
    shared = {
        "PLURK_MEMCACHED": f"127.0.0.31:{free_port('127.0.0.31')},127.0.0.32:{free_port('127.0.0.32')}",
        "PLURK_DATABASE_URL": f"sqlite:///{tmp_path / 'plurk.sqlite3'}",
        "PLURK_SECRET_FILE": str(tmp_path / "secret.key"),
        "PLURK_WEB_HOSTS": ",".join(f"{h}:{p}" for h, p in webs),
        "PLURK_PUBLIC_HOSTS": "127.0.0.10",
        "PLURK_GUNICORN_WORKERS": "1", "PLURK_FASTPATH_WORKERS": "1",
        "PLURK_EDGE": "",               # as the cluster's web hosts: two on one machine would share its port
    }

    def host(name, roles, http, **own):
        ports = free_ports(3)
        env = dict(shared, PLURK_ROLES=roles, PLURK_HTTP=http, PLURK_VAR_DIR=str(tmp_path / name),
                   PLURK_DJANGO=f"127.0.0.1:{ports[0]}", PLURK_FASTPATH=f"127.0.0.1:{ports[1]}",
                   PLURK_FASTPATH_ADMIN=f"127.0.0.1:{ports[2]}", **own)
        return StackConfig.from_env(env)

    balancer = host("lb", "balancer", balancer_http)
    mc = host("mc", "memcached,repair", "127.0.0.1:9")
    web1 = host("web1", "web,repair", "%s:%d" % webs[0])
    web2 = host("web2", "web", "%s:%d" % webs[1])
    manage(web1, "migrate", "--noinput", "-v", "0")
    with contextlib.ExitStack() as hosts:
        lb = hosts.enter_context(_running(Stack(balancer, nginx_workers=1)))     # first: no web host yet
        assert "NO WEB HOST IS UP" in caplog.text
        hosts.enter_context(_running(Stack(mc)))
        hosts.enter_context(_running(Stack(web1, nginx_workers=1)))
        second = hosts.enter_context(_running(Stack(web2, nginx_workers=1, supervise=False)))
        caplog.clear()
        lb.verify_balancer()
        assert "reached a fastpath (web hosts up: %s:%d, %s:%d)" % (*webs[0], *webs[1]) in caplog.text

        base = balancer.base_url

        def call(method, path, token, **kwargs):
            return requests.request(method, base + path, headers={"Authorization": f"Bearer {token}"},
                                    timeout=10, **kwargs)

        users = {}
        for name in ("writer", "reader"):
            resp = requests.post(base + "/api/signup", json={"username": f"{name}{os.getpid()}",
                                                             "password": "secret-pass-1"}, timeout=10)
            assert resp.status_code == 201, resp.text
            users[name] = resp.json()["token"]
        assert call("POST", "/api/follow", users["reader"], json={"username": f"writer{os.getpid()}"}).ok

        def post_and_see(text):
            assert call("POST", "/api/plurks", users["writer"], json={"content": text}).status_code == 201
            for _ in range(2):                 # round robin: both web hosts answer the same
                polled = call("GET", "/Poll/getMessages", users["reader"])
                assert polled.status_code == 200 and text in polled.text, polled.text

        post_and_see("through the balancer")

        # two repairers (mc and web1) at once: a suspect server is flushed, its debt paid, no error
        host, port = mc.memcached[0]
        with services.socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(b"set pre-outage 0 0 3\r\nold\r\n")
            assert sock.recv(100) == b"STORED\r\n"
        manage(web1, "shell", "-c", f"from fastpoll import ledger; ledger.mark_suspect('{host}:{port}')")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with services.socket.create_connection((host, port), timeout=5) as sock:
                sock.sendall(b"get pre-outage\r\n")
                if sock.recv(100) == b"END\r\n":
                    break
            time.sleep(0.2)
        count = manage(web1, "shell", "-c", "from fastpoll.models import SuspectServer as S; print(S.objects.count())")
        assert count.stdout.split()[-1] == "0"
        flushed = [(tmp_path / n / "log" / "repaircache.log").read_text().count(f"flushed {host}:{port}")
                   for n in ("mc", "web1")]
        assert sum(flushed) >= 1, flushed
        second.service("nginx").kill()          # web2 is lost; its runner does not restart it
        for i in range(4):
            post_and_see(f"after web2 is gone {i}")
    for name in ("mc", "web1"):
        log_text = (tmp_path / name / "log" / "repaircache.log").read_text()
        assert "checking every" in log_text and "Traceback" not in log_text and "failed" not in log_text


def test_a_balancer_refuses_an_address_that_is_no_web_host(tmp_path):
    """PLURK_WEB_HOSTS naming something else (a Django port, say): one line, nothing left running."""
    class NotNginx(_Recorder):
        seen = []
    hosts = _web_addresses(1)
    config = _balancer_config(tmp_path, [f"{h}:{p}" for h, p in hosts])
    from http.server import ThreadingHTTPServer
    server = ThreadingHTTPServer(hosts[0], NotNginx)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stack = Stack(config, nginx_workers=1)
    try:
        with pytest.raises(ServiceError, match=r"^PLURK_WEB_HOSTS entry 127.0.0.21:\d+ answered a poll \(200\) but "
                                               r"is no web host's nginx .*; list the web hosts' PLURK_HTTP"):
            stack.start()
    finally:
        server.shutdown()
        server.server_close()
    assert not services.accepts(*config.http)


def test_a_balancer_on_an_address_of_another_host_is_refused(tmp_path):
    config = _balancer_config(tmp_path, ["127.0.0.21:8080"], PLURK_HTTP="198.51.100.1:80")
    with pytest.raises(ServiceError, match=r"^PLURK_HTTP='198.51.100.1:80' is not an address of this host"):
        Stack(config).preflight()


def test_a_web_host_tells_a_probe_whether_fastpath_answered(tmp_path):
    """The header the balancer's runner reads: "fallback" when Django answered after fastpath."""
    from tests.support.stack import stack_config

    class Django(_Recorder):
        seen = []
    config = stack_config(tmp_path)                     # fastpath not running: every poll falls back
    with nginx_in_front_of(config, {config.django: Django}):
        probe = requests.get(config.base_url + "/Poll/getUnreadCount?plurk_probe=1", timeout=10)
        plain = requests.get(config.base_url + "/Poll/getUnreadCount", timeout=10)
    assert probe.status_code == 200 and probe.headers.get("X-Plurk-Probe") == "fallback"
    assert "X-Plurk-Probe" not in plain.headers


def test_a_web_host_tells_a_probe_that_fastpath_answered(tmp_path):
    from tests.support.stack import stack_config

    class Fastpath(_Recorder):
        seen = []
    config = stack_config(tmp_path)
    assert isinstance(config.fastpath, tuple), config.fastpath      # a TCP stand-in
    with nginx_in_front_of(config, {config.fastpath: Fastpath}):
        probe = requests.get(config.base_url + "/Poll/getUnreadCount?plurk_probe=1", timeout=10)
        plain = requests.get(config.base_url + "/Poll/getUnreadCount", timeout=10)
    assert probe.status_code == 200 and probe.headers.get("X-Plurk-Probe") == "fastpath"
    assert plain.status_code == 200 and "X-Plurk-Probe" not in plain.headers
    assert len(Fastpath.seen) == 2


def test_a_web_host_clears_other_scheme_headers_toward_django(tmp_path):
    """Forwarded, X-Forwarded-Ssl and the like never reach gunicorn (which believes some of them
    from nginx's address), on a page nor on a poll's fallback; nginx's own X-Forwarded-* do."""
    from tests.support.stack import stack_config

    cleared = ("Forwarded", "X-Forwarded-Ssl", "X-Forwarded-Protocol", "X-Forwarded-Scheme", "X-Forwarded-Port",
               "X-Url-Scheme", "Front-End-Https")

    class Django(_Recorder):
        seen = []

        def _answer(self):
            type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = _answer
    config = stack_config(tmp_path)                     # fastpath not running: a poll falls back
    sent = {"Forwarded": "for=203.0.113.9;proto=https;host=evil.example", "X-Forwarded-Ssl": "on",
            "X-Forwarded-Protocol": "ssl", "X-Forwarded-Scheme": "https", "X-Forwarded-Port": "443",
            "X-Url-Scheme": "https", "Front-End-Https": "on", "X-Forwarded-Host": "evil.example",
            "X-Forwarded-Proto": "https"}
    with nginx_in_front_of(config, {config.django: Django}):
        for path in ("/login", "/Poll/getUnreadCount"):
            assert requests.get(config.base_url + path, headers=sent, timeout=10).status_code == 200
    assert len(Django.seen) == 2
    for seen in Django.seen:
        assert not [h for h in cleared if h.lower() in seen], seen
        assert seen["x-forwarded-proto"] == "http" and seen["x-forwarded-host"] == "%s:%d" % config.http, seen


def _error_targets(text):
    """(the URIs the error_page lines send nginx's own errors to, the error locations defined)."""
    import re

    sent = set(re.findall(r"error_page [\d ]+ (/_\w+_error/\d+);", text))
    defined = set(re.findall(r"location = (/_\w+_error/\d+) \{", text))
    return sent, defined


def test_every_json_error_page_of_both_roles_has_its_location(tmp_path):
    """nginx's JSON errors come from one table (fastpoll.nginx.JSON_ERRORS) for the balancer, the
    web host and the poll locations: each error_page names a location that exists, for every
    status of the table."""
    from fastpoll import nginx as fastpoll_nginx

    balancer = open(nginxconf.render(_balancer_config(tmp_path, ["127.0.0.21:8080"]), worker_processes=1)).read()
    web = nginxconf.render_include(StackConfig.from_env({"PLURK_VAR_DIR": str(tmp_path / "web")}))
    table = {sent[0] for _, sent, _ in fastpoll_nginx.JSON_ERRORS}
    for text in (balancer, web):
        sent, defined = _error_targets(text)
        assert sent and sent <= defined, sent - defined
        assert {int(uri.rsplit("/", 1)[1]) for uri in defined} == table


def test_held_polls_are_capped_per_client_address_across_every_web_host(tmp_path):
    """Each web host counts held polls per address in its own zone and the balancer spreads
    requests round robin: the balancer caps them once for the site (PLURK_HELD_PER_ADDRESS), or
    one address would hold the cap once per web host."""
    release, arrived = threading.Event(), []

    class Holding(_Recorder):
        seen = []

        def _answer(self):
            if self.headers.get("Prefer") or "event-stream" in (self.headers.get("Accept") or ""):
                arrived.append(self.server.server_address[0])
                release.wait(30)                           # a held poll: answered when released
            super()._answer()
        do_GET = do_POST = _answer

    hosts = _web_addresses(2)
    config = _balancer_config(tmp_path, [f"{h}:{p}" for h, p in hosts], PLURK_HELD_PER_ADDRESS="3")
    host, port = config.http

    def ask(source, headers):
        sock = socket.create_connection((host, port), timeout=10, source_address=(source, 0))
        sock.sendall(b"GET /Poll/getUnreadCount HTTP/1.1\r\nHost: " + host.encode() + b"\r\n"
                     + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()) + b"\r\n")
        return sock

    def status(sock):
        sock.settimeout(10)
        head = sock.recv(4096).decode("latin-1")
        return int(head.split(" ", 2)[1]), head

    with nginx_in_front_of(config, {hosts[0]: Holding, hosts[1]: Holding}):
        held = [ask("127.0.0.71", {"Prefer": "wait=30"}) for _ in range(2)]
        held.append(ask("127.0.0.71", {"Accept": "text/event-stream"}))
        deadline = time.monotonic() + 10
        while len(arrived) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(arrived) == 3 and set(arrived) == {h for h, _ in hosts}   # round robin: both hosts
        for extra in ({"Prefer": "wait=30"}, {"Accept": "text/event-stream"}):
            code, head = status(ask("127.0.0.71", extra))  # the 4th held poll of the address
            assert code == 429 and "Retry-After: 5" in head, head
        assert len(arrived) == 3                           # refused here, never passed on
        other = ask("127.0.0.72", {"Prefer": "wait=30"})   # another address is held
        short = ask("127.0.0.71", {})                      # a short poll is not counted
        assert status(short)[0] == 200
        release.set()
        assert status(other)[0] == 200 and [status(s)[0] for s in held] == [200, 200, 200]
    off = open(nginxconf.render(_balancer_config(tmp_path / "off", ["127.0.0.21:8080"],
                                                 PLURK_HELD_PER_ADDRESS="0"))).read()
    assert "limit_conn plurk_held" not in off and "limit_conn_zone" not in off
