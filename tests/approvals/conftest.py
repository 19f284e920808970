"""Fixtures: the queue's (a real Redis client, settings, an ingestor) and a :class:`World` over them."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from switchboard.queue.ingest import Ingestor
from switchboard.settings import QueueSettings
from tests.queue.conftest import client, ingestor, queue_settings

from .harness import World

__all__ = ["client", "ingestor", "queue_settings"]


@pytest.fixture
def world(client: aioredis.Redis, queue_settings: QueueSettings, ingestor: Ingestor, tmp_path: Path) -> World:
    return World(client, queue_settings, ingestor, tmp_path)
