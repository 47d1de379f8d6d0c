#!/usr/bin/env python
"""Django's command-line utility for the plurk stack (runstack, migrate, checkcache, ...)."""
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "plurksite.settings")
    try:
        from django.core.management import execute_from_command_line
    except ImportError as exc:
        raise SystemExit("Django is not installed here: run `make run` (it creates .venv), "
                         "then use .venv/bin/python manage.py") from exc
    if os.environ["DJANGO_SETTINGS_MODULE"] == "plurksite.settings":
        from plurksite.config import ConfigError

        try:
            # reads PLURK_*, reads (or creates) the secret file, makes the SQLite directory
            import plurksite.settings  # noqa: F401
        except ConfigError as exc:
            sys.exit(f"error: {exc}")
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
