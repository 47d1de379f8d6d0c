from django.apps import AppConfig


class PlurkCoreConfig(AppConfig):
    """Wiring only: the model-signal receivers that collect changes, the notices to fastpath and
    the system checks."""

    name = "plurkcore"
    verbose_name = "Plurk core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from fastpoll import conf  # noqa: F401  (connects setting_changed)

        from . import checks, notify, receivers, signals

        checks.register()
        receivers.install()
        signals.answers_stored.connect(notify.keys_stored, dispatch_uid="plurkcore.notify")
