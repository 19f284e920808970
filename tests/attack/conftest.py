"""Fixtures of the attack tests: the web chat app and the queue of the suite, on its real Redis."""

from tests.queue.conftest import client, deliverer, ingestor, queue_settings
from tests.webchat.conftest import app_redis, chat, settings

__all__ = ["app_redis", "chat", "client", "deliverer", "ingestor", "queue_settings", "settings"]
