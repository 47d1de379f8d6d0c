from django.urls import path

from . import views

app_name = "plurkweb"
urlpatterns = [
    path("", views.timeline, name="timeline"),
    path("login", views.login, name="login"),
    path("signup", views.signup, name="signup"),
    path("u/<str:username>", views.user_page, name="user"),
]
