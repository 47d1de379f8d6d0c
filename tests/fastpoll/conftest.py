"""fastpoll's tests use plurkcore's fixtures (a dead-but-fast cache by default, real memcached
on request, API clients): the Plurk store is fastpoll's first user, and its models make changes."""
import contextlib
import os
import subprocess
import sys

import pytest

from tests.plurkcore.conftest import _isolated_plurkcore, api, cache1, cache3, client_factory, hooks, signup  # noqa: F401

#: a second database (SQLite in memory), created only for the tests that name it
#: (``pytest.mark.django_db(databases=["default", OTHER])``: tests/fastpoll/test_multidb.py)
OTHER = "other"


def pytest_configure(config):
    from django.conf import settings
    from django.db import connections

    if OTHER in settings.DATABASES:
        return
    settings.DATABASES[OTHER] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    if "settings" in connections.__dict__:          # the connection handler read DATABASES already
        both = {"default": dict(connections.settings["default"]), OTHER: dict(settings.DATABASES[OTHER])}
        connections.settings[OTHER] = connections.configure_settings(both)[OTHER]


@contextlib.contextmanager
def subscriptions(topic_field, alias="default"):
    """A throwaway table of (topic, reader) on ``alias`` and the audience ``test_topic_readers``
    over it (no foreign keys: a table of its own): (the model, the audience)."""
    from django.db import connections, models
    from django.test.utils import isolate_apps

    import fastpoll
    from fastpoll import audiences

    with isolate_apps("fastpoll"):
        class Subscription(models.Model):
            topic = topic_field
            reader = models.BigIntegerField()

            class Meta:
                app_label = "fastpoll"
                db_table = "fastpoll_test_subscription"

    with connections[alias].schema_editor() as editor:
        editor.create_model(Subscription)
    try:
        yield Subscription, fastpoll.audience("test_topic_readers", Subscription, by="topic", member="reader")
    finally:
        audiences._registry.pop("test_topic_readers", None)
        with connections[alias].schema_editor() as editor:
            editor.delete_model(Subscription)


@pytest.fixture
def manage_py(tmp_path, memcached):
    """The demo site's ``manage.py`` in a process of its own, on this test's SQLite file and
    memcached, migrated: ``manage_py("shell", "-c", code)`` -> CompletedProcess (text)."""
    from plurksite.config import ROOT

    env = dict(os.environ, DJANGO_SETTINGS_MODULE="plurksite.settings", PLURK_VAR_DIR=str(tmp_path),
               PLURK_DATABASE_URL=f"sqlite:///{tmp_path}/plurk.sqlite3", PLURK_MEMCACHED=memcached.spec,
               PLURK_SECRET_FILE=str(tmp_path / "secret.key"), PLURK_MEMCACHED_TIMEOUT_MS="1000")

    def manage(*argv):
        return subprocess.run([sys.executable, os.path.join(ROOT, "manage.py"), *argv], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)

    migrated = manage("migrate", "-v0")
    assert migrated.returncode == 0, migrated.stderr
    return manage
