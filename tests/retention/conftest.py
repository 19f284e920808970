"""The queue tests' fixtures (real Redis client, ingestor, queue settings, recording deliverer) and the integration
API's (the real app), for retention and sealing."""

from tests.api.conftest import api, api_env
from tests.queue.conftest import client, deliverer, ingestor, queue_settings

__all__ = ["api", "api_env", "client", "deliverer", "ingestor", "queue_settings"]
