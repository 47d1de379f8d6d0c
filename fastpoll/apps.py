from django.apps import AppConfig


class FastpollConfig(AppConfig):
    """Wiring only: the system checks, the watched models' signals, the notices to fastpath and
    the logout receiver.  Resources registered by other apps' ``ready()`` (or imports) are
    watched as they are registered."""

    name = "fastpoll"
    verbose_name = "fastpoll"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks, checks_fastpath, checks_site, middleware, notify, signals, watch

        checks.register()
        checks_fastpath.register_checks()
        checks_site.register_checks()
        watch.install()
        middleware.install()
        signals.answers_stored.connect(notify.keys_stored, dispatch_uid="fastpoll.notify")
