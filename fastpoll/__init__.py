"""fastpoll: exact poll answers in memcached, written after commit, served by fastpath in C.

The public API is this module's ``__all__`` (docs/integrate.md).  Importing the package does not
import the ORM: the names that need Django's apps are loaded on first use.
"""
from ._version import __version__

__all__ = ["__version__"]
