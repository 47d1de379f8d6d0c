from django.contrib import admin

from .models import Follow, Plurk, ReadCursor, Response


@admin.register(Plurk)
class PlurkAdmin(admin.ModelAdmin):
    list_display = ("id", "author", "content", "created")
    list_select_related = ("author",)
    search_fields = ("content", "author__username")
    raw_id_fields = ("author",)
    exclude = ("parent",)
    date_hierarchy = "created"

    def get_queryset(self, request):
        return Plurk.objects.select_related("author")


@admin.register(Response)
class ResponseAdmin(admin.ModelAdmin):
    list_display = ("id", "parent_id", "author", "content", "created")
    list_select_related = ("author",)
    search_fields = ("content", "author__username")
    raw_id_fields = ("author", "parent")

    def get_queryset(self, request):
        return Response.objects.select_related("author")

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "parent":
            # a response answers a plurk, never another response, and always has one
            kwargs["queryset"] = Plurk.objects.all()
            kwargs["required"] = True
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(Follow)
class FollowAdmin(admin.ModelAdmin):
    list_display = ("follower", "followee", "created")
    list_select_related = ("follower", "followee")
    raw_id_fields = ("follower", "followee")
    search_fields = ("follower__username", "followee__username")


@admin.register(ReadCursor)
class ReadCursorAdmin(admin.ModelAdmin):
    list_display = ("user", "read_upto")
    raw_id_fields = ("user",)
    search_fields = ("user__username",)
