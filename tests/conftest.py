"""Fixtures shared by every test package: real memcached servers on free loopback ports."""
import pytest

from tests.support.servers import memcached_servers


@pytest.fixture
def memcached():
    """One real memcached server (a ``tests.support.servers.Memcached``)."""
    with memcached_servers(1) as servers:
        yield servers[0]


@pytest.fixture
def memcached3():
    """Three real memcached servers."""
    with memcached_servers(3) as servers:
        yield servers
