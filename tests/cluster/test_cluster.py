"""The test cluster is real: keys land on every primary, replicas follow, a killed primary's replica takes over."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from redis.backoff import ConstantBackoff
from redis.cluster import key_slot
from redis.retry import Retry

from tests.cluster.servers import LocalCluster

pytestmark = pytest.mark.cluster

KEYS = [f"sb:test:{i}" for i in range(300)]


def test_keys_spread_over_every_primary_and_read_back(cluster_url: str) -> None:
    rc = redis.RedisCluster.from_url(cluster_url)
    try:
        for key in KEYS:
            rc.set(key, key.upper())
        assert [rc.get(k) for k in KEYS] == [k.upper().encode() for k in KEYS]
        primaries = rc.get_primaries()
        assert len(primaries) == 3
        assert len(rc.get_replicas()) == 3
        per_node = {p.port: rc.get_redis_connection(p).dbsize() for p in primaries}
        assert sum(per_node.values()) == len(KEYS)
        assert all(n > 0 for n in per_node.values()), per_node
        slots = {key_slot(k.encode()) for k in KEYS}
        assert len(slots) > 250  # many slots, not one
        assert rc.cluster_info()["cluster_state"] == "ok"
    finally:
        rc.close()


async def test_asyncio_cluster_client_reads_and_writes(cluster_url: str) -> None:
    rc = aioredis.RedisCluster.from_url(cluster_url)
    try:
        for key in KEYS:
            await rc.set(key, key)
        assert await rc.mget_nonatomic(KEYS) == [k.encode() for k in KEYS]
        # a hash tag keeps keys together: a multi-key script on one slot runs, across slots it is refused
        tagged = ["sb:{s1}:a", "sb:{s1}:b"]
        assert (
            await rc.eval("return redis.call('SET', KEYS[1], 'x') and redis.call('GET', KEYS[2])", 2, *tagged) is None
        )
        with pytest.raises(redis.RedisClusterException):
            await rc.eval("return 1", 2, "sb:{s1}:a", "sb:{s2}:a")
    finally:
        await rc.aclose()


def test_replicas_hold_the_primaries_data(cluster_url: str) -> None:
    rc = redis.RedisCluster.from_url(cluster_url)
    try:
        for key in KEYS[:50]:
            rc.set(key, "v")
        assert len(rc.get_replicas()) == 3
        deadline = time.monotonic() + 5
        while True:  # replicas answer DBSIZE without READONLY
            replica_keys = sum(rc.get_redis_connection(r).dbsize() for r in rc.get_replicas())
            if replica_keys == 50 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert replica_keys == 50
    finally:
        rc.close()


def test_sigkilled_primary_is_replaced_by_its_replica_without_losing_acknowledged_writes(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "failover") as cluster:
        rc = redis.RedisCluster.from_url(cluster.url, retry=Retry(ConstantBackoff(0.2), 20))
        try:
            victim = rc.get_node_from_key("sb:{victim}:x")
            victim_conn = rc.get_redis_connection(victim)
            # acknowledged under WAIT 1: each write and its WAIT on one connection, so WAIT covers that write
            written = [f"sb:{{victim}}:{i}" for i in range(200)]
            pipe = victim_conn.pipeline(transaction=False)
            for key in written:
                pipe.set(key, key)
            pipe.wait(1, 5000)
            assert pipe.execute()[-1] == 1  # one replica confirmed every write above
            replica_port = next(int(r["port"]) for r in victim_conn.info("replication").values() if isinstance(r, dict))
            cluster.node(victim.port).kill()

            deadline = time.monotonic() + 20
            promoted = False
            while time.monotonic() < deadline and not promoted:
                time.sleep(0.1)
                with cluster.node(replica_port).client() as c:
                    promoted = c.info("replication")["role"] == "master"
            assert promoted, cluster.describe()
            cluster.wait_healthy(20)

            values = [rc.get(k) for k in written]  # the client follows the new topology (MOVED / reconnect)
            assert values == [k.encode() for k in written]
            assert rc.get_node_from_key("sb:{victim}:x").port == replica_port
            rc.set("sb:{victim}:after", "1")  # the promoted replica takes writes
            assert rc.get("sb:{victim}:after") == b"1"
        finally:
            rc.close()
