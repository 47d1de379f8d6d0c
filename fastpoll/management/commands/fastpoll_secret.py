"""``manage.py fastpoll_secret``: create ``FASTPOLL["SECRET_FILE"]`` with a fresh random secret.

The file is the HMAC key Django signs poll tokens with and fastpath checks them with
(docs/contract.md, section 1): 64 hex digits, mode 0600.  An existing file is kept unless
``--force``, as replacing it ends every token signed with the old one, and fastpath and every
Django process read the file once at start: each must restart (the command says so; until then
a fastpath still holding the old secret answers the new tokens 401, ``check --deploy``'s
fastpoll.W011).
"""
import os

from django.core.management.base import BaseCommand, CommandError

from fastpoll import conf
from fastpoll.secret import write_secret


class Command(BaseCommand):
    help = ("Create FASTPOLL['SECRET_FILE'] with a fresh random secret (mode 0600), the key shared "
            "with fastpath; --force replaces an existing one.")
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true",
                            help="replace an existing file (every issued poll token stops working)")

    def handle(self, *args, force=False, **options):
        path = conf.get_config()["SECRET_FILE"]
        if not path or not isinstance(path, str):
            raise CommandError("FASTPOLL['SECRET_FILE'] is not set: set it to the path of the secret "
                               "file (for example /etc/myproject/fastpoll.key), then run this again")
        replaced = force and os.path.lexists(path)
        try:
            write_secret(path, force=force)
        except FileExistsError:
            raise CommandError(f"{path} exists: keeping it (--force replaces it, and every poll "
                               f"token signed with it stops working)") from None
        except OSError as exc:
            raise CommandError(f"cannot write {path}: {exc.strerror}") from None
        if replaced:
            # fastpath reads the file at start, each Django process once: both keep the old secret
            self.stdout.write(f"replaced the secret in {os.path.abspath(path)} (mode 0600): restart fastpath and "
                              f"every Django process now (each read the old secret once at start; until they "
                              f"restart, polls answer 401 bad signature); every poll token issued before stops working")
            return
        self.stdout.write(f"wrote a new secret to {os.path.abspath(path)} (mode 0600): give fastpath the "
                          f"same file (--secret-file)")
