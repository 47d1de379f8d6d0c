from django.contrib import admin
from django.urls import include, path

from inbox.views import index

urlpatterns = [
    path("", index, name="inbox"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),   # login, logout (POST)
    path("", include("fastpoll.urls")),                       # GET /Poll/inbox
]
