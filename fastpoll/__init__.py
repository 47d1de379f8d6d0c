"""fastpoll: each user's exact poll answer in memcached, written after commit, served by fastpath.

The public API is ``__all__`` below, documented in docs/integrate.md; nothing else of this
package is for projects to import (``fastpoll.urls`` and ``fastpoll.middleware.PollTokenMiddleware``
are named in settings and URLconfs).  Importing the package does not import the ORM: every name
is loaded from its module on first use.
"""
from ._version import __version__

#: public name -> (module, attribute)
_EXPORTS = {
    "resource": ("resources", "resource"),
    "audience": ("audiences", "audience"),
    "touch": ("changes", "touch"),
    "memo": ("resources", "memo"),
    "issue_token": ("auth", "issue_token"),
    "revoke": ("auth", "revoke"),
    "authenticate": ("auth", "authenticate"),
    "AuthError": ("auth", "AuthError"),
    "grant": ("capability", "grant"),
    "capability_url": ("capability", "url"),
    "dumps": ("http", "dumps"),
    "error_response": ("http", "error_response"),
    "id_filter": ("db", "id_filter"),
    "active_clause": ("db", "active_clause"),
    "edge_url": ("edge", "edge_url"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name):
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'fastpoll' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
