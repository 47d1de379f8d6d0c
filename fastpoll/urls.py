"""The poll path only: ``path("", include("fastpoll.urls"))`` in a project's URLconf.

``<PATH_PREFIX><resource>`` (per-user) and ``<PATH_PREFIX><resource>/<object>`` (per-object),
where fastpath answers first and nginx hands misses to these views.
"""
from django.urls import re_path

from . import conf, views

app_name = "fastpoll"

_prefix = conf.get_config()["PATH_PREFIX"].lstrip("/")

urlpatterns = [
    re_path(rf"^{_prefix}(?P<resource>[A-Za-z0-9_]{{1,32}})\Z", views.poll, name="poll"),
    re_path(rf"^{_prefix}(?P<resource>[A-Za-z0-9_]{{1,32}})/(?P<obj>[A-Za-z0-9_-]{{1,64}})\Z", views.poll,
            name="poll-object"),
    # several per-user resources: only ever a stream (docs/contract.md section 9)
    re_path(rf"^{_prefix}(?P<names>[A-Za-z0-9_]{{1,32}}(?:,[A-Za-z0-9_]{{1,32}})+)\Z", views.poll_several,
            name="poll-several"),
    # anything else under the prefix is a poll path that names no resource: a JSON 404, as
    # fastpath's, not the site's HTML page
    re_path(rf"^{_prefix}", views.not_a_poll, name="not-a-poll"),
]
