"""``manage.py rendernginx``: this host's nginx config, whole or as an include (docs/deploy.md)."""
import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from plurksite import nginxconf, services
from plurksite.config import ConfigError


class Command(BaseCommand):
    help = ("Render this host's nginx config (a web host's, or the balancer's: PLURK_ROLES) into "
            "<PLURK_VAR_DIR>/nginx.conf as runstack does and check it with `nginx -t` (plurk-nginx.service "
            "runs this first); or, with --include, print only its http-level part (log format, maps, "
            "upstreams, the server block) for an nginx this host already runs.")

    def add_arguments(self, parser):
        parser.add_argument("--include", action="store_true",
                            help="print the http-level part, for /etc/nginx/conf.d/plurk.conf")
        parser.add_argument("--workers", default="auto", type=nginxconf.worker_processes,
                            help="worker_processes: auto or 1..1024 (default auto)")

    def handle(self, *args, include=False, workers="auto", **options):
        config = settings.STACK
        if not (config.runs("web") or config.runs("balancer")):
            raise CommandError(f"PLURK_ROLES={','.join(config.roles)} runs no nginx; render on a web host "
                               f"or the balancer (PLURK_ROLES=web or balancer)")
        try:
            if include:
                os.makedirs(config.log_dir(), exist_ok=True)      # its access logs go there
                self.stdout.write(nginxconf.render_include(config), ending="")
                return
            path = nginxconf.render(config, workers)
            services.nginx_test(path, config.var_dir)
        except (ConfigError, services.ServiceError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(path)
