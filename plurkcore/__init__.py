"""plurkcore: users, follows, plurks and the poll answers that fastpath serves from memcached.

Keep this module light: importing the package must not import the ORM (see apps.py for wiring).
"""
from fastpoll import __version__

APP_NAME = "plurkcore"

__all__ = ["APP_NAME", "__version__"]
