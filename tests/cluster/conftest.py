"""A real Redis Cluster for the tests (3 primaries, a replica each), started once per run of this folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.cluster.servers import LocalCluster


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster for the run's tests that leave its topology as it was (a failover test starts its own)."""
    with LocalCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture
def cluster_url(redis_cluster: LocalCluster) -> str:
    """A node's URL, with every primary flushed before the test."""
    client = redis.RedisCluster.from_url(redis_cluster.url)
    client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    client.close()
    return redis_cluster.url
