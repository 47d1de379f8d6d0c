"""``manage.py loadusers N --prefix P --out FILE``: accounts for the load simulation.

Creates N users (no usable password) with their plurkcore state in bulk and writes
``[{"username", "token"}, ...]`` to FILE.  Simulated users start logged in, as most pollers of a
real site are: signing 300 users up at once would measure Django's password hashing (PBKDF2,
deliberately ~0.5 s of CPU each), not polling.
"""
import json
from fastpoll import resources as fastpoll_resources

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from fastpoll.auth import sign
from fastpoll.models import UserState
from plurkcore.models import ReadCursor


class Command(BaseCommand):
    help = "Create N logged-in accounts for the locust simulation and write their tokens to a file."

    def add_arguments(self, parser):
        parser.add_argument("count", type=int)
        parser.add_argument("--prefix", required=True, help="username prefix (letters, digits, _)")
        parser.add_argument("--out", required=True, help="JSON file to write")
        parser.add_argument("--celebrities", type=int, default=0,
                            help="the first K accounts are celebrities; with --prefollow every other "
                                 "account follows 1-3 of them (Zipf), created in bulk")
        parser.add_argument("--prefollow", action="store_true")
        parser.add_argument("--warm", action="store_true",
                            help="write every new account's poll answers into memcached (as a running "
                                 "site's cache holds them), so first polls are hits")
        parser.add_argument("--zipf", type=float, default=1.2,
                            help="exponent of the celebrities' popularity (default 1.2; smaller is flatter)")

    def handle(self, count, prefix, out, celebrities=0, prefollow=False, zipf=1.2, warm=False, **options):
        if not 1 <= count <= 200_000:
            raise CommandError("count must be 1..200000")
        if not prefix.replace("_", "").isalnum() or len(prefix) > 100:
            raise CommandError("--prefix must be letters, digits or _ (at most 100)")
        try:
            # opened before anything is created: a bad path must not leave accounts behind
            fh = open(out, "w")
        except OSError as exc:
            raise CommandError(f"cannot write --out {out}: {exc.strerror}") from None
        with fh:
            self._load(fh, count, prefix, celebrities, prefollow, zipf, warm)
        self.stdout.write(f"{count} accounts written to {out}")

    def _load(self, fh, count, prefix, celebrities, prefollow, zipf, warm):
        User = get_user_model()
        names = [f"{prefix}{i}" for i in range(count)]
        if User.objects.filter(username__in=names[:1000]).exists():
            raise CommandError(f"users named {prefix}N exist already; choose another --prefix")
        with transaction.atomic():
            users = [User(username=n) for n in names]
            for u in users:
                u.set_unusable_password()
            User.objects.bulk_create(users, batch_size=1000)
            ids = dict(User.objects.filter(username__in=names).values_list("username", "id"))
            ReadCursor.objects.bulk_create([ReadCursor(user_id=ids[n]) for n in names], batch_size=1000,
                                           ignore_conflicts=True)
            UserState.objects.bulk_create([UserState(user_id=ids[n]) for n in names], batch_size=1000,
                                          ignore_conflicts=True)
        accounts = [{"username": n, "token": sign(ids[n], 0), "follows": []} for n in names]
        if prefollow and 0 < celebrities < count:
            import random

            from plurkcore.models import Follow

            rng = random.Random(count)
            weights = [1 / (i + 1) ** zipf for i in range(celebrities)]
            edges = []
            for account in accounts[celebrities:]:
                picks = {rng.choices(range(celebrities), weights)[0] for _ in range(rng.randint(1, 3))}
                for i in picks:
                    account["follows"].append(names[i])
                    edges.append(Follow(follower_id=ids[account["username"]], followee_id=ids[names[i]]))
            # bulk: no per-row signals (--warm writes the answers afterwards)
            Follow.objects.bulk_create(edges, batch_size=2000)
        if warm:
            # the same write protocol as after a commit (gets, read the database, cas/add)
            from fastpoll import publish
            from plurkcore import answers

            failed = publish.write_answers({name: set(ids.values()) for name in fastpoll_resources.names(per="user")})
            if failed:
                raise CommandError(f"{len(failed)} answers could not be written to memcached")
        json.dump(accounts, fh)
