"""Fixtures shared by every test package: real servers on free loopback ports.

- ``memcached`` / ``memcached3``: one / three real memcached processes.
- ``stack``: the whole stack (memcached, gunicorn, fastpath, nginx) for the session; tests must
  leave it running.  ``private_stack``: a stack of a test's own, for fault injection.
Both stack fixtures yield a ``tests.support.stack.TestStack`` (``.base_url``, ``.signup()``,
``.api()``, ``.poll()``, ``.service(name).kill()``).
"""
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


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    from tests.support.stack import TestStack, stack_config

    config = stack_config(tmp_path_factory.mktemp("stack"))
    with TestStack(config, nginx_workers=1) as running:
        yield running


@pytest.fixture
def private_stack(tmp_path):
    from tests.support.stack import TestStack, stack_config

    config = stack_config(tmp_path / "var")
    with TestStack(config, nginx_workers=1) as running:
        yield running


@pytest.fixture(scope="session")
def stack3(tmp_path_factory):
    """A whole stack over three memcached servers (keys spread by rendezvous hashing)."""
    from tests.support.stack import TestStack, stack_config

    config = stack_config(tmp_path_factory.mktemp("stack3"), memcached_count=3)
    with TestStack(config, nginx_workers=1) as running:
        yield running
