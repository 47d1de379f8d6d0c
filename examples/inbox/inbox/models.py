import uuid

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models


class User(AbstractUser):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)


class Notification(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="notifications")
    text = models.CharField(max_length=500)
    read = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["user", "read", "-created"])]


class Board(models.Model):
    """An announcement board: one answer that every member reads (the per-object resource)."""
    name = models.CharField(max_length=100)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="boards")

    def __str__(self):
        return self.name


class Announcement(models.Model):
    board = models.ForeignKey(Board, models.CASCADE, related_name="announcements")
    text = models.CharField(max_length=500)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["board", "-created"])]
