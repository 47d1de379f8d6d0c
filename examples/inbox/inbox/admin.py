from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from .models import Notification, User

admin.site.register(User, UserAdmin)
admin.site.register(Notification, list_display=["user", "text", "read", "created"])
