#!/usr/bin/env python
"""Django's command-line utility for the plurk stack (runstack, migrate, checkcache, ...)."""
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "plurksite.settings")
    if os.environ["DJANGO_SETTINGS_MODULE"] == "plurksite.settings":
        from plurkcore.secret import SecretFileError, ensure_secret
        from plurksite.config import ConfigError, load

        try:
            config = load()
        except ConfigError as exc:
            sys.exit(f"error: {exc}")
        # what the settings module will read or create: say what is wrong in one line
        try:
            ensure_secret(config.secret_file)
        except SecretFileError as exc:
            sys.exit(f"error: PLURK_SECRET_FILE: {exc}")
        except OSError as exc:
            sys.exit(f"error: PLURK_SECRET_FILE={config.secret_file}: {exc.strerror}")
        if config.sqlite_path:
            try:
                os.makedirs(os.path.dirname(config.sqlite_path), exist_ok=True)
            except OSError as exc:
                sys.exit(f"error: PLURK_DATABASE_URL={config.database_url}: cannot create the directory "
                         f"{os.path.dirname(config.sqlite_path)}: {exc.strerror}")
    try:
        from django.core.management import execute_from_command_line
    except ImportError as exc:
        raise SystemExit("Django is not installed here: run `make run` (it creates .venv), "
                         "then use .venv/bin/python manage.py") from exc
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
