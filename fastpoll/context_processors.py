"""A template context processor (named in ``TEMPLATES``, as the middleware is in ``MIDDLEWARE``;
docs/integrate.md section 5): what a page's script needs of the settings, for its data- attributes."""
from . import conf


def fastpoll(request):
    """``fastpoll_prefix``: ``FASTPOLL["PATH_PREFIX"]``, the shipped client's ``options.prefix``
    (``"/Poll/"`` by default), so that a page's script polls the paths the site serves."""
    return {"fastpoll_prefix": conf.get_config()["PATH_PREFIX"]}
