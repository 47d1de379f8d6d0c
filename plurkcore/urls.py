from django.urls import path, re_path

from . import api
from .http import api_view, ApiError

app_name = "plurkcore"


@api_view(None, auth=False)
def not_found(request, rest=""):
    # any method: an endpoint that does not exist has no methods to list in a 405
    raise ApiError(404, "no such API endpoint")


urlpatterns = [
    path("api/signup", api.signup, name="signup"),
    path("api/login", api.login, name="login"),
    path("api/logout", api.logout, name="logout"),
    path("api/me", api.me, name="me"),
    path("api/users/<str:username>", api.user_detail, name="user"),
    path("api/follow", api.follow, name="follow"),
    path("api/follow/<str:username>", api.unfollow, name="unfollow"),
    path("api/plurks", api.plurks, name="plurks"),
    path("api/plurks/<int:plurk_id>", api.plurk_detail, name="plurk"),
    path("api/plurks/<int:plurk_id>/responses", api.responses, name="responses"),
    path("api/timeline", api.timeline, name="timeline"),
    path("api/markRead", api.mark_read, name="mark-read"),
    re_path(r"^api(?:/(?P<rest>[\s\S]*))?\Z", not_found),
]
