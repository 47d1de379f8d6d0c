"""The URL pages poll the edge by (``fastpoll.edge_url``; docs/integrate.md "The edge").

The edge is fastpath's second listener (``FASTPOLL["EDGE_ADDRESS"]``, fastpath ``--edge``),
which browsers poll without nginx; a miss there sends them to the site once (docs/contract.md,
section 10).  A page learns where it is from this one function, through its template.
"""
import logging
from urllib.parse import urlsplit

from fastpath.errors import ConfigurationError
from fastpath.options import is_loopback, origin, parse_address

from . import conf

logger = logging.getLogger("fastpoll.edge")

#: warned of already in this process (a page not served the edge: _warn_once)
_warned = set()


def _request_host(request):
    try:
        return urlsplit("//" + request.get_host()).hostname
    except Exception:           # DisallowedHost, a bad port: no page is served to it anyway
        return None


def _page_origin(request):
    """The Origin the page's browser sends, as EDGE_ORIGINS holds it (fastpath.options.origin:
    lower case, no default port: a Host of "www.example.com:443" on https is that origin)."""
    try:
        parts = urlsplit("//" + request.get_host())
        return origin(request.scheme, parts.hostname, parts.port)
    except Exception:           # DisallowedHost, a bad port: no page is served to it anyway
        return None


def _warn_once(what, message, *args):
    """One warning per process and kind: a page that is not given the edge is served, slower,
    by the site, which nothing else would show."""
    if what not in _warned:
        _warned.add(what)
        logger.warning(message, *args)


def loopback_edge_host(edge_host, page_host):
    """The host by which a page on ``page_host`` reaches a loopback edge on ``edge_host``, or None
    when it is not given that edge: the page's cookie is its host's, so only a page on the edge's
    own host, or on ``localhost`` (which names both loopbacks: then by that name), sends it there.
    The checks (fastpoll.W006) ask it too."""
    if page_host == "localhost":
        return page_host
    return edge_host if page_host == edge_host.lower() else None


def edge_url(request=None):
    """The origin of the edge as a page's script must call it, without a trailing slash (a poll
    is ``edge_url() + PATH_PREFIX + resource``), or ``""`` when the page should poll the site.

    Only to a ``request`` whose page origin is one of ``EDGE_ORIGINS`` (the edge would refuse any
    other page's requests by CORS).  ``FASTPOLL["EDGE_URL"]`` when it is set.  Otherwise, for a
    loopback ``EDGE_ADDRESS``, ``http://<EDGE_ADDRESS>``: only to a ``request`` made to that very
    host, or to ``localhost`` (then by that name): a browser on another machine cannot reach this
    one's loopback, and a page on another host has no cookie for the edge's.  With no
    ``request``: that URL as such.

    A page that is not given the edge for its origin or host is logged once per process
    (logger ``fastpoll.edge``), with the likely cause: TLS ended at a proxy without
    ``SECURE_PROXY_SSL_HEADER`` (the page looks ``http://``), or a ``Host`` without its port.
    A page on ``localhost`` is served only when its origin (``http://localhost:<port>``) is in
    ``EDGE_ORIGINS`` too: the edge answers only the origins listed there."""
    config = conf.get_config()
    origins = config["EDGE_ORIGINS"] or ()
    if request is not None and (config["EDGE_URL"] or config["EDGE_ADDRESS"]):
        page = _page_origin(request)
        if page not in origins:
            if page is not None:
                _warn_once("origin", "fastpoll.edge_url(): the page's origin %s is not in FASTPOLL['EDGE_ORIGINS'] "
                           "%s, so its pages poll the site, not the edge. The usual causes: TLS ends at a proxy "
                           "and Django, without SECURE_PROXY_SSL_HEADER = ('HTTP_X_FORWARDED_PROTO', 'https'), "
                           "sees http://; or nginx's `proxy_set_header Host $host` drops a port other than 80/443 "
                           "(use $http_host). Else add %r to EDGE_ORIGINS.", page, list(origins), page)
            return ""
    if config["EDGE_URL"]:
        return config["EDGE_URL"]
    address = config["EDGE_ADDRESS"]
    if not address or not isinstance(address, str):
        return ""
    try:
        host, port = parse_address(address, "EDGE_ADDRESS")
    except ConfigurationError:
        return ""              # fastpoll.E016 says what is wrong with it
    if not is_loopback(host):
        return ""              # fastpoll.E016: EDGE_URL is required
    if request is not None:
        page_host = _request_host(request)
        given = loopback_edge_host(host, page_host)
        if given is not None:
            host = given
        else:
            _warn_once("host", "fastpoll.edge_url(): a page on %s is not given the loopback edge %s: its browser "
                       "has no cookie for that host (pages on it, or on localhost, are); open the page on %s or "
                       "localhost, or set FASTPOLL['EDGE_URL'].", page_host, address, host)
            return ""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
