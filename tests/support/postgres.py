"""A throwaway PostgreSQL cluster on a free loopback port, for tests and benchmarks.

The cluster itself is plurksite.cluster.postgres (the namespace cluster's db host runs the same
code): initdb and the server run as the ``postgres`` user when we are root, in a temporary
directory; ``trust`` on 127.0.0.1; fsync and synchronous_commit off.

    with PostgresCluster() as pg:
        url = pg.url("plurk")      # postgres://postgres@127.0.0.1:<port>/plurk

``use_database_url(url)`` points an already configured Django project at it (before any
connection is opened), which is what ``PLURK_TEST_POSTGRES=1`` in tests/plurkcore does.
"""
from plurksite.cluster.postgres import PostgresCluster, find_bindir  # noqa: F401  (shared with the cluster's db host)


def use_database_url(url):
    """Point the configured Django project's default database at ``url`` (no connection may be
    open yet).  Used when settings were loaded before the cluster existed (pytest-django)."""
    from urllib.parse import unquote, urlsplit

    from django.conf import settings
    from django.db import connections

    parts = urlsplit(url)
    settings.DATABASES["default"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "CONN_MAX_AGE": 0,
        "TEST": {},
    }
    connections.__dict__.pop("settings", None)
    from asgiref.local import Local

    connections._connections = Local(connections.thread_critical)
