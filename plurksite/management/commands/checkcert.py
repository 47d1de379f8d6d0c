"""``manage.py checkcert``: whether the site's certificate expires within N days, for a timer that
alerts (docs/deploy.md, section 6): one line, and exit 1 when it does.

On the balancer it checks the file and what nginx serves (https, and the edges' TLS port when
there are edges): a renewal whose reload failed leaves nginx serving the old certificate while
the file is new."""
import datetime
import os
import ssl
import subprocess
import tempfile

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from plurksite import nginxconf
from plurksite.config import ConfigError, format_hostport

DEFAULT_DAYS = 21       # certbot renews 30 days before expiry: three weeks left means it has failed


def not_after(path):
    """When the first certificate in ``path`` (a chain's: the site's own) expires, as a UTC
    datetime; CommandError (exit 2) naming the file when it cannot be read."""
    try:
        done = subprocess.run(["openssl", "x509", "-in", path, "-noout", "-enddate"], capture_output=True,
                              text=True, timeout=30)
    except FileNotFoundError:
        raise CommandError("needs the openssl command (apt-get install openssl)", returncode=2) from None
    said = done.stdout.strip()
    if done.returncode != 0 or not said.startswith("notAfter="):
        why = (done.stderr.strip().splitlines() or ["not a PEM certificate"])[-1]
        raise CommandError(f"{path}: cannot read a certificate ({why}); give the chain nginx serves "
                           f"(fullchain.pem)", returncode=2)
    seconds = ssl.cert_time_to_seconds(said.split("=", 1)[1])
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)


def served_certificate(host, port):
    """The certificate served at (host, port), as a PEM file's path (the caller removes it);
    CommandError (exit 2) when nothing answers there with TLS."""
    connect = "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host
    try:
        pem = ssl.get_server_certificate((connect, port), timeout=10)
    except (OSError, ssl.SSLError) as exc:
        raise CommandError(f"nothing serves TLS at {format_hostport(connect, port)} ({exc}): is nginx up?",
                           returncode=2) from None
    fd, path = tempfile.mkstemp(prefix="checkcert-", suffix=".pem")
    with os.fdopen(fd, "w") as fh:
        fh.write(pem)
    return path


def _hostport(value):
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise CommandError(f"--served {value!r}: give HOST:PORT", returncode=2)
    return host.strip("[]"), int(port)


class Command(BaseCommand):
    help = ("Exit 1 with one line when the site's certificate (the balancer's <PLURK_VAR_DIR>/tls/fullchain.pem, "
            "or the files given) expires within --days days; else print when it expires.  For a systemd "
            "timer that alerts (docs/deploy.md, section 6).")

    def add_arguments(self, parser):
        parser.add_argument("certificates", nargs="*", metavar="CERT",
                            help="certificate files (PEM; a chain's first is checked); default: the balancer's")
        parser.add_argument("--days", type=int, default=DEFAULT_DAYS,
                            help=f"alert when fewer than this many days are left (default {DEFAULT_DAYS})")
        parser.add_argument("--served", action="append", default=None, metavar="HOST:PORT",
                            help="check the certificate served there too (default, with no CERT: the balancer's "
                                 "https address and its edges' TLS port)")

    def handle(self, *args, certificates=(), days=DEFAULT_DAYS, served=None, **options):
        if days < 0:
            raise CommandError(f"--days {days}: give a number of days, 0 or more", returncode=2)
        if not certificates:
            config = settings.STACK
            try:
                tls = nginxconf.site_tls(config)
            except ConfigError as exc:
                raise CommandError(str(exc), returncode=2) from None
            if tls is None:
                raise CommandError(f"no certificate in {config.var_dir}/{nginxconf.TLS_DIR} (this host serves "
                                   f"plain HTTP): run it on the balancer, or give the certificate's path",
                                   returncode=2)
            certificates = [tls[0]]
            if served is None:
                served = [format_hostport(*nginxconf.https_address(config))]
                if config.web_edges:
                    served.append(format_hostport(*nginxconf.edge_tls_address(config)))
        checks = [(path, path) for path in certificates]
        temporary = []
        try:
            for where in served or ():
                path = served_certificate(*_hostport(where))
                temporary.append(path)
                checks.append((f"the certificate served at {where}", path))
            self._check(checks, days)
        finally:
            for path in temporary:
                os.unlink(path)

    def _check(self, checks, days):
        now = datetime.datetime.now(datetime.timezone.utc)
        due = []
        for name, path in checks:
            expires = not_after(path)
            left = (expires - now).total_seconds() / 86400
            when = expires.strftime("%Y-%m-%d %H:%M UTC")
            if left < days:
                due.append(f"{name} expired on {when}" if left <= 0 else
                           f"{name} expires on {when}, in {left:.1f} days (under {days}): renew it "
                           f"(certbot renew) and reload nginx")
            else:
                self.stdout.write(f"{name}: expires on {when}, in {int(left)} days")
        if due:
            raise CommandError("; ".join(due), returncode=1)
