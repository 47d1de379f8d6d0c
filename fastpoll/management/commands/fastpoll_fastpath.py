"""``manage.py fastpoll_fastpath``: fastpath's command line, rendered from ``settings.FASTPOLL``
and the resource registry (sorted, so the output diffs cleanly between deployments).

``--format shell`` (default) prints one shell-quoted line, ``json`` an array, ``args`` the
arguments after ``python -m fastpath``, one a line.  What only a host knows (the entry of
NOTIFY_UDP this host binds, which of several NOTIFY_DIRS is its own) is given as an option.
"""
from django.core.management.base import BaseCommand, CommandError

from fastpoll import commandline, nginx


class Command(BaseCommand):
    help = ("Print the `python -m fastpath ...` command line that serves this project's poll "
            "resources with its settings (FASTPOLL).")
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--format", choices=commandline.FORMATS, default="shell", dest="fmt",
                            help="shell: one quoted line; json: an array; args: one argument a line")
        parser.add_argument("--notify-dir", metavar="DIR",
                            help="this fastpath's notice directory, when NOTIFY_DIRS lists several")
        parser.add_argument("--notify-udp", metavar="HOST:PORT",
                            help="this host's first notice port, when NOTIFY_UDP is set (fastpath --notify-udp)")
        parser.add_argument("--python", metavar="PATH", help="the interpreter (default: this one)")

    def handle(self, *args, fmt="shell", notify_dir=None, notify_udp=None, python=None, **options):
        config = nginx.settings_of()
        overrides = {}
        if notify_dir is not None:
            overrides["notify_dir"] = notify_dir
        if notify_udp is not None:
            overrides["notify_udp"] = notify_udp
        elif config["NOTIFY_UDP"]:
            raise CommandError("FASTPOLL['NOTIFY_UDP'] is set: give this host's first port with "
                               "--notify-udp HOST:PORT (fastpath worker i reads PORT+i)")
        users, objects = commandline.registered("user"), commandline.registered("object")
        if not users and not objects:
            raise CommandError("no poll resource is registered (fastpoll.resource): import the module that "
                               "registers them from an AppConfig.ready()")
        try:
            argv = commandline.fastpath_argv(config, users, objects, python,
                                             **overrides)
        except (commandline.CommandLineError, nginx.RenderError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(commandline.format_argv(argv, fmt))
