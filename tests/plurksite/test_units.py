"""The systemd units and the nginx include of docs/deploy.md (plurksite/units.py, rendernginx):
each unit's ExecStart is the runner's argv for the same configuration, for every role; the
environment file reads back into the same configuration; systemd-analyze and nginx -t accept
what is rendered."""
import os
import re
import shlex
import shutil
import stat
import subprocess
from fastpoll import resources as fastpoll_resources

import pytest
import requests

from plurksite import nginxconf, services, units
from plurksite.config import ConfigError, StackConfig
from plurksite.services import free_port, free_ports
from tests.support.stack import manage

OTHER_HOST = "198.51.100.1"          # TEST-NET-2: an entry of another host, never local


def _config(tmp_path, roles, **overrides):
    p = free_ports(4)
    env = {"PLURK_ROLES": roles, "PLURK_VAR_DIR": str(tmp_path / "var"), "PLURK_DJANGO": f"127.0.0.1:{p[3]}",
           "PLURK_SECRET_FILE": str(tmp_path / "secret.key"),
           "PLURK_MEMCACHED": f"127.0.0.1:{p[0]},{OTHER_HOST}:11211",
           "PLURK_DATABASE_URL": "postgres://plurk@127.0.0.1:5432/plurk",
           "PLURK_FASTPATH": f"unix:{tmp_path}/run/fastpath.sock",
           "PLURK_FASTPATH_WORKERS": "2", "PLURK_HTTP": f"127.0.0.1:{p[1]}"}
    if roles == "balancer":
        env.update(PLURK_HTTP=f"127.0.0.10:{p[2]}", PLURK_WEB_HOSTS="127.0.0.21:8080,127.0.0.22:8080")
    env.update(overrides)
    return StackConfig.from_env(env)


def _undouble(word):
    """systemd's own pass over a word: %% and $$ are literal; a lone % is a specifier and a lone
    $ a variable, which systemd would replace (so a writer must never leave one)."""
    def literal(match):
        if match.group(0) in ("%%", "$$"):
            return match.group(0)[0]
        raise AssertionError(f"{word!r}: systemd would expand {match.group(0)!r}")
    return re.sub(r"%%|\$\$|%.?|\$[A-Za-z_{]", literal, word)


def systemd_argv(line):
    """An ExecStart= value as systemd splits it, for the words units.quote_word writes: bare
    words, or double-quoted ones with backslash escapes (as in a POSIX shell); then %% and $$."""
    return [_undouble(w) for w in shlex.split(line, posix=True)]


ROLES = ["all", "web", "memcached", "repair", "balancer", "memcached,repair", "web,repair"]
RESOURCES = ["getMessages", "getMentions", "getUnreadCount"]


@pytest.mark.parametrize("roles", ROLES)
def test_every_exec_start_is_the_runners_argv(tmp_path, roles):
    config = _config(tmp_path, roles)
    files = units.render(config, poll_resources=RESOURCES)
    starts = {name: systemd_argv(line) for name, line in units.exec_starts(files).items()}
    runner = [cmd.argv for cmd in services.commands(config, poll_resources=RESOURCES)]
    assert runner and sorted(starts.values()) == sorted(runner)
    names = [name for name, _ in files]
    assert ("plurk-fastpath.socket" in names) == config.runs("web")
    assert ("plurk-nginx.service" in names) == (config.runs("web") or config.runs("balancer"))
    target = dict(files)["plurk.target"]
    wanted = re.search(r"^Wants=(.*)$", target, re.M).group(1).split()
    assert sorted(wanted) == sorted(n for n in names if n.endswith((".service", ".socket")))


def test_exec_start_follows_the_notice_and_drain_settings(tmp_path):
    port = free_port()
    config = _config(tmp_path, "web", PLURK_FASTPATH_NOTIFY=f"udp:127.0.0.1:{port}-{port + 1}")
    files = dict(units.render(config))
    argv = systemd_argv(units.exec_starts(files.items())["plurk-fastpath.service"])
    assert argv == services.fastpath_command(config)
    assert argv[argv.index("--notify-udp") + 1] == f"127.0.0.1:{port}"
    unit = files["plurk-fastpath.service"]
    # the supervisor kills a worker still draining --drain-timeout (5) + 5 s after SIGTERM
    assert "TimeoutStopSec=15s" in unit and "LimitNOFILE=20000" in unit and "KillSignal=SIGTERM" in unit
    assert "Requires=plurk-fastpath.socket" in unit
    assert "PrivateTmp" not in "".join(files.values())
    socket = files["plurk-fastpath.socket"]
    assert f"ListenStream={tmp_path}/run/fastpath.sock" in socket and "SocketMode=0666" in socket
    tcp = dict(units.render(_config(tmp_path, "web", PLURK_FASTPATH="127.0.0.1:8001")))
    assert "ListenStream=127.0.0.1:8001" in tcp["plurk-fastpath.socket"]


def test_ordering_after_local_memcached_and_postgres(tmp_path):
    files = dict(units.render(_config(tmp_path, "all")))
    memcached = [n for n in files if n.startswith("plurk-memcached-")]
    assert len(memcached) == 1                       # the other host's entry is not ours
    for name in ("plurk-gunicorn.service", "plurk-repaircache.service", "plurk-fastpath.service"):
        assert memcached[0] in re.search(r"^After=(.*)$", files[name], re.M).group(1)
    assert "postgresql.service" in files["plurk-gunicorn.service"]      # the database is local
    remote = dict(units.render(_config(tmp_path, "web",
                                       PLURK_DATABASE_URL=f"postgres://plurk@{OTHER_HOST}:5432/plurk")))
    assert "postgresql.service" not in remote["plurk-gunicorn.service"]
    balancer = dict(units.render(_config(tmp_path, "balancer", PLURK_HTTP="127.0.0.10:80")))
    assert "AmbientCapabilities=CAP_NET_BIND_SERVICE" in balancer["plurk-nginx.service"]


@pytest.mark.parametrize("roles, http, capable", [
    ("balancer", "127.0.0.10:80", True),
    # the balancer binds 443 as soon as a certificate is in its var dir (a reload, not new units)
    ("balancer", "127.0.0.10:8080", True),
    ("web", "127.0.0.1:80", True),
    ("web", "127.0.0.1:8080", False),          # nothing below 1024: no capability
])
def test_nginx_may_bind_ports_below_1024_when_it_binds_any(tmp_path, roles, http, capable):
    files = dict(units.render(_config(tmp_path, roles, PLURK_HTTP=http)))
    assert ("AmbientCapabilities=CAP_NET_BIND_SERVICE" in files["plurk-nginx.service"]) is capable


@pytest.mark.parametrize("word", ["plain", "", "daemon off;", 'say "hi"', "back\\slash", "100%", "$HOME",
                                  "a 'b' c"])
def test_quoting_reads_back_as_the_same_word(word):
    assert systemd_argv(units.command_line(["/bin/echo", word])) == ["/bin/echo", word]


def test_a_control_character_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="control characters") as info:
        units.command_line(["/bin/echo", "a\nb"])
    assert "\n" not in str(info.value)


def _source(path):
    """The environment a POSIX shell gets from ``set -a; . path``: systemd's EnvironmentFile=
    reads single-quoted and plain values the same way (systemd.exec(5))."""
    out = subprocess.run(["/bin/sh", "-c", 'set -a; . "$1"; env -0', "sh", str(path)], env={},
                         capture_output=True, check=True).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


@pytest.mark.parametrize("roles", ["web", "balancer"])
def test_the_environment_file_round_trips(tmp_path, roles):
    config = _config(tmp_path, roles, PLURK_DATABASE_URL="postgres://plurk:p%40ss $x\\y@127.0.0.1:5432/plurk",
                     PLURK_PUBLIC_HOSTS="10.77.0.10,plurk.example.com")
    path = tmp_path / "plurk.env"
    path.write_text(dict(units.render(config))["plurk.env"])
    env = _source(path)
    assert env["DJANGO_SETTINGS_MODULE"] == "plurksite.settings"
    assert env["PLURK_DATABASE_URL"] == config.database_url
    assert StackConfig.from_env(env) == config


def test_a_quote_in_a_value_is_refused_in_one_line(tmp_path):
    config = _config(tmp_path, "web", PLURK_DATABASE_URL="postgres://plurk:it's@127.0.0.1/plurk")
    with pytest.raises(ConfigError, match=r"PLURK_DATABASE_URL=.*percent-encode") as info:
        units.render(config)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
@pytest.mark.parametrize("roles", ROLES)
def test_systemd_analyze_verify_accepts_the_units(tmp_path, roles):
    out = tmp_path / "units"
    out.mkdir()
    paths = []
    for name, text in units.render(_config(tmp_path, roles)):
        if name != "plurk.env":
            (out / name).write_text(text)
            paths.append(str(out / name))
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", *paths], capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (0, "")


def test_systemd_analyze_verify_can_fail(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here")
    unit = tmp_path / "plurk-bad.service"
    unit.write_text(dict(units.render(_config(tmp_path, "web")))["plurk-gunicorn.service"]
                    .replace("KillMode=", "KilMode="))
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True)
    assert "Unknown key" in proc.stderr


# -- the management commands ---------------------------------------------------------------------
def test_renderunits_writes_what_runstack_runs(tmp_path):
    from plurkcore import answers

    config = _config(tmp_path, "web")
    out = tmp_path / "out"
    proc = manage(config, "renderunits", "--out", str(out), "--user", "www-plurk", "--role", "web",
                  "--role", "repair")
    assert "systemctl daemon-reload" in proc.stdout
    both = StackConfig.from_env(dict(config.to_env(), PLURK_ROLES="web,repair"))
    resources = sorted(fastpoll_resources.names(per="user"))        # what runstack hands fastpath
    written = {p.name: p.read_text() for p in out.iterdir()}
    starts = {name: systemd_argv(line) for name, line in units.exec_starts(written.items()).items()}
    assert sorted(starts.values()) == sorted(c.argv for c in services.commands(both, poll_resources=resources))
    assert "User=www-plurk" in written["plurk-gunicorn.service"]
    assert "EnvironmentFile=/etc/plurk/plurk.env" in written["plurk-gunicorn.service"]
    assert StackConfig.from_env(_source(out / "plurk.env")) == both
    assert oct((out / "plurk.env").stat().st_mode & 0o777) == "0o640"


def test_renderunits_for_an_existing_nginx_writes_the_include(tmp_path):
    config = _config(tmp_path, "web")
    out = tmp_path / "out"
    manage(config, "renderunits", "--out", str(out), "--external-nginx")
    assert not (out / "plurk-nginx.service").exists()
    assert "plurk-nginx.service" not in (out / "plurk.target").read_text()
    assert (out / "nginx-plurk.conf").read_text() == nginxconf.render_include(config)


def test_renderunits_refuses_a_bad_role_in_one_line(tmp_path):
    proc = manage(_config(tmp_path, "web"), "renderunits", "--out", str(tmp_path), "--role", "db", check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip() == ("CommandError: PLURK_ROLES='db': unknown role 'db'; expected all, or a comma "
                                   "list of web, balancer, memcached, repair")


def test_rendernginx_writes_the_runners_config_and_checks_it(tmp_path):
    config = _config(tmp_path, "web")
    proc = manage(config, "rendernginx")
    path = os.path.join(config.var_dir, "nginx.conf")
    assert proc.stdout.strip() == path
    assert open(path).read() == nginxconf.render_full(config)
    memcached = manage(_config(tmp_path, "memcached"), "rendernginx", check=False)
    assert memcached.returncode != 0 and "runs no nginx" in memcached.stderr


@pytest.mark.parametrize("args, words", [
    (("rendernginx", "--workers", "0"), "expected auto or a number of workers from 1 to 1024"),
    (("runstack", "--nginx-workers", "-1"), "expected auto or a number of workers from 1 to 1024"),
    (("renderunits", "--env-file", "plurk.env"), "CommandError: --env-file plurk.env: give an absolute path"),
    (("renderunits", "--out", "/proc/nope/units"), "CommandError: cannot write into --out /proc/nope/units: "),
    (("loadusers", "3", "--prefix", "lu", "--out", "/proc/nope/users.json"),
     "CommandError: cannot write --out /proc/nope/users.json: "),
])
def test_commands_refuse_bad_arguments_in_one_line(tmp_path, args, words):
    config = _config(tmp_path, "all", PLURK_DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3")
    if args[0] == "loadusers":
        manage(config, "migrate", "-v", "0")
    proc = manage(config, *args, check=False)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr and words in proc.stderr, proc.stderr
    if args[0] == "loadusers":           # refused before a single account was created
        assert manage(config, "loadusers", "3", "--prefix", "lu", "--out", str(tmp_path / "u.json")).returncode == 0


# -- the include, in the runner's config and in an operator's nginx ------------------------------
def _top_level(text):
    """The directives of an nginx file outside any block (comments dropped)."""
    depth, found = 0, []
    for line in text.splitlines():
        line = line.split("#")[0].strip() if not line.lstrip().startswith(("log_format", "'")) else line.strip()
        if depth == 0 and line and not line.startswith("'"):
            found.append(line.split()[0])
        depth += line.count("{") - line.count("}")
    return found


@pytest.mark.parametrize("roles", ["web", "balancer"])
def test_the_full_config_inlines_exactly_the_include(tmp_path, roles):
    config = _config(tmp_path, roles)
    include = nginxconf.render_include(config)
    full = nginxconf.render_full(config)
    inlined = "\n".join("    " + ln if ln else ln for ln in include.rstrip("\n").split("\n"))
    assert inlined in full and "{{" not in full
    # only what must be at http level: an including nginx's own settings are left alone
    assert set(_top_level(include)) <= {"log_format", "map", "geo", "limit_conn_zone", "upstream", "server"}
    assert "sendfile on;" in include.split("server {", 1)[1]


# Debian's /etc/nginx/nginx.conf (nginx 1.22, bookworm), with its paths moved under {tmp}.
OPERATOR_CONF = """user www-data;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 768; }}
http {{
    sendfile on;
    tcp_nopush on;
    types_hash_max_size 2048;
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    ssl_protocols TLSv1 TLSv1.1 TLSv1.2 TLSv1.3;
    ssl_prefer_server_ciphers on;
    access_log {tmp}/access.log;
    gzip on;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    include {tmp}/conf.d/*.conf;
    server {{ listen 127.0.0.1:{other}; server_name other.example; return 204; }}
}}
"""


def _user_exists(name):
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.mark.parametrize("roles", ["web", "balancer"])
def test_an_operators_nginx_accepts_the_include(tmp_path, roles):
    config = _config(tmp_path, roles)
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    proc = manage(config, "rendernginx", "--include")
    (conf_d / "plurk.conf").write_text(proc.stdout)
    assert proc.stdout == nginxconf.render_include(config)
    conf = tmp_path / "nginx.conf"
    text = OPERATOR_CONF.format(tmp=tmp_path, other=free_port())
    if os.geteuid() != 0 or not _user_exists("www-data"):
        text = text.replace("user www-data;\n", "")       # workers run as this user
    conf.write_text(text)
    services.nginx_test(str(conf), str(tmp_path))
    # and it serves: with nothing upstream, a poll is tried on each and gets the JSON 502
    nginx = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(tmp_path), "-c", str(conf),
                              "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        services.wait_for_port(*config.http, timeout=10, process=nginx, name="nginx")
        resp = requests.get(f"{config.base_url}/Poll/getUnreadCount?plurk_probe=1", timeout=10)
        assert (resp.status_code, resp.json()) == (502, {"error": "backend unavailable"})
    finally:
        nginx.terminate()
        nginx.wait(timeout=10)


def test_the_external_nginx_include_keeps_the_probe_key_private(tmp_path):
    config = _config(tmp_path, "web")
    out = tmp_path / "out"
    old = os.umask(0o022)
    try:
        manage(config, "renderunits", "--out", str(out), "--external-nginx")
    finally:
        os.umask(old)
    key = nginxconf.probe_key(config)
    text = (out / "nginx-plurk.conf").read_text()
    assert key in text                                   # the secret is in the file ...
    mode = stat.S_IMODE(os.stat(out / "nginx-plurk.conf").st_mode)
    assert mode & 0o077 == 0, oct(mode)                  # ... so no one else may read it
