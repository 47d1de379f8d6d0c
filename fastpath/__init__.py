"""fastpath: answers Plurk-style polls straight from memcached (C over libevent).

Public API::

    import fastpath
    fastpath.serve(listen="127.0.0.1:8001", memcached=["127.0.0.1:11211"],
                   secret_file="var/secret.key", workers=2)

``python -m fastpath --help`` is the command-line interface.  fastpath never imports Django:
its contract with plurkcore is docs/contract.md.
"""
from .errors import ConfigurationError, FastpathError
from ._lifecycle import DEFAULT_RESOURCES, Options, serve

__all__ = ["serve", "Options", "DEFAULT_RESOURCES", "FastpathError", "ConfigurationError"]
__version__ = "0.1.0"
