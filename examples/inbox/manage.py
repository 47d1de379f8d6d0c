#!/usr/bin/env python
"""The inbox example's manage.py (Django's own, plus the repository root on the path)."""
import os
import sys

if __name__ == "__main__":
    # in a real project fastpoll is pip-installed; here it is the repository's own package
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inbox_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
