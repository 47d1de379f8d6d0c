"""Django settings for the stack, all derived from plurksite.config (the PLURK_* environment)."""
import hashlib
import os
from urllib.parse import unquote, urlsplit

from fastpoll.secret import SecretFileError, ensure_secret

from .config import ROOT, ConfigError, load
from .services import fastpoll_settings

STACK = load()


def _secret(path):
    """The shared secret (created when absent); what stands in the way is a ConfigError, one line."""
    try:
        return ensure_secret(path)
    except SecretFileError as exc:
        raise ConfigError(f"PLURK_SECRET_FILE: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"PLURK_SECRET_FILE={path}: {exc.strerror}") from None

BASE_DIR = ROOT

# Django's own signing key is derived from the shared secret, never equal to it.
SECRET_KEY = hashlib.sha256(b"plurksite-django:" + _secret(STACK.secret_file)).hexdigest()
DEBUG = STACK.debug
# behind a balancer, requests carry the balancer's Host (PLURK_PUBLIC_HOSTS), not this host's;
# nginx closes a request for any other Host (444) before it gets here (server_name, the same list)
ALLOWED_HOSTS = ["*"] if DEBUG else sorted({"testserver", *STACK.site_hosts})
USE_X_FORWARDED_HOST = False
# The scheme the client used: nginx always sets X-Forwarded-Proto (its own $scheme, or a trusted
# balancer's https: PLURK_TRUSTED_PROXIES), so a client's own header never reaches Django.  Over
# HTTPS, the poll token cookie is Secure (fastpoll.auth asks request.is_secure()).
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# PLURK_HTTPS: the site is served over HTTPS only; Django's own cookies never go over plain HTTP
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = STACK.https
# PLURK_HSTS_SECONDS: SecurityMiddleware sends Strict-Transport-Security on HTTPS answers
SECURE_HSTS_SECONDS = STACK.hsts_seconds

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "fastpoll",
    "plurkcore",
    "plurkweb",
    "plurksite",
]

MIDDLEWARE = [
    "plurksite.middleware.head_without_body",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "plurksite.urls"
WSGI_APPLICATION = "plurksite.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


#: seconds a database connection is kept across requests, on both backends: for SQLite, opening
#: the file and running its PRAGMAs for every request was an eighth of gunicorn's time under
#: `make load`
_CONN_MAX_AGE_S = 60


def _database(url):
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": STACK.sqlite_path,
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE",
                        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"},
            "CONN_MAX_AGE": _CONN_MAX_AGE_S,
        }
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "CONN_MAX_AGE": _CONN_MAX_AGE_S,
        # a kept connection is checked (SELECT 1) at its first use in a request: after a
        # PostgreSQL restart the first request of every worker would fail otherwise
        "CONN_HEALTH_CHECKS": True,
        # no JIT: every query here is short, and a cost estimate inflated by statistics not yet
        # gathered (right after a bulk load) made PostgreSQL spend ~35 ms compiling a 4 ms query
        "OPTIONS": {"options": "-c jit=off"},
    }


DATABASES = {"default": _database(STACK.database_url)}
if STACK.sqlite_path:
    try:
        os.makedirs(os.path.dirname(STACK.sqlite_path), exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"PLURK_DATABASE_URL={STACK.database_url}: cannot create the directory "
                          f"{os.path.dirname(STACK.sqlite_path)}: {exc.strerror}") from None
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 8}},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = os.path.join(STACK.var_dir, "static")

# fastpoll's one settings dict: everything the app needs from the stack configuration.
# the runner starts fastpath and renders nginx from the same dict (plurksite.services), so that
# manage.py fastpoll_fastpath / fastpoll_nginx print what the stack runs
FASTPOLL = fastpoll_settings(STACK)
# the site's pages poll with the token its API's login hands out (plurkcore.api, fastpoll.issue_token);
# Django's sessions are the admin's only: no PollTokenMiddleware, and its warning acknowledged
SILENCED_SYSTEM_CHECKS = ["fastpoll.W007"]
# Django's own cap on form bodies, the same limit (nginx enforces it first)
DATA_UPLOAD_MAX_MEMORY_SIZE = STACK.max_body_bytes

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "fastpoll": {"level": "INFO"},
        "plurkcore": {"level": "INFO"},
        "plurksite": {"level": "INFO"},
    },
}
