"""fastpoll's tests use plurkcore's fixtures (a dead-but-fast cache by default, real memcached
on request, API clients): the Plurk store is fastpoll's first user, and its models make changes."""
from tests.plurkcore.conftest import _isolated_plurkcore, api, cache1, cache3, client_factory, hooks, signup  # noqa: F401
