"""``manage.py seeddemo``: the demo's users and plurks.  The demo's, not the library's: it creates
users with a published password, so it lives in plurksite, which no distribution installs."""
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, transaction

from plurkcore.models import Follow, Plurk, ReadCursor

USERS = ["alice", "bob", "carol", "dave"]
PASSWORD = "plurkdemo1"
PLURKS = [
    ("alice", "Hello from alice! Trying out fast polling.", [("bob", "Welcome, alice!"), ("carol", "Hi!")]),
    ("bob", "Coffee first, then code.", [("alice", "Same here.")]),
    ("carol", "Who else is polling every two seconds?", [("dave", "Guilty.")]),
    ("dave", "memcached keeps the answers warm.", []),
]


class Command(BaseCommand):
    help = ("Create the demo users alice, bob, carol and dave (password plurkdemo1), who follow each "
            "other, with a few plurks and responses.  Idempotent.")

    def handle(self, *args, **options):
        try:
            self._seed()
        except DatabaseError as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CommandError(f"the database cannot be used ({reason}): is it running, reachable as "
                               f"settings.DATABASES says, and migrated (manage.py migrate)?") from None

    def _seed(self):
        User = get_user_model()
        with transaction.atomic():
            users = {}
            for name in USERS:
                user = User.objects.filter(username=name).first()
                if user is None:
                    user = User.objects.create_user(username=name, password=PASSWORD)
                users[name] = user
                ReadCursor.objects.get_or_create(user=user)
            for a in USERS:
                for b in USERS:
                    if a != b and not Follow.objects.filter(follower=users[a], followee=users[b]).exists():
                        Follow.objects.create(follower=users[a], followee=users[b])
            for author, content, replies in PLURKS:
                plurk = Plurk.objects.filter(author=users[author], content=content).first()
                if plurk is None:
                    plurk = Plurk.objects.create(author=users[author], content=content)
                for replier, text in replies:
                    if not Plurk.entries.filter(parent=plurk, author=users[replier], content=text).exists():
                        Plurk.entries.create(parent=plurk, author=users[replier], content=text)
        self.stdout.write("Demo logins (password %s): %s" % (PASSWORD, ", ".join(USERS)))
