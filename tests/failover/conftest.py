"""A primary, a replica and three Sentinels for the failover tests; the chaos tests' fake Telegram and process pools."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.chaos.conftest import fake, gateways, pools
from tests.failover.servers import ReplicatedRedis

__all__ = ["fake", "gateways", "pools", "replicated"]


@pytest.fixture(scope="module")
def replicated_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedRedis]:
    """One set for a module's tests that leave its topology as it was (a failover test starts its own)."""
    with ReplicatedRedis(tmp_path_factory.mktemp("replicated")) as servers:
        yield servers


@pytest.fixture
def replicated(replicated_set: ReplicatedRedis) -> ReplicatedRedis:
    """The module's set, its primary flushed (and so its replica) before the test."""
    primary = replicated_set.primary()
    with primary.client() as client:
        client.flushall()
        client.execute_command("WAIT", len(replicated_set.data) - 1, 2000)
    return replicated_set


def node_client(port: int) -> redis.Redis:
    """A plain client of one data node (to read a replica directly)."""
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
