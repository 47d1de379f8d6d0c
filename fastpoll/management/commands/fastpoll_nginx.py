"""``manage.py fastpoll_nginx``: fastpoll's nginx lines, rendered from ``settings.FASTPOLL``.

Without options it prints the poll locations for an existing ``server {}`` block; ``--http``
prints the http-level part (the ``map`` of ``Prefer: wait`` and fastpath's ``upstream``), which
nginx refuses inside a server block.  Both are stable texts: render them into files and diff::

    manage.py fastpoll_nginx --http > /etc/nginx/conf.d/fastpoll-http.conf
    manage.py fastpoll_nginx        > /etc/nginx/snippets/fastpoll.conf   # server { include ...; }
"""
from django.core.management.base import BaseCommand, CommandError

from fastpoll import nginx


class Command(BaseCommand):
    help = ("Print fastpoll's nginx poll locations for an existing server {} block (--http: the "
            "http-level map and fastpath upstream they use), from settings.FASTPOLL.")
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--http", action="store_true",
                            help="the http-level part (map $http_prefer, upstream <NGINX_NAME>_fastpath)")

    def handle(self, *args, http=False, **options):
        try:
            text = nginx.render_http() if http else nginx.render_server()
        except nginx.RenderError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(text, ending="" if text.endswith("\n") else "\n")
