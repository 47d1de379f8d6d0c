from django.conf import settings
from django.contrib import admin
from django.contrib.staticfiles.views import serve as serve_static
from django.urls import include, path, re_path


def static(request, path):
    # The page's few static files are served by Django from the apps' static/ folders (no
    # collectstatic step, no file permissions for nginx's workers to get wrong); responses carry
    # Last-Modified, so browsers revalidate cheaply.
    return serve_static(request, path, insecure=True)


urlpatterns = [
    path("admin/", admin.site.urls),
    re_path(r"^%s(?P<path>.*)$" % settings.STATIC_URL.lstrip("/"), static),
    path("", include("fastpoll.urls")),
    path("", include("plurkcore.urls")),
    path("", include("plurkweb.urls")),
]

handler400 = "plurksite.errors.bad_request"
handler403 = "plurksite.errors.permission_denied"
handler404 = "plurksite.errors.page_not_found"
handler500 = "plurksite.errors.server_error"
