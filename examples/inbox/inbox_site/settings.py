"""Settings of the inbox example: SQLite and the shared secret in INBOX_VAR (default ./var)."""
import os
import secrets
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("INBOX_VAR", BASE_DIR / "var"))
VAR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("INBOX_DJANGO_SECRET", "inbox-example-not-for-production")
DEBUG = os.environ.get("INBOX_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "fastpoll",
    "inbox",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "fastpoll.middleware.PollTokenMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "inbox_site.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": VAR / "inbox.sqlite3"}}
AUTH_USER_MODEL = "inbox.User"
LOGIN_REDIRECT_URL = LOGOUT_REDIRECT_URL = "/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR / "static"      # collectstatic: what the site's web server serves at STATIC_URL

# fastpoll: memcached and the secret shared with fastpath (created here on first run)
SECRET_FILE = Path(os.environ.get("INBOX_SECRET_FILE", VAR / "poll-secret.key"))
if not SECRET_FILE.exists():
    SECRET_FILE.parent.mkdir(parents=True, exist_ok=True)
    SECRET_FILE.write_text(secrets.token_hex(32) + "\n")
    SECRET_FILE.chmod(0o600)
FASTPOLL = {
    "MEMCACHED_SERVERS": os.environ.get("INBOX_MEMCACHED", "127.0.0.1:11211").split(","),
    "SECRET_FILE": str(SECRET_FILE),
    "KEY_PREFIX": "inbox",     # this site's keys: another site on the same memcached has its own
    # fastpath and nginx, rendered by `manage.py fastpoll_fastpath` and `manage.py fastpoll_nginx`
    "NOTIFY_DIRS": [os.environ.get("INBOX_NOTIFY_DIR", str(VAR / "notify"))],   # commits wake held polls
    "FASTPATH_ADDRESS": os.environ.get("INBOX_FASTPATH", "127.0.0.1:8001"),
    "FASTPATH_ADMIN": os.environ.get("INBOX_FASTPATH_ADMIN") or None,            # /metrics, loopback
    "FASTPATH_WORKERS": int(os.environ.get("INBOX_FASTPATH_WORKERS", "1")),
    "LONGPOLL_MAX_WAIT": int(os.environ.get("INBOX_LONGPOLL_MAX_WAIT", "55")),
    "DJANGO_UPSTREAM": os.environ.get("INBOX_DJANGO", "127.0.0.1:8000"),         # gunicorn, for misses
    # the edge (optional): fastpath's second listener, which pages stream from without nginx, and
    # the origins of the pages allowed to (the site as browsers reach it: "http://127.0.0.1:8080")
    "EDGE_ADDRESS": os.environ.get("INBOX_EDGE") or None,
    "EDGE_ORIGINS": [o for o in os.environ.get("INBOX_EDGE_ORIGINS", "").split(",") if o],
    "EDGE_URL": os.environ.get("INBOX_EDGE_URL") or None,       # None: derived for a loopback edge
}
