"""fastpath: answers Plurk-style polls straight from memcached (C over libevent).

Public API::

    import fastpath
    fastpath.serve(listen="127.0.0.1:8001", memcached=["127.0.0.1:11211"],
                   secret_file="var/secret.key", workers=2)

``python -m fastpath --help`` is the command-line interface; every option is one row of
``fastpath.options.OPTIONS``.  fastpath never imports Django: its contract with plurkcore is
docs/contract.md.
"""
from .errors import ConfigurationError, FastpathError
from .options import Options

__all__ = ["serve", "Options", "FastpathError", "ConfigurationError"]
__version__ = "0.1.0"


def __getattr__(name):
    # serve() lives in the compiled extension, loaded on first use: the runner imports
    # fastpath.options to build the command line before it checks that the extension is built
    if name == "serve":
        from ._lifecycle import serve
        return serve
    raise AttributeError(f"module 'fastpath' has no attribute {name!r}")
