from django.apps import AppConfig


class PlurkCoreConfig(AppConfig):
    """Wiring only: the cache publisher's model-signal receivers and the system checks."""

    name = "plurkcore"
    verbose_name = "Plurk core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks, conf, publish  # noqa: F401  (conf: connects setting_changed)

        checks.register()
        publish.install()
