"""Placeholder until the web pages app lands (its owner replaces this file)."""
urlpatterns = []
