"""fastpoll.W010: the running fastpath does not serve a resource of the registry.

A resource missing from fastpath's ``--resources`` (per-user) or ``--object-resources``
(per-object) is no error anywhere: fastpath answers its polls 404 and nginx hands every one of
them to Django.  fastpath's stats listener (``--admin``, ``GET /metrics``) does not report the
lists, so the check asks the poll listener (``FASTPATH_ADDRESS``) the way nginx does, once per
registered resource, without a token: ``<PATH_PREFIX><name>`` for a per-user one,
``<PATH_PREFIX><name>/<PROBE_OBJECT>`` for a per-object one.  fastpath reads the path before
the credentials (fastpath/src/fp_route.c): it answers 401 for a resource it serves (no token)
and ``404`` with ``X-Cache: MISS`` for one it does not (docs/contract.md, sections 6 and 8).  Anything else (nothing listening, another server, a timeout)
says nothing and warns of nothing: the check is about a fastpath that runs.

``register_checks()`` is what ``FastpollConfig.ready()`` calls.
"""
import socket

from django.conf import settings
from django.core import checks

from . import conf, resources

TAG = "fastpoll"
PROBE_TIMEOUT_S = 0.5
#: the object id of a per-object probe: any id fastpath can read (1-64 of A-Z a-z 0-9 - _); a
#: probe carries no token, so fastpath never reads the object's key
PROBE_OBJECT = "0"
_MAX_HEAD = 16384


def _connect(address, timeout):
    """A socket connected to ``FASTPATH_ADDRESS`` (``unix:/path``, ``host:port``, ``[v6]:port``)."""
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(address[5:])
        except BaseException:
            sock.close()
            raise
        return sock
    host, _, port = address.rpartition(":")
    return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)


def probe(address, path, timeout=PROBE_TIMEOUT_S):
    """True: fastpath at ``address`` serves ``path`` (401 without a token); False: it does not
    (404 with ``X-Cache: MISS``); None: no answer from a fastpath (refused, timed out, other)."""
    try:
        with _connect(address, timeout) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: fastpoll-check\r\nConnection: close\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head and len(head) < _MAX_HEAD:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                head += chunk
    except (OSError, ValueError):
        return None
    lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    status = lines[0].split(" ")
    if len(status) < 2 or not status[0].startswith("HTTP/1."):
        return None
    headers = {name.strip().lower(): value.strip() for name, sep, value in (line.partition(":") for line in lines[1:])
               if sep}
    if status[1] == "401":
        return True
    if status[1] == "404" and headers.get("x-cache") == "MISS":
        return False
    return None


def unserved(config, names, object_names=(), timeout=PROBE_TIMEOUT_S):
    """The names of ``names`` (per-user) and ``object_names`` (per-object), in that order, that
    the fastpath at ``config['FASTPATH_ADDRESS']`` answers as unknown; [] when no fastpath
    answers there."""
    address, prefix = config["FASTPATH_ADDRESS"], config["PATH_PREFIX"]
    if not isinstance(address, str) or not isinstance(prefix, str):
        return []                      # fastpoll.E0xx say what is wrong with them
    missing = []
    paths = [(name, prefix + name) for name in names] + [(name, f"{prefix}{name}/{PROBE_OBJECT}")
                                                          for name in object_names]
    for name, path in paths:
        answer = probe(address, path, timeout)
        if answer is None:
            return []
        if answer is False:
            missing.append(name)
    return missing


def check_running_fastpath(app_configs=None, **kwargs):
    if not isinstance(getattr(settings, "FASTPOLL", {}), dict):
        return []                      # fastpoll.E001
    config = conf.get_config()
    missing = unserved(config, sorted(resources.names(per="user")), sorted(resources.names(per="object")))
    if not missing:
        return []
    return [checks.Warning(
        f"fastpath at {config['FASTPATH_ADDRESS']} does not serve the poll resource(s) "
        f"{', '.join(missing)}: nginx sends every poll of them to Django.",
        hint="Restart fastpath with the command line `manage.py fastpoll_fastpath` prints "
             "(its --resources and --object-resources, and its path prefix must be PATH_PREFIX).",
        id="fastpoll.W010")]


def register_checks():
    """Register W010 (``FastpollConfig.ready()`` calls this once).  A deployment check
    (``manage.py check --deploy``): it asks the running fastpath over the network."""
    checks.register(check_running_fastpath, TAG, deploy=True)
