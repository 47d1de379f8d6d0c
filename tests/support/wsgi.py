"""Raw request bytes through the real WSGI path, without a socket: gunicorn's own parser and
environ (as the stack runs it: default header handling), then Django's WSGIHandler.  This is what
a gunicorn worker makes of the bytes nginx forwards, so it is the reference for what Django
reads (tests/vectors/contract.json, "credentials")."""
from gunicorn.config import Config
from gunicorn.http import wsgi
from gunicorn.http.parser import RequestParser

PEER, SERVER = ("127.0.0.1", 40000), ("127.0.0.1", 8000)


def request_bytes(headers, path="/Poll/getUnreadCount", host="127.0.0.1"):
    """GET ``path`` with (name, latin-1 value) ``headers``, as bytes on the wire."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", *(f"{n}: {v}" for n, v in headers), "", ""]
    return "\r\n".join(lines).encode("latin-1")


def environ(raw):
    """gunicorn's WSGI environ for one raw request."""
    cfg = Config()
    req = next(RequestParser(cfg, [raw], PEER))
    _, env = wsgi.create(req, None, PEER, SERVER, cfg)
    return env


def django_request(raw):
    from django.core.handlers.wsgi import WSGIRequest

    return WSGIRequest(environ(raw))


_handler = None


def django_response(raw):
    """(status, headers, body) of Django's whole stack (middleware, URLconf, view) for ``raw``."""
    global _handler
    from django.core.handlers.wsgi import WSGIHandler

    if _handler is None:
        _handler = WSGIHandler()
    seen = {}

    def start_response(status, headers, exc_info=None):
        seen["status"], seen["headers"] = int(status.split()[0]), dict(headers)

    # The handler's request_started/finished receivers close stale database connections, which
    # opens one when an earlier test left it set up: a test without database access would then
    # fail or pass by the order it ran in.  A view that needs the database still needs the mark.
    from django.core import signals
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        result = _handler(environ(raw), start_response)
        try:
            body = b"".join(result)
        finally:
            result.close()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
    return seen["status"], seen["headers"], body
