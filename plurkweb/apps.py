from django.apps import AppConfig


class PlurkWebConfig(AppConfig):
    """The pages people use; everything dynamic goes through plurkcore's JSON API and /Poll/."""

    name = "plurkweb"
    verbose_name = "Plurk web pages"
