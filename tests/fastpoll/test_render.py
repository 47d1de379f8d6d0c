"""fastpoll's renderers (fastpoll/nginx.py, fastpoll/commandline.py) and their commands:
``manage.py fastpoll_nginx`` passes ``nginx -t`` inside a minimal server block and falls back
to Django in a real nginx; ``manage.py fastpoll_fastpath`` is a command line fastpath's own
parser takes, naming every registered resource; both load their templates from a copy of the
package outside the repository (as from a wheel)."""
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from django.core.management import CommandError, call_command

from fastpath.options import ConfigurationError, Options, build_parser
from fastpoll import commandline, nginx
from fastpoll import resources as registry
from plurksite.services import free_port, nginx_test
from tests.support.servers import nginx_conf, nginx_server

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"


def run(command, *args):
    out = io.StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("overrides", [
    {},
    {"NGINX_NAME": "myapp", "PATH_PREFIX": "/api/poll/", "FASTPATH_ADDRESS": "unix:/run/myapp/fastpath.sock",
     "DJANGO_UPSTREAM": "unix:/run/myapp/gunicorn.sock:", "LONGPOLL_MAX_WAIT": 0},
], ids=["defaults", "custom"])
def test_the_include_passes_nginx_t_in_a_minimal_server_block(tmp_path, settings, overrides):
    settings.FASTPOLL = dict(settings.FASTPOLL, **overrides)
    http_text, server_text = run("fastpoll_nginx", "--http"), run("fastpoll_nginx")
    assert "{{" not in http_text + server_text
    conf = nginx_conf(tmp_path, http_text, server_text, free_port(), free_port())
    nginx_test(conf, str(tmp_path))           # ServiceError with nginx's complaint otherwise
    name = overrides.get("NGINX_NAME", "fastpoll")
    assert f"upstream {name}_fastpath {{" in http_text and f"map $http_prefer ${name}_wait" in http_text
    assert f"location {overrides.get('PATH_PREFIX', '/Poll/')} {{" in server_text
    assert f"error_page 404 502 503 504 = @{name}_django;" in server_text
    # nginx waits for a held poll longer than fastpath holds it
    assert f"proxy_read_timeout {overrides.get('LONGPOLL_MAX_WAIT', 55) + 15}s;" in server_text


def test_the_http_part_is_refused_inside_a_server_block(tmp_path, settings):
    """Why there are two parts: nginx -t fails when the map is put where the locations go."""
    from plurksite.services import ServiceError

    conf = nginx_conf(tmp_path, "", run("fastpoll_nginx", "--http"), free_port(), free_port())
    with pytest.raises(ServiceError, match="directive is not allowed here"):
        nginx_test(conf, str(tmp_path))


class _Django(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"who": "django", "path": self.path, "host": self.headers["Host"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def nginx_with_the_include(tmp_path, settings):
    """A real nginx with the rendered include; fastpath is not running (every poll falls back)."""
    django = ThreadingHTTPServer(("127.0.0.1", free_port()), _Django)
    threading.Thread(target=django.serve_forever, daemon=True).start()
    settings.FASTPOLL = dict(settings.FASTPOLL, FASTPATH_ADDRESS=f"127.0.0.1:{free_port()}",
                             DJANGO_UPSTREAM=f"127.0.0.1:{django.server_port}")
    port = free_port()
    conf = nginx_conf(tmp_path, run("fastpoll_nginx", "--http"), run("fastpoll_nginx"), port,
                      django.server_port)
    try:
        with nginx_server(conf, tmp_path, port):
            yield f"http://127.0.0.1:{port}", django
    finally:
        django.shutdown()
        django.server_close()


def test_a_poll_falls_back_to_django_and_a_dead_django_answers_json(nginx_with_the_include):
    base, django = nginx_with_the_include
    for headers in ({}, {"Prefer": "wait=20"}):           # the plain and the long-poll location
        resp = requests.get(base + "/Poll/inbox", headers=headers, timeout=5)
        assert resp.status_code == 200 and resp.json()["who"] == "django", headers
        assert resp.json()["path"] == "/Poll/inbox" and resp.json()["host"].startswith("127.0.0.1:")
    # the internal locations are not reachable from outside (they go to the site's location /)
    assert requests.get(base + "/_fastpoll_wait/Poll/inbox", timeout=5).json()["path"] == "/_fastpoll_wait/Poll/inbox"
    django.shutdown()
    django.server_close()
    resp = requests.get(base + "/Poll/inbox", timeout=5)
    assert resp.status_code == 502 and resp.json() == {"error": "backend unavailable"}


@pytest.mark.parametrize("key, value, words", [
    ("NGINX_NAME", "My App", "FASTPOLL['NGINX_NAME'] must be 1-32 of a-z 0-9 _"),
    ("PATH_PREFIX", "/Poll", "FASTPOLL['PATH_PREFIX'] must be a path of one or more segments that starts and ends with /"),
    ("PATH_PREFIX", "/", "(such as '/Poll/')"),
    ("FASTPATH_ADDRESS", "unix:run/fp.sock", "give unix:/absolute/path"),
    ("FASTPATH_ADDRESS", "localhost", "expected host:port, [v6]:port or unix:/path"),
    ("DJANGO_UPSTREAM", "127.0.0.1:8000; deny all", "FASTPOLL['DJANGO_UPSTREAM']"),
    ("LONGPOLL_MAX_WAIT", "55", "FASTPOLL['LONGPOLL_MAX_WAIT'] must be a whole number from 0 to 86400"),
])
def test_a_bad_setting_is_a_one_line_command_error(settings, key, value, words):
    settings.FASTPOLL = dict(settings.FASTPOLL, **{key: value})
    with pytest.raises(CommandError) as info:
        run("fastpoll_nginx")
    assert words in str(info.value) and "\n" not in str(info.value)


# ---- manage.py fastpoll_fastpath ----

@pytest.fixture
def fastpath_settings(settings, tmp_path):
    secret = tmp_path / "secret.key"
    secret.write_bytes(SECRET)
    settings.FASTPOLL = dict(settings.FASTPOLL, SECRET_FILE=str(secret), MEMCACHED_SERVERS=["127.0.0.1:11311",
                             "[::1]:11312"], FASTPATH_ADDRESS="unix:/run/fp/fastpath.sock", FASTPATH_WORKERS=3,
                             FASTPATH_ADMIN="127.0.0.1:8102", MEMCACHED_TIMEOUT=0.02, LONGPOLL_MAX_WAIT=25,
                             NOTIFY_DIRS=[str(tmp_path / "notify")], NOTIFY_UDP=[])
    return settings.FASTPOLL


def parse(argv):
    """fastpath's own parser and checks over the flags (what `python -m fastpath` does first)."""
    assert argv[1:3] == ["-m", "fastpath"]
    return Options(**vars(build_parser().parse_args(argv[3:]))).validate()


def test_the_command_line_parses_with_fastpaths_parser_and_names_every_resource(fastpath_settings):
    argv = json.loads(run("fastpoll_fastpath", "--format", "json"))
    opts = parse(argv)
    users = registry.names(per="user")
    assert users and list(opts.resources) == sorted(users)           # sorted: a stable text
    assert opts.listen == "unix:/run/fp/fastpath.sock" and opts.workers == 3 and opts.admin == "127.0.0.1:8102"
    assert opts.memcached == ("127.0.0.1:11311", "[::1]:11312") and opts.timeout_ms == 20
    assert opts.secret_file == fastpath_settings["SECRET_FILE"] and opts.max_wait == 25
    assert opts.notify_dir == fastpath_settings["NOTIFY_DIRS"][0] and opts.notify_udp is None
    assert argv[0] == sys.executable


def test_a_newly_registered_resource_is_on_the_command_line(fastpath_settings, monkeypatch):
    monkeypatch.setitem(registry._registry, "aNewOne", registry.Resource("aNewOne", dict))
    opts = parse(json.loads(run("fastpoll_fastpath", "--format", "json")))
    assert "aNewOne" in opts.resources and list(opts.resources) == sorted(opts.resources)


def test_the_three_formats_say_the_same(fastpath_settings):
    argv = json.loads(run("fastpoll_fastpath", "--format", "json"))
    assert shlex.split(run("fastpoll_fastpath")) == argv
    assert run("fastpoll_fastpath", "--format", "args").splitlines() == argv[3:]
    assert run("fastpoll_fastpath", "--python", "/opt/py/bin/python3").startswith("/opt/py/bin/python3 -m fastpath ")


def test_host_specific_notices_are_options(fastpath_settings, settings):
    settings.FASTPOLL = dict(fastpath_settings, NOTIFY_DIRS=["/a", "/b"])
    with pytest.raises(CommandError, match=r"lists 2 directories; name this fastpath's with --notify-dir"):
        run("fastpoll_fastpath")
    assert parse(json.loads(run("fastpoll_fastpath", "--format", "json", "--notify-dir", "/b"))).notify_dir == "/b"
    settings.FASTPOLL = dict(fastpath_settings, NOTIFY_UDP=["10.0.0.5:9100", "10.0.0.5:9101"])
    with pytest.raises(CommandError, match="give this host's first port with --notify-udp HOST:PORT"):
        run("fastpoll_fastpath")
    argv = json.loads(run("fastpoll_fastpath", "--format", "json", "--notify-udp", "10.0.0.5:9100"))
    assert argv[argv.index("--notify-udp") + 1] == "10.0.0.5:9100"


@pytest.mark.parametrize("key, value, words", [
    ("FASTPATH_WORKERS", 999, "fastpath --workers must be in 0..256, got 999"),
    ("LONGPOLL_MAX_WAIT", -1, "fastpath --max-wait must be in 0..86400"),
    ("MEMCACHED_TIMEOUT", "fast", "FASTPOLL['MEMCACHED_TIMEOUT'] must be seconds"),
    ("FASTPATH_ADDRESS", "nowhere", "FASTPOLL['FASTPATH_ADDRESS']"),
])
def test_a_setting_fastpath_refuses_is_a_one_line_command_error(fastpath_settings, settings, key, value, words):
    settings.FASTPOLL = dict(fastpath_settings, **{key: value})
    with pytest.raises(CommandError) as info:
        run("fastpoll_fastpath")
    assert words in str(info.value) and "\n" not in str(info.value)


def test_no_registered_resource_is_a_command_error(fastpath_settings, monkeypatch):
    monkeypatch.setattr(registry, "_registry", {})
    with pytest.raises(CommandError, match="no poll resource is registered"):
        run("fastpoll_fastpath")


def test_only_per_object_resources_render_a_fastpath_that_serves_them(fastpath_settings, monkeypatch):
    """A project with per-object resources only: fastpath runs with --object-resources alone (no
    --resources at all, not an empty one), and takes the line."""
    monkeypatch.setattr(registry, "_registry", {"room": registry.Resource("room", dict, per="object")})
    argv = shlex.split(run("fastpoll_fastpath"))
    assert "--resources" not in argv and argv[argv.index("--object-resources") + 1] == "room"
    options = parse(argv)
    assert list(options.object_resources) == ["room"] and not options.resources


NEWER = {"COOKIE_NAME": "sid", "PATH_PREFIX": "/api/poll/", "KEY_PREFIX": "myapp"}


def test_the_names_always_reach_fastpath(fastpath_settings):
    argv = json.loads(run("fastpoll_fastpath", "--format", "json"))
    assert argv[argv.index("--cookie-name") + 1] == "plurk_token"
    assert argv[argv.index("--path-prefix") + 1] == "/Poll/"
    assert argv[argv.index("--key-prefix") + 1] == "p1"
    # the demo names its cookie plurk_token (plurksite); the library's own is fastpoll_token
    plain = commandline.fastpath_argv({"SECRET_FILE": "/s"}, ["a"])
    assert plain[plain.index("--cookie-name") + 1] == "fastpoll_token"


def _newer_argv(settings, fastpath_settings, monkeypatch):
    settings.FASTPOLL = dict(fastpath_settings, **NEWER)
    monkeypatch.setitem(registry._registry, "thread", registry.Resource("thread", dict, per="object"))
    monkeypatch.setitem(registry._registry, "room", registry.Resource("room", dict, per="object"))
    return json.loads(run("fastpoll_fastpath", "--format", "json"))


def test_other_names_and_object_resources_are_flags(settings, fastpath_settings, monkeypatch):
    argv = _newer_argv(settings, fastpath_settings, monkeypatch)
    assert argv[argv.index("--cookie-name") + 1] == "sid"
    assert argv[argv.index("--path-prefix") + 1] == "/api/poll/"
    assert argv[argv.index("--key-prefix") + 1] == "myapp"
    assert argv[argv.index("--object-resources") + 1].split(",") == ["getThread", "room", "thread"]
    assert "thread" not in argv[argv.index("--resources") + 1].split(",")


def test_fastpaths_parser_takes_the_names_and_object_resources(settings, fastpath_settings, monkeypatch):
    opts = parse(_newer_argv(settings, fastpath_settings, monkeypatch))
    assert (opts.cookie_name, opts.path_prefix, opts.key_prefix) == ("sid", "/api/poll/", "myapp")
    assert tuple(opts.object_resources) == ("getThread", "room", "thread")


# ---- package data: the templates come with the package ----

def test_the_templates_load_from_a_copy_of_the_package_outside_the_repository(tmp_path):
    shutil.copytree(os.path.join(ROOT, "fastpoll"), tmp_path / "site" / "fastpoll",
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = ("import django, fastpoll; from django.conf import settings\n"
              "settings.configure(FASTPOLL={'NGINX_NAME': 'copied'})\n"
              "from fastpoll import nginx\n"
              "print(fastpoll.__file__)\n"
              "print(nginx.render_http()); print(nginx.render_server())\n")
    # the copy first on the path, the repository (fastpath, Django's venv) after it
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), ROOT]))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, _, text = proc.stdout.partition("\n")
    assert first == str(tmp_path / "site" / "fastpoll" / "__init__.py")
    assert "upstream copied_fastpath {" in text and "location = /_copied_error/502" in text


def test_the_renderers_take_a_plain_mapping_over_the_defaults():
    """What a runner that is not Django passes (plurksite.nginxconf, plurksite.services)."""
    text = nginx.render_server({"NGINX_NAME": "x", "LONGPOLL_MAX_WAIT": 5})
    assert "location /Poll/ {" in text and "proxy_read_timeout 20s;" in text and "@x_django" in text
    argv = commandline.fastpath_argv({"SECRET_FILE": "/s"}, ["b", "a"], python="py")
    assert argv[:3] == ["py", "-m", "fastpath"] and argv[argv.index("--resources") + 1] == "b,a"
    # fastpath has no default list: a command line without resources is refused here, in one line
    with pytest.raises(commandline.CommandLineError, match=r"^fastpath needs its per-user poll resources .*"
                       r"commandline\.registered\('user'\)$"):
        commandline.fastpath_argv({"SECRET_FILE": "/s"})
    argv = commandline.fastpath_argv({"SECRET_FILE": "/s"}, object_resources=["thread"])
    assert "--resources" not in argv and argv[argv.index("--object-resources") + 1] == "thread"


def test_streams_are_rendered_from_the_same_settings_on_both_sides():
    argv = commandline.fastpath_argv({"SECRET_FILE": "/s", "STREAM_HEARTBEAT": 7, "STREAM_MAX": 90}, ["a"])
    assert argv[argv.index("--stream-heartbeat") + 1] == "7" and argv[argv.index("--max-stream") + 1] == "90"
    stream = nginx.render_server({"STREAM_HEARTBEAT": 7}).split("/_fastpoll_stream/ {", 1)[1].split("\n}", 1)[0]
    assert "proxy_read_timeout 22s;" in stream
    assert commandline.setting_error("STREAM_HEARTBEAT", {"STREAM_HEARTBEAT": 0}) is not None
