from django.apps import AppConfig


class PlurkCoreConfig(AppConfig):
    """Wiring only: Plurk's poll resources (registered with fastpoll on import), its receivers
    and its system check."""

    name = "plurkcore"
    verbose_name = "Plurk core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import answers, checks, receivers  # noqa: F401  (answers: registers the resources)

        checks.register()
        receivers.install()
