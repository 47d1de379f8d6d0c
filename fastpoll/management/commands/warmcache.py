"""``manage.py warmcache``: write the poll answers of recently active users into memcached.

After memcached starts empty (a restart, a new server), every active user's first poll would be a
miss answered by Django.  This writes their answers ahead of the polls, with the same protocol as a
change (``gets`` -> read the database -> ``cas``/``add``), so it never overwrites a newer answer.
"""
import time
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.utils import timezone

from fastpoll import conf, publish, resources
from fastpoll.management.base import StoreCommand


def active_user_ids(everyone=False):
    """Active users who logged in within TOKEN_TTL (who may hold a valid token), or all."""
    users = get_user_model().objects.filter(is_active=True)
    if not everyone:
        since = timezone.now() - timedelta(seconds=conf.get_config()["TOKEN_TTL"])
        users = users.filter(last_login__gte=since)
    return list(users.order_by("-last_login").values_list("pk", flat=True))


def warm(everyone=False):
    """(users, keys that could not be written)."""
    uids = set(active_user_ids(everyone))
    if not uids:
        return 0, set()
    failed = publish.write_answers({r.name: uids for r in resources.all_resources(per="user")})
    return len(uids), failed


class Command(StoreCommand):
    help = ("Write the poll answers of every user who logged in within TOKEN_TTL (--all: every "
            "active user) into memcached, so their first polls are hits.  Exit status 1 when some "
            "answers could not be written.")

    def add_arguments(self, parser):
        parser.add_argument("--all", action="store_true", dest="everyone",
                            help="every active user, not only those who logged in within TOKEN_TTL")

    def handle(self, *args, everyone=False, **options):
        started = time.monotonic()
        count, failed = warm(everyone)
        self.stdout.write(f"warmed {count} user(s) x {len(resources.names(per='user'))} resource(s) in "
                          f"{time.monotonic() - started:.2f}s")
        if failed:
            raise CommandError(f"{len(failed)} answer(s) could not be written (memcached unreachable?); "
                               "`manage.py repaircache` and the polls themselves will fill them")
