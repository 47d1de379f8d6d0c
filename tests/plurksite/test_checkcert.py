"""`manage.py checkcert` (docs/deploy.md, section 6): one line and exit 1 when the site's
certificate expires within --days days, for a timer that alerts."""
import contextlib
import os
import re
import socket
import ssl
import subprocess
import threading

from plurksite import nginxconf
from plurksite.cluster import tls
from plurksite.config import StackConfig
from tests.support.stack import manage


def _config(tmp_path):
    return StackConfig.from_env({"PLURK_ROLES": "balancer", "PLURK_HTTP": "127.0.0.10:8080",
                                 "PLURK_WEB_HOSTS": "127.0.0.21:8080", "PLURK_VAR_DIR": str(tmp_path / "var"),
                                 "PLURK_SECRET_FILE": str(tmp_path / "secret.key"),
                                 "PLURK_DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3"})


def _short_lived(path, days):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", os.devnull, "-out", path, "-days", str(days), "-subj", "/CN=plurk.test"],
                   check=True, capture_output=True)
    return path


def _one_line(done):
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1, done.stdout + done.stderr
    return lines[0]


@contextlib.contextmanager
def _tls_server(chain, key):
    """A TLS listener on a free loopback port serving ``chain``: its "HOST:PORT"."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain, key)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def test_the_balancers_certificate_is_checked_by_default_with_what_nginx_serves(tmp_path):
    config = _config(tmp_path)
    chain, key = tls.ensure_site(os.path.join(config.var_dir, nginxconf.TLS_DIR), str(tmp_path / "ca"),
                                 ["DNS:plurk.test"])
    down = manage(config, "checkcert", check=False)             # nothing serves 127.0.0.10:443 here
    assert down.returncode == 2 and "nothing serves TLS at 127.0.0.10:443" in _one_line(down), down.stderr
    with _tls_server(chain, key) as where:
        done = manage(config, "checkcert", "--served", where, check=False)
        late = manage(config, "checkcert", "--served", where, "--days", str(tls.SITE_DAYS + 10), check=False)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and len(lines) == 2, done.stdout + done.stderr
    assert lines[0].startswith(f"{chain}: expires on ") and lines[0].endswith(f"in {tls.SITE_DAYS - 1} days")
    assert lines[1].startswith(f"the certificate served at {where}: expires on ")
    assert late.returncode == 1 and f"{chain} expires on " in late.stderr
    assert f"(under {tls.SITE_DAYS + 10}): renew it" in late.stderr and "\n" not in late.stderr.strip()


def test_a_certificate_expiring_within_the_days_fails_with_one_line(tmp_path):
    config = _config(tmp_path)
    soon = _short_lived(str(tmp_path / "soon.pem"), 2)
    later = _short_lived(str(tmp_path / "later.pem"), 60)
    done = manage(config, "checkcert", "--days", "21", soon, later, check=False)
    assert done.returncode == 1
    assert done.stdout.strip().startswith(f"{later}: expires on ")             # the good one is named
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith(f"CommandError: {soon} expires on ")
    assert re.search(r", in (1\.9|2\.0) days \(under 21\): renew it", line), line
    assert manage(config, "checkcert", "--days", "1", soon, check=False).returncode == 0


def test_no_certificate_or_not_a_certificate_is_one_line_exit_2(tmp_path):
    config = _config(tmp_path)
    none = manage(config, "checkcert", check=False)
    assert none.returncode == 2
    assert _one_line(none) == (f"CommandError: no certificate in {config.var_dir}/tls (this host serves plain "
                               f"HTTP): run it on the balancer, or give the certificate's path")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    bad = manage(config, "checkcert", str(junk), check=False)
    assert bad.returncode == 2 and _one_line(bad).startswith(f"CommandError: {junk}: cannot read a certificate (")


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


def test_checkcert_alerts_on_the_certificate_nginx_still_serves(tmp_path):
    """Renewed on disk but never reloaded (a failed deploy hook): nginx serves the old one to its
    expiry, and the file alone would say all is well."""
    from tests.plurksite.test_balancer_tls import HOST, Web, _config as balancer_config, tls_balancer
    from tests.plurksite.test_roles import _web_addresses

    var_dir = tmp_path / "var"
    tls_dir = os.path.join(var_dir, nginxconf.TLS_DIR)
    _pair(tls_dir, 2)                                    # nginx starts with a certificate 2 days from expiry
    hosts = _web_addresses(1)
    config = balancer_config(var_dir, hosts)
    with tls_balancer(config, {hosts[0]: Web}) as https_port:
        _pair(tls_dir, 90)                           # renewed on disk; nginx not reloaded
        served = ssl.get_server_certificate((HOST, https_port))
        served_path = tmp_path / "served.pem"
        served_path.write_text(served)
        assert manage(config, "checkcert", "--days", "21", str(served_path), check=False).returncode == 1
        done = manage(config, "checkcert", "--days", "21", "--served", f"{HOST}:{https_port}", check=False)
    assert done.returncode == 1, done.stdout         # nginx serves one 2 days from expiry: alert
    assert f"the certificate served at {HOST}:{https_port} expires on " in done.stderr
