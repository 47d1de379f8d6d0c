"""Fixtures for plurkcore's tests.

By default memcached is a closed port (connection refused at once), so tests that do not care
about the cache never wait; ``cache1``/``cache3`` point plurkcore at one / three real servers.

PostgreSQL: ``PLURK_TEST_POSTGRES=1 .venv/bin/python -m pytest tests/plurkcore`` starts a
throwaway cluster (tests/support/postgres.py) before the test database is created and points
Django's default database at it; it is stopped when pytest exits.
"""
import os
import uuid

import pytest
from django.test import Client, override_settings

from plurksite.services import free_port

_cluster = None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    global _cluster
    if os.environ.get("PLURK_TEST_POSTGRES") not in ("1", "true", "yes"):
        return
    from tests.support.postgres import PostgresCluster, use_database_url

    _cluster = PostgresCluster().start()
    os.environ["PLURK_DATABASE_URL"] = _cluster.create_database("plurk")
    use_database_url(_cluster.url("plurk"))


def pytest_unconfigure(config):
    global _cluster
    if _cluster is not None:
        _cluster.stop()
        _cluster = None


def pytest_report_header(config):
    if _cluster is not None:
        return f"plurkcore: PostgreSQL {_cluster.version} on port {_cluster.port} (throwaway cluster)"
    return None


@pytest.fixture(autouse=True)
def _isolated_plurkcore(settings):
    """Each test starts with a dead-but-fast cache, fresh counters and no hooks."""
    from fastpoll import _testhooks, cache

    settings.FASTPOLL = dict(settings.FASTPOLL, MEMCACHED_SERVERS=[f"127.0.0.1:{free_port()}"])
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    _testhooks.clear()
    yield
    _testhooks.clear()
    cache.close()


def _use(settings, servers):
    settings.FASTPOLL = dict(settings.FASTPOLL, MEMCACHED_SERVERS=[s.spec for s in servers])


@pytest.fixture
def cache1(settings, memcached):
    _use(settings, [memcached])
    return memcached


@pytest.fixture
def cache3(settings, memcached3):
    _use(settings, memcached3)
    return memcached3


class ApiClient(Client):
    """A Django test client speaking JSON with a Bearer token."""

    token = None

    def call(self, method, path, data=None, token=None, **extra):
        token = token or self.token
        if token:
            extra.setdefault("HTTP_AUTHORIZATION", f"Bearer {token}")
        kwargs = {}
        if data is not None:
            kwargs = {"data": data if isinstance(data, (bytes, str)) else __import__("json").dumps(data),
                      "content_type": "application/json"}
        return getattr(self, method.lower())(path, **kwargs, **extra)


@pytest.fixture
def client_factory():
    def make(**kwargs):
        return ApiClient(**kwargs)
    return make


@pytest.fixture
def api(client_factory):
    return client_factory()


@pytest.fixture
def signup(client_factory):
    """signup(name=None) -> (client with token, user dict)."""
    def make(name=None, password="secret-pass-1"):
        client = client_factory()
        name = name or f"u{uuid.uuid4().hex[:10]}"
        resp = client.call("POST", "/api/signup", {"username": name, "password": password})
        assert resp.status_code == 201, resp.content
        client.token = resp.json()["token"]
        client.user = resp.json()["user"]
        client.cookies.clear()
        return client
    return make


@pytest.fixture
def hooks():
    from fastpoll import _testhooks

    yield _testhooks.set_hook


override_settings = override_settings
