"""``manage.py renderunits``: this host's systemd units and environment file (docs/deploy.md)."""
import os
from fastpoll import resources as fastpoll_resources

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from plurksite import units
from plurksite.config import ConfigError, StackConfig
from plurksite.services import ServiceError


class Command(BaseCommand):
    help = ("Write one systemd unit per service this host's roles run (ExecStart: the very command line "
            "`manage.py runstack` runs), plurk-fastpath.socket, plurk.target and the environment file, "
            "from this host's PLURK_* variables.")

    def add_arguments(self, parser):
        parser.add_argument("--role", action="append", metavar="R",
                            help="a role of this host (repeatable; default: PLURK_ROLES)")
        parser.add_argument("--out", default=None,
                            help="directory to write into (default: <PLURK_VAR_DIR>/systemd)")
        parser.add_argument("--env-file", default=units.ENV_FILE,
                            help=f"where the units read the environment file from (default {units.ENV_FILE})")
        parser.add_argument("--user", default="plurk", help="User= and Group= of the services (default plurk)")
        parser.add_argument("--group", default=None, help="Group= (default: the user)")
        parser.add_argument("--external-nginx", action="store_true",
                            help="no plurk-nginx.service: write the http-level include (nginx-plurk.conf) for "
                                 "an nginx this host already runs")

    def handle(self, *args, role=None, out=None, env_file=units.ENV_FILE, user="plurk", group=None,
               external_nginx=False, **options):
        from plurkcore import answers

        config = settings.STACK
        if not os.path.isabs(env_file):
            # systemd takes only an absolute EnvironmentFile=; the services would start without PLURK_*
            raise CommandError(f"--env-file {env_file}: give an absolute path, for example {units.ENV_FILE}")
        try:
            if role:
                config = StackConfig.from_env(dict(config.to_env(), PLURK_ROLES=",".join(role)))
            # the poll resources runstack hands fastpath: every one registered with plurkcore
            files = units.render(config, user=user, group=group, env_file=env_file,
                                 settings_module=settings.SETTINGS_MODULE,
                                 poll_resources=sorted(fastpoll_resources.names(per="user")),
                                 external_nginx=external_nginx)
            if external_nginx and (config.runs("web") or config.runs("balancer")):
                from plurksite import nginxconf
                files.append(("nginx-plurk.conf", nginxconf.render_include(config)))
        except (ConfigError, ServiceError) as exc:
            raise CommandError(str(exc)) from None
        out = out or os.path.join(config.var_dir, "systemd")
        try:
            self._write(out, files)
        except OSError as exc:
            raise CommandError(f"cannot write into --out {out}: {exc.strerror} ({exc.filename})") from None
        unit_names = [n for n, _ in files if n.endswith((".service", ".socket", ".target"))]
        self.stdout.write(f"wrote {len(files)} file(s) to {out}/ for PLURK_ROLES={','.join(config.roles)}: "
                          f"{' '.join(n for n, _ in files)}\n"
                          f"install them (docs/deploy.md):\n"
                          f"  install -m 0640 -g {group or user} {out}/plurk.env {env_file}\n"
                          f"  cp {' '.join(os.path.join(out, n) for n in unit_names)} /etc/systemd/system/\n"
                          f"  systemctl daemon-reload && systemctl enable --now {units.TARGET}\n")

    @staticmethod
    def _write(out, files):
        os.makedirs(out, exist_ok=True)
        for name, text in files:
            path = os.path.join(out, name)
            tmp = path + ".tmp"
            with open(tmp, "w") as fh:
                fh.write(text)
            if name == "plurk.env":
                os.chmod(tmp, 0o640)          # holds the database URL (and its password)
            elif name == "nginx-plurk.conf":
                os.chmod(tmp, 0o600)          # nginx's include holds the probe key (nginx-probe.key is 0600)
            os.replace(tmp, path)
