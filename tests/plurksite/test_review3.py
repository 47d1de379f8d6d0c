"""Hostile review of issue 32's public-face changes (review3): each test shows a defect found,
marked xfail(strict=True) until the product is fixed; a fix turns it into an XPASS failure, so
whoever fixes it drops the marker."""
import os
import stat

import pytest

from plurksite import nginxconf
from tests.plurksite.test_units import _config
from tests.support.stack import manage


@pytest.mark.xfail(strict=True, reason="review3 F4: renderunits --external-nginx writes nginx-plurk.conf "
                   "with the umask's mode (0644): it holds the probe key that nginx.conf and "
                   "nginx-probe.key keep 0600 (8c1e8e9)")
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


def _pair(tls_dir, days):
    """A self-signed certificate valid for `days` and its key, as <tls_dir>/fullchain.pem and
    privkey.pem (replaced in place, as certbot's renewal replaces them)."""
    import subprocess
    os.makedirs(tls_dir, exist_ok=True)
    for name in ("fullchain.pem", "privkey.pem"):
        if os.path.exists(os.path.join(tls_dir, name)):
            os.unlink(os.path.join(tls_dir, name))
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", os.path.join(tls_dir, "privkey.pem"), "-out", os.path.join(tls_dir, "fullchain.pem"),
                    "-days", str(days), "-subj", "/CN=plurk.test", "-addext", "subjectAltName=IP:127.0.0.10"],
                   check=True, capture_output=True)


@pytest.mark.xfail(strict=True, reason="review3 F2: checkcert reads <var>/tls/fullchain.pem, not the certificate "
                   "nginx serves: renewed on disk but never reloaded (a failed deploy hook), nginx serves the old "
                   "one to its expiry while checkcert says all is well")
def test_checkcert_alerts_on_the_certificate_nginx_still_serves(tmp_path):
    import ssl
    from plurksite import services
    from plurksite.services import free_port
    from tests.plurksite.test_balancer_tls import HOST, Web, _config as balancer_config
    from tests.plurksite.test_roles import _web_addresses
    from tests.support.stack import nginx_in_front_of

    var_dir = tmp_path / "var"
    tls_dir = os.path.join(var_dir, nginxconf.TLS_DIR)
    _pair(tls_dir, 2)                                    # nginx starts with a certificate 2 days from expiry
    hosts = _web_addresses(1)
    config = balancer_config(var_dir, hosts)
    https_port = free_port(HOST)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nginxconf, "HTTPS_PORT", https_port)
        with nginx_in_front_of(config, {hosts[0]: Web}):
            services.wait_for_port(HOST, https_port, name="nginx https")
            _pair(tls_dir, 90)                           # renewed on disk; nginx not reloaded
            served = ssl.get_server_certificate((HOST, https_port))
            served_path = tmp_path / "served.pem"
            served_path.write_text(served)
            assert manage(config, "checkcert", "--days", "21", str(served_path), check=False).returncode == 1
            done = manage(config, "checkcert", "--days", "21", check=False)
    assert done.returncode == 1, done.stdout         # nginx serves one 2 days from expiry: alert


@pytest.mark.xfail(strict=True, reason="review3 F3: a balancer with PLURK_HTTPS=1 (cluster.env is shared) and no "
                   "certificate in <var>/tls renders plain HTTP without a word: a reload after the files go "
                   "missing serves the login page unencrypted on port 80 and closes 443, and the web hosts' "
                   "Secure cookies are dropped by browsers over http (every login a CSRF 403)")
def test_a_balancer_told_https_without_a_certificate_refuses_in_one_line(tmp_path):
    from plurksite.config import StackConfig
    config = StackConfig.from_env({"PLURK_ROLES": "balancer", "PLURK_HTTP": "127.0.0.10:8080",
                                   "PLURK_WEB_HOSTS": "127.0.0.21:8080", "PLURK_VAR_DIR": str(tmp_path / "var"),
                                   "PLURK_SECRET_FILE": str(tmp_path / "secret.key"), "PLURK_HTTPS": "1"})
    assert nginxconf.site_tls(config) is None            # no certificate there
    done = manage(config, "rendernginx", check=False)
    text = open(os.path.join(config.var_dir, "nginx.conf")).read() if done.returncode == 0 else ""
    assert "plain HTTP only" in text or done.returncode != 0   # what it does now: plain HTTP
    assert done.returncode != 0, "rendered plain HTTP for a site told it is https"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "PLURK_HTTPS" in lines[0] and "fullchain.pem" in lines[0], done.stderr
