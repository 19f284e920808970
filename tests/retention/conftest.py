"""The queue tests' fixtures (real Redis client, ingestor, queue settings, recording deliverer), for retention."""

from tests.queue.conftest import client, deliverer, ingestor, queue_settings

__all__ = ["client", "deliverer", "ingestor", "queue_settings"]
