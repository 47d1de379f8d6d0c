"""``manage.py runstack``: run this host's services (PLURK_ROLES; by default the whole stack:
memcached, gunicorn, fastpath and nginx) in the foreground."""
import io
import logging
import os
import signal
from fastpoll import resources as fastpoll_resources

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from plurksite import nginxconf
from plurksite.config import format_hostport
from plurksite.services import ServiceError
from plurksite.stack import Stack

DEMO_USERS = ("alice", "bob", "carol", "dave")


class Command(BaseCommand):
    help = ("Start this host's services (PLURK_ROLES: all, the whole stack on loopback, or web, memcached, "
            "repair, balancer), restart any that dies, and stop them all on Ctrl-C or SIGTERM.")

    def add_arguments(self, parser):
        parser.add_argument("--nginx-workers", default="auto", type=nginxconf.worker_processes,
                            help="nginx worker_processes: auto or 1..1024 (default: auto)")
        parser.add_argument("--demo", action="store_true",
                            help="once every service answers, load the demo users and plurks (manage.py "
                                 "seeddemo), so that their answers are written into the running memcached")

    def _setup_logging(self, config):
        os.makedirs(config.log_dir(), exist_ok=True)
        fmt = logging.Formatter("%(asctime)s runstack %(levelname)s %(message)s", "%H:%M:%S")
        logger = logging.getLogger("plurksite.stack")
        logger.setLevel(logging.INFO)
        logger.propagate = False
        for handler in (logging.StreamHandler(self.stdout._out),
                        logging.FileHandler(os.path.join(config.log_dir(), "runstack.log"))):
            handler.setFormatter(fmt)
            logger.addHandler(handler)

    def _demo_note(self):
        try:
            from django.contrib.auth import get_user_model

            names = set(get_user_model().objects.filter(username__in=DEMO_USERS)
                        .values_list("username", flat=True))
        except Exception:  # database not migrated yet: runstack still runs
            return ""
        if not names:
            return ""
        return f"  demo logins: {', '.join(sorted(names))} (password plurkdemo1)\n"

    @staticmethod
    def _edge_note(stack):
        if not stack.config.edge:
            return "  edge    off (PLURK_EDGE is empty): pages poll through nginx\n"
        return (f"  edge    {stack.edge_url}  (pages poll fastpath there directly, the site on a miss; "
                f"origins {', '.join(stack.config.edge_origins)})\n")

    def handle(self, *args, **options):
        config = settings.STACK
        self._setup_logging(config)
        from plurkcore import answers

        stack = Stack(config, nginx_workers=options["nginx_workers"],
                      poll_resources=sorted(fastpoll_resources.names(per="user")))
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stack.request_stop)
        try:
            stack.start()
        except ServiceError as exc:
            raise CommandError(str(exc)) from None
        if options["demo"]:
            # after memcached is up, not before (`make run` used to seed first): the writer then
            # stores the demo's answers instead of failing on a memcached not started yet
            try:
                call_command("seeddemo", stdout=io.StringIO())
            except BaseException:
                stack.stop()
                raise
        if config.roles == ("all",):
            self.stdout.write(
                "\nThe stack is up.\n"
                f"  open {config.base_url}/  (nginx: polls go to fastpath first, then Django)\n"
                f"{self._demo_note()}"
                f"  Django  http://{format_hostport(*config.django)}/   "
                f"fastpath {format_hostport(*config.fastpath)}   "
                f"metrics http://{format_hostport(*config.fastpath_admin)}/metrics\n"
                f"  memcached {', '.join(config.memcached_specs)}   logs {config.log_dir()}/\n"
                f"{self._edge_note(stack)}"
                "Press Ctrl-C to stop.\n")
        else:
            roles = "\n".join(f"  {line}" for line in stack.describe())
            page = f"  open {config.base_url}/\n" if config.runs("balancer") else ""
            self.stdout.write(f"\nThis host is up: PLURK_ROLES={','.join(config.roles)}\n{roles}\n{page}"
                              f"  logs {config.log_dir()}/\nPress Ctrl-C to stop.\n")
        try:
            stack.wait()
        finally:
            self.stdout.write("stopping...")
            stack.stop()
