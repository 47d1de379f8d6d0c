"""``manage.py fastpoll_backfill``: poll state and answers for users who existed before fastpoll.

A user gets a poll state (its token epoch) when created or when a token is first issued; users
created before fastpoll was installed have none, so nothing is cached for them until they log in
again.  This gives every user without one a state at epoch 0, then writes the answers of every
active user (per-user resources), with the write protocol of any change: it never overwrites a
newer answer, and can run again at any time.
"""
import time

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from fastpoll import conf, publish, resources
from fastpoll.management.base import StoreCommand
from fastpoll.models import UserState


def backfill_states():
    """Create the missing poll states; returns how many."""
    User = get_user_model()
    size = conf.get_config()["BATCH_SIZE"]
    missing = list(User._default_manager.filter(fastpoll_state__isnull=True).values_list("pk", flat=True))
    for start in range(0, len(missing), size):
        UserState.objects.bulk_create([UserState(user_id=pk) for pk in missing[start:start + size]],
                                      ignore_conflicts=True)
    return len(missing)


def active_users():
    User = get_user_model()
    users = User._default_manager.all()
    if any(f.name == "is_active" and f.concrete for f in User._meta.get_fields()):
        users = users.filter(is_active=True)
    return list(users.values_list("pk", flat=True))


class Command(StoreCommand):
    help = ("Give every user without a poll state one (epoch 0), then write every active user's "
            "answers into memcached.  Idempotent.  Exit status 1 when some answers could not be written.")

    def add_arguments(self, parser):
        parser.add_argument("--states-only", action="store_true",
                            help="create the missing states, write no answers")

    def handle(self, *args, states_only=False, **options):
        started = time.monotonic()
        created = backfill_states()
        self.stdout.write(f"created {created} poll state(s)")
        if states_only:
            return
        names = resources.names(per="user")
        uids = active_users()
        size = conf.get_config()["BATCH_SIZE"] * 10
        failed = set()
        for start in range(0, len(uids), size):
            chunk = set(uids[start:start + size])
            failed |= publish.write_answers({name: chunk for name in names})
        self.stdout.write(f"wrote the answers of {len(uids)} user(s) x {len(names)} resource(s) in "
                          f"{time.monotonic() - started:.2f}s")
        if failed:
            raise CommandError(f"{len(failed)} answer(s) could not be written (memcached unreachable?); "
                               "run the command again, or let `manage.py repaircache` and the polls fill them")
