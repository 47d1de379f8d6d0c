import gc
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "plurksite.settings")
application = get_wsgi_application()

# Everything loaded so far (Django, the apps, the URLconf and its views) lives as long as the
# worker: out of the collector's reach, a full collection no longer walks it.  One that landed in
# an after-commit write of 1,000 followers made it take 80 ms instead of 35 (bench/fanout.py's
# writer, SQLite); Instagram's reason for gc.freeze() in its Django workers.
get_resolver().url_patterns
gc.freeze()
