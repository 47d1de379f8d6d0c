"""WSGI entry point: ``gunicorn inbox_site.wsgi`` (from examples/inbox, fastpoll importable)."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inbox_site.settings")
application = get_wsgi_application()
