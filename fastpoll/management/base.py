"""What plurkcore's management commands share."""
import argparse
import math

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError


class StoreCommand(BaseCommand):
    """A command that reads the database: a dead, unreachable or unmigrated one is a one-line
    CommandError (exit status 1), not a traceback."""

    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except DatabaseError as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CommandError(f"the database cannot be used ({reason}): is it running, reachable as "
                               f"settings.DATABASES says, and migrated (manage.py migrate)?") from None


def positive_seconds(text):
    """argparse type: a finite number of seconds above 0 (nan, inf, 0 and negatives are usage errors)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value
