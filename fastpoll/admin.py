from django.contrib import admin

from .models import StaleKey, SuspectServer, UserState


@admin.register(UserState)
class UserStateAdmin(admin.ModelAdmin):
    list_display = ("user", "epoch")
    raw_id_fields = ("user",)
    search_fields = ("user__username",)


@admin.register(SuspectServer, StaleKey)
class CacheDebtAdmin(admin.ModelAdmin):
    """Read-only view of pending cache repairs (manage.py repaircache clears them)."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
