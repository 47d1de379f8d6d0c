from django.apps import AppConfig


class InboxConfig(AppConfig):
    name = "inbox"

    def ready(self):
        from . import polls  # noqa: F401  registers the "inbox" poll resource
