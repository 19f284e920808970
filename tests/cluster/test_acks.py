"""``ACK_REPLICAS`` on a Redis Cluster: each node's calls are followed by a ``WAIT`` of its own, on their connection."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio as aioredis

from switchboard.core.messages import InboundMessage
from switchboard.errors import QueueUnavailableError
from switchboard.queue import scripts
from switchboard.queue.coalescer import ReplicasUnconfirmedError
from switchboard.queue.connection import async_client
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease
from switchboard.settings import QueueSettings
from tests.cluster.servers import ClusterNode, LocalCluster
from tests.queue.conftest import make_message

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]


@pytest.fixture
async def cluster_client(cluster_url: str) -> AsyncIterator[aioredis.RedisCluster]:
    client = async_client(cluster_url)
    assert isinstance(client, aioredis.RedisCluster)
    await client.initialize()  # the slot map, for get_node_from_key below
    await scripts.load_all(client)  # type: ignore[arg-type]  # as a gateway running for a while has them
    yield client
    await client.aclose()


@pytest.fixture
def paused(redis_cluster: LocalCluster) -> Iterator[list[ClusterNode]]:
    """Nodes a test froze (SIGSTOP): thawed at teardown, and the cluster waited on until it is whole again."""
    frozen: list[ClusterNode] = []
    yield frozen
    for node in frozen:
        assert node.process is not None
        os.kill(node.process.pid, signal.SIGCONT)
    if frozen:
        redis_cluster.wait_healthy()


def _messages_on_every_primary(cluster: aioredis.RedisCluster, per_node: int = 3) -> dict[int, list[InboundMessage]]:
    """Messages of distinct conversations, ``per_node`` on each primary, by the primary's port."""
    by_port: dict[int, list[InboundMessage]] = {node.port: [] for node in cluster.get_primaries()}
    for n in range(1000):
        message = make_message(f"hello {n}", conversation=f"ack-{n}")
        node = cluster.get_node_from_key(SessionKeys(message.session_key).inbox)
        assert node is not None
        if len(by_port[node.port]) < per_node:
            by_port[node.port].append(message)
        if all(len(messages) == per_node for messages in by_port.values()):
            return by_port
    raise AssertionError("no conversation found on some primary")


def _flush_scripts(redis_cluster: LocalCluster) -> None:
    for node in redis_cluster.nodes:
        if node.process is not None:
            with node.client() as direct:
                if direct.info("replication")["role"] == "master":
                    direct.script_flush()


def _waits(node: ClusterNode) -> int:
    with node.client() as direct:
        stats = direct.info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


def _replica_of(redis_cluster: LocalCluster, port: int) -> ClusterNode:
    with redis_cluster.node(port).client() as direct:
        replica = direct.info("replication")["slave0"]
    return redis_cluster.node(int(replica["port"]))


def _inbox_on_replica(replica: ClusterNode, message: InboundMessage) -> list[bytes]:
    with replica.client() as direct:  # one connection: READONLY holds for the read after it
        direct.execute_command("READONLY")
        inbox: list[bytes] = direct.lrange(SessionKeys(message.session_key).inbox, 0, -1)
    return inbox


async def test_an_ingest_batch_over_every_primary_is_answered_once_each_primarys_replica_has_it(
    cluster_client: aioredis.RedisCluster, redis_cluster: LocalCluster
) -> None:
    by_port = _messages_on_every_primary(cluster_client)
    assert len(by_port) == 3
    before = {port: _waits(redis_cluster.node(port)) for port in by_port}
    ingestor = Ingestor(cluster_client, QueueSettings(ack_replicas=1, ack_timeout_ms=2000))  # type: ignore[arg-type]
    messages = [m for ms in by_port.values() for m in ms]

    results = await asyncio.gather(*(ingestor.ingest(m) for m in messages))  # one batch: one loop iteration

    assert all(not r.duplicate and not r.limited for r in results)
    # one WAIT per primary for the whole batch, sent to the node that took the batch's writes there
    assert {port: _waits(redis_cluster.node(port)) - before[port] for port in by_port} == dict.fromkeys(by_port, 1)
    for port, node_messages in by_port.items():
        replica = _replica_of(redis_cluster, port)
        for message in node_messages:
            result = results[messages.index(message)]
            assert _inbox_on_replica(replica, message) == [result.message_id.encode()], (
                "answered before the replica had it"
            )


async def test_a_batch_refused_noscript_is_loaded_and_sent_again_each_call_followed_by_a_wait(
    cluster_client: aioredis.RedisCluster, redis_cluster: LocalCluster
) -> None:
    by_port = _messages_on_every_primary(cluster_client, per_node=2)
    _flush_scripts(redis_cluster)  # as a restarted node, or a replica promoted in a failover, would
    before = {port: _waits(redis_cluster.node(port)) for port in by_port}
    ingestor = Ingestor(cluster_client, QueueSettings(ack_replicas=1, ack_timeout_ms=2000))  # type: ignore[arg-type]
    messages = [m for ms in by_port.values() for m in ms]

    results = await asyncio.gather(*(ingestor.ingest(m) for m in messages))

    assert all(not r.duplicate for r in results)
    for port, node_messages in by_port.items():
        assert _waits(redis_cluster.node(port)) - before[port] >= 2  # the refused batch's, then each call's own
        replica = _replica_of(redis_cluster, port)
        for message in node_messages:
            result = results[messages.index(message)]
            assert _inbox_on_replica(replica, message) == [result.message_id.encode()], (
                "answered before the replica had it"
            )


async def test_a_primary_whose_replica_is_frozen_fails_its_own_calls_only(
    cluster_client: aioredis.RedisCluster, redis_cluster: LocalCluster, paused: list[ClusterNode]
) -> None:
    by_port = _messages_on_every_primary(cluster_client)
    stalled = min(by_port)
    replica = _replica_of(redis_cluster, stalled)
    ingestor = Ingestor(cluster_client, QueueSettings(ack_replicas=1, ack_timeout_ms=300))  # type: ignore[arg-type]
    messages = [m for ms in by_port.values() for m in ms]
    assert replica.process is not None
    os.kill(replica.process.pid, signal.SIGSTOP)
    paused.append(replica)

    results = await asyncio.gather(*(ingestor.ingest(m) for m in messages), return_exceptions=True)

    for message, result in zip(messages, results, strict=True):
        if message in by_port[stalled]:
            assert isinstance(result, QueueUnavailableError)
            assert isinstance(result.__cause__, ReplicasUnconfirmedError)
            assert f"0 of 1 replicas of 127.0.0.1:{stalled} confirmed within 300 ms" in str(result.__cause__)
        else:
            assert not isinstance(result, BaseException), f"a call on another primary failed: {result!r}"
            assert not result.duplicate


async def test_a_worker_write_waits_for_the_replica_of_its_slots_primary(
    cluster_client: aioredis.RedisCluster, redis_cluster: LocalCluster, paused: list[ClusterNode]
) -> None:
    """The outbox's claim and record (:meth:`Script.replicated`): the script and its ``WAIT`` on the slot's node."""
    session = make_message("x", conversation="outbox-1").session_key
    token = await Lease(cluster_client, worker_id="w1", lease_ms=30_000).acquire(session)  # type: ignore[arg-type]
    assert token is not None
    lease_key = SessionKeys(session).lease
    node = cluster_client.get_node_from_key(lease_key)
    assert node is not None
    before = _waits(redis_cluster.node(node.port))
    renew = ([lease_key], [token.token, 30_000])

    assert await scripts.LEASE_RENEW.replicated(cluster_client, *renew, replicas=1, timeout_ms=2000) == (1, 1)
    assert _waits(redis_cluster.node(node.port)) - before == 1
    _flush_scripts(redis_cluster)  # NOSCRIPT: loaded, and the call sent again, on the same connection
    assert await scripts.LEASE_RENEW.replicated(cluster_client, *renew, replicas=1, timeout_ms=2000) == (1, 1)
    assert _waits(redis_cluster.node(node.port)) - before == 3

    replica = _replica_of(redis_cluster, node.port)
    assert replica.process is not None
    os.kill(replica.process.pid, signal.SIGSTOP)
    paused.append(replica)
    reply, acked = await scripts.LEASE_RENEW.replicated(cluster_client, *renew, replicas=1, timeout_ms=100, rounds=2)
    assert (reply, acked) == (1, 0)  # the write ran; its replica did not confirm it within two waits
    assert _waits(redis_cluster.node(node.port)) - before == 5


async def test_a_call_whose_slot_left_the_node_fails_and_the_slot_map_is_refreshed(
    cluster_client: aioredis.RedisCluster,
) -> None:
    message = make_message("moved", conversation="moved-1")
    inbox = SessionKeys(message.session_key).inbox
    home = cluster_client.get_node_from_key(inbox)
    other = next(n for n in cluster_client.get_primaries() if n.name != getattr(home, "name", None))
    slot = cluster_client.keyslot(inbox)
    cluster_client.nodes_manager.slots_cache[slot] = [other]  # a stale map: as if the slot had moved there
    ingestor = Ingestor(cluster_client, QueueSettings(ack_replicas=1, ack_timeout_ms=2000))  # type: ignore[arg-type]

    with pytest.raises(QueueUnavailableError) as refused:
        await ingestor.ingest(message)
    assert isinstance(refused.value.__cause__, redis.exceptions.MovedError)  # nothing written: the platform posts again
    assert cluster_client.get_node_from_key(inbox) == home  # refreshed: the retry goes to the slot's owner
    assert not (await ingestor.ingest(message)).duplicate
