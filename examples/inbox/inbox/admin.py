from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from .models import Announcement, Board, Notification, User

admin.site.register(User, UserAdmin)
admin.site.register(Notification, list_display=["user", "text", "read", "created"])
admin.site.register(Board, filter_horizontal=["members"])
admin.site.register(Announcement, list_display=["board", "text", "created"])
