from django.apps import AppConfig


class PlurkSiteConfig(AppConfig):
    """The project package is an app too, so that its management commands (runstack) exist."""

    name = "plurksite"
    verbose_name = "Plurk stack"
