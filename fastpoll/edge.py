"""The URL pages poll the edge by (``fastpoll.edge_url``; docs/integrate.md "The edge").

The edge is fastpath's second listener (``FASTPOLL["EDGE_ADDRESS"]``, fastpath ``--edge``),
which browsers poll without nginx; a miss there sends them to the site once (docs/contract.md,
section 10).  A page learns where it is from this one function, through its template.
"""
from urllib.parse import urlsplit

from fastpath.errors import ConfigurationError
from fastpath.options import is_loopback, parse_address

from . import conf


def _request_host(request):
    try:
        return urlsplit("//" + request.get_host()).hostname
    except Exception:           # DisallowedHost, a bad port: no page is served to it anyway
        return None


def _page_origin(request):
    try:
        return f"{request.scheme}://{request.get_host()}".lower()
    except Exception:           # DisallowedHost: no page is served to it anyway
        return None


def edge_url(request=None):
    """The origin of the edge as a page's script must call it, without a trailing slash (a poll
    is ``edge_url() + PATH_PREFIX + resource``), or ``""`` when the page should poll the site.

    Only to a ``request`` whose page origin is one of ``EDGE_ORIGINS`` (the edge would refuse any
    other page's requests by CORS).  ``FASTPOLL["EDGE_URL"]`` when it is set.  Otherwise, for a
    loopback ``EDGE_ADDRESS``, ``http://<EDGE_ADDRESS>``: only to a ``request`` made to that very
    host, or to ``localhost`` (then by that name): a browser on another machine cannot reach this
    one's loopback, and a page on another host has no cookie for the edge's.  With no
    ``request``: that URL as such."""
    config = conf.get_config()
    if request is not None and _page_origin(request) not in (config["EDGE_ORIGINS"] or ()):
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
        # the page's cookie is its host's: only a page on the edge's own host (or on localhost,
        # which names both loopbacks) sends it there
        page_host = _request_host(request)
        if page_host == "localhost":
            host = page_host
        elif page_host != host.lower():
            return ""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
