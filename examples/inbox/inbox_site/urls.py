from django.contrib import admin
from django.urls import include, path

from inbox.views import board, index

urlpatterns = [
    path("", index, name="inbox"),
    path("boards/<int:pk>/", board, name="board"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),   # login, logout (POST)
    path("", include("fastpoll.urls")),                       # GET /Poll/inbox, /Poll/board/<id>
]
