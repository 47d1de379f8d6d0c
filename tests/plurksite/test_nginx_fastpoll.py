"""The demo renders its poll locations and fastpath's flags with fastpoll's own renderers
(fastpoll.nginx, fastpoll.commandline): one source of truth, so `manage.py fastpoll_nginx` /
`fastpoll_fastpath` and the demo's nginx.conf / fastpath command line cannot drift apart."""
import json
import subprocess
import sys

from fastpoll import commandline
from fastpoll import nginx as fastpoll_nginx
from plurksite import nginxconf, services
from plurksite.config import ROOT, StackConfig, format_hostport


def _config(tmp_path, **env):
    return StackConfig.from_env({"PLURK_VAR_DIR": str(tmp_path), **env})


def test_the_demo_nginx_conf_holds_fastpolls_parts_verbatim(tmp_path):
    config = _config(tmp_path, PLURK_LONGPOLL_MAX_WAIT_S="20")
    settings = nginxconf.fastpoll_nginx_settings(config)
    text = nginxconf.render_include(config)
    assert fastpoll_nginx.render_http(settings).rstrip("\n") in text
    assert fastpoll_nginx.indent(fastpoll_nginx.render_server(settings)) in text
    # the demo's names, which its tests, logs and balancer know
    for line in ("upstream plurk_fastpath {", "map $http_prefer $plurk_wait", "location /Poll/ {",
                 "location ^~ /_plurk_wait/ {", "location @plurk_django {", "proxy_pass http://plurk_django;",
                 "proxy_read_timeout 35s;", f"keepalive {nginxconf.UPSTREAM_KEEPALIVE};",
                 f"server {format_hostport(*config.fastpath)} max_fails=0;"):
        assert line in text, line
    # each JSON error location once in each server: fastpoll's, which the server's error_page
    # lines use (the default server, which closes other Hosts, answers errors found before the
    # Host with them)
    for status in (400, 404, 405, 413, 414, 500, 501, 502, 503, 504, 505):
        assert text.count(f"location = /_plurk_error/{status} ") == 2
        assert f"/_plurk_error/{status};" in text


def test_the_demo_fastpath_argv_is_fastpolls(tmp_path):
    config = _config(tmp_path, PLURK_FASTPATH_NOTIFY="/tmp/n", PLURK_MEMCACHED_TIMEOUT_MS="70")
    resources = ["getMessages", "getUnreadCount"]
    argv = services.fastpath_command(config, resources)
    assert argv == commandline.fastpath_argv(services.fastpoll_settings(config), resources,
                                             services.OBJECT_RESOURCES, max_body=config.max_body_bytes)
    assert argv[argv.index("--object-resources") + 1] == "getThread"
    assert argv[argv.index("--timeout-ms") + 1] == "70" and argv[argv.index("--notify-dir") + 1] == "/tmp/n"


def test_the_demo_settings_say_what_the_runner_says():
    """plurksite.settings' FASTPOLL and services.fastpoll_settings agree on every key both set:
    Django writes what fastpath, started from the latter, reads."""
    code = ("import json; from plurksite import settings, services; "
            "print(json.dumps([settings.FASTPOLL, services.fastpoll_settings(settings.STACK)]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    django, runner = json.loads(out)
    shared = set(django) & set(runner)
    assert {"MEMCACHED_SERVERS", "SECRET_FILE", "NOTIFY_DIRS"} <= shared
    assert {key: django[key] for key in shared} == {key: runner[key] for key in shared}
