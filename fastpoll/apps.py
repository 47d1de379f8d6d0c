from django.apps import AppConfig


class FastpollConfig(AppConfig):
    """Wiring only (docs/integrate.md): signals, checks and the notices to fastpath."""

    name = "fastpoll"
    verbose_name = "fastpoll"
    default_auto_field = "django.db.models.BigAutoField"
