"""The public face's settings (issue 32 items 3, 4, 6) as rendered: nginx's trust of a balancer,
the Host names it answers, the probe key, the caps on held connections; Django's HTTPS settings."""
import os

import pytest

from fastpoll import nginx as fastpoll_nginx
from plurksite import nginxconf
from plurksite.config import ConfigError, StackConfig
from tests.support.stack import manage


def _config(tmp_path, **env):
    return StackConfig.from_env({"PLURK_VAR_DIR": str(tmp_path), "PLURK_EDGE": "", **env})


def test_no_trusted_proxy_reads_no_forwarded_header(tmp_path):
    text = nginxconf.render_include(_config(tmp_path))
    assert "    set_real_ip_from " not in text and "geo $realip_remote_addr" not in text
    assert "proxy_set_header X-Forwarded-Proto $scheme;" in text
    assert text.count("proxy_set_header X-Request-ID $request_id;") == 4   # Django and fastpath's 3


def test_trusted_proxies_render_real_ip_and_the_trusted_maps(tmp_path):
    text = nginxconf.render_include(_config(tmp_path, PLURK_TRUSTED_PROXIES="10.77.0.10, 10.77.1.0/24"))
    assert "set_real_ip_from 10.77.0.10/32;" in text and "set_real_ip_from 10.77.1.0/24;" in text
    assert "real_ip_header X-Forwarded-For;" in text and "real_ip_recursive on;" in text
    assert "geo $realip_remote_addr $plurk_from_proxy { default 0; 10.77.0.10/32 1; 10.77.1.0/24 1; }" in text
    assert "proxy_set_header X-Forwarded-Proto $plurk_scheme;" in text
    assert text.count("proxy_set_header X-Request-ID $plurk_request_id;") == 4
    assert "id=$plurk_request_id'" in text


def test_a_bad_trusted_proxy_is_one_line():
    with pytest.raises(ConfigError, match=r"^PLURK_TRUSTED_PROXIES='10.0.0.1,nope': 'nope' is not an address"):
        StackConfig.from_env({"PLURK_TRUSTED_PROXIES": "10.0.0.1,nope"})


def test_other_hosts_get_a_default_server_that_closes(tmp_path):
    text = nginxconf.render_include(_config(tmp_path, PLURK_PUBLIC_HOSTS="plurk.example.com"))
    default = text.split("default_server", 1)[1].split("}", 1)[0]
    assert "return 444;" in default
    assert "server_name .localhost 127.0.0.1 [::1] plurk.example.com;" in text
    debug = nginxconf.render_include(_config(tmp_path, PLURK_DEBUG="1"))
    assert "return 444" not in debug and "server_name _;" in debug


def test_the_probe_key_is_made_once_and_rendered(tmp_path):
    config = _config(tmp_path)
    key = nginxconf.probe_key(config)
    assert len(key) == 32 and nginxconf.probe_key(config) == key
    assert os.stat(os.path.join(tmp_path, "nginx-probe.key")).st_mode & 0o777 == 0o600
    assert f'map $arg_plurk_probe $plurk_probe {{ "~^{key}" 1; default 0; }}' in nginxconf.render_include(config)


def test_held_caps_are_rendered(tmp_path):
    text = nginxconf.render_include(_config(tmp_path, PLURK_HELD_PER_ADDRESS="7"))
    assert "limit_conn_zone $plurk_held_key zone=plurk_held:10m;" in text
    assert 'map $plurk_held_capped $plurk_held_key { 0 ""; default $binary_remote_addr; }' in text
    assert "geo $plurk_held_capped { default 1; 127.0.0.0/8 0; ::1 0; }" in text      # loopback: not capped
    assert text.count("limit_conn plurk_held 7;") == 2        # the hold and stream locations only
    assert "add_header Retry-After 5 always; return 429" in text
    off = nginxconf.render_include(_config(tmp_path, PLURK_HELD_PER_ADDRESS="0"))
    assert "limit_conn_zone $" not in off and "limit_conn plurk_held" not in off
    with pytest.raises(fastpoll_nginx.RenderError, match="NGINX_HELD_PER_ADDRESS"):
        fastpoll_nginx.render_server({"NGINX_HELD_PER_ADDRESS": -1})
    with pytest.raises(fastpoll_nginx.RenderError, match="NGINX_REQUEST_ID"):
        fastpoll_nginx.render_server({"NGINX_REQUEST_ID": "request_id; evil"})


def test_https_settings_come_from_the_environment(tmp_path):
    config = _config(tmp_path, PLURK_HTTPS="1", PLURK_HSTS_SECONDS="300", PLURK_TRUSTED_PROXIES="127.0.0.1",
                     PLURK_SECRET_FILE=str(tmp_path / "secret.key"),
                     PLURK_DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3")
    out = manage(config, "shell", "-c", "from django.conf import settings as s; print(s.SESSION_COOKIE_SECURE, "
                 "s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, s.SECURE_PROXY_SSL_HEADER)").stdout
    assert out.strip().split("\n")[-1] == "True True 300 ('HTTP_X_FORWARDED_PROTO', 'https')"


def _server_blocks(text):
    """The text of each top-level ``server {`` block of a rendered include."""
    blocks = []
    for part in text.split("\nserver {\n")[1:]:
        blocks.append(part.split("\n}\n", 1)[0])
    return blocks


def test_both_server_blocks_of_a_web_host_take_the_header_limits_from_one_table(tmp_path, monkeypatch):
    """The default server (which reads every request's head) and the site's cannot drift apart."""
    text = nginxconf.render_include(_config(tmp_path))
    default, site = _server_blocks(text)
    assert "default_server" in default and "return 444;" in default and "location /Poll/" in site
    for name, value in nginxconf.HEADER_LIMITS:
        for block in (default, site):
            assert block.count(f"\n    {name} ") == 1 and f"\n    {name} {value};\n" in block, (name, block[:400])
    monkeypatch.setattr(nginxconf, "HEADER_LIMITS", (("client_header_buffer_size", "2k"),
                                                     ("large_client_header_buffers", "4 16k")))
    default, site = _server_blocks(nginxconf.render_include(_config(tmp_path)))
    for block in (default, site):
        assert "\n    client_header_buffer_size 2k;\n" in block and "\n    large_client_header_buffers 4 16k;\n" in block
        assert "request_pool_size" not in block


def test_the_rendered_nginx_conf_holding_the_probe_key_is_the_owners_alone(tmp_path):
    config = _config(tmp_path)
    path = nginxconf.nginx_conf_path(config)
    with open(path + ".tmp", "w"):              # left by an older render, 0644 under umask 022
        os.chmod(path + ".tmp", 0o644)
    assert nginxconf.render(config) == path
    assert nginxconf.probe_key(config) in open(path).read()
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.join(config.var_dir, nginxconf.PROBE_KEY_FILE)).st_mode & 0o777 == 0o600
