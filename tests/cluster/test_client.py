"""Switchboard's own clients on a Redis Cluster: ``redis+cluster://`` URLs, a ``redis://`` node found to be a cluster,
the stats readers, pipelines over many shards and the Lua script wrappers (issue #26)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.cluster import key_slot

from switchboard.core.budgets import BudgetRule
from switchboard.core.messages import session_key
from switchboard.errors import ConfigError
from switchboard.queue import connection, scripts
from switchboard.queue.budgets import Budgets
from switchboard.queue.connection import (
    MultiplexedConnection,
    async_client,
    is_cluster,
    is_cluster_node,
    sync_client,
)
from switchboard.queue.keys import FENCED_FIELD, SessionKeys, ShardKeys
from switchboard.queue.lease import Lease
from switchboard.queue.muxredis import MultiplexedRedis, multiplexed_like
from switchboard.queue.shards import SHARDS, TAGS
from switchboard.queue.stats import fenced_total, read_stats
from switchboard.settings import QueueSettings, Settings, load_settings
from switchboard.settings.cluster import ClusterURL, parse_cluster_url
from switchboard.web.app import create_app
from switchboard.web.webchat.fanout import StreamFanout
from tests.cluster.servers import LocalCluster

# ---------------------------------------------------------------------------------------------------------- the URL


def test_a_cluster_url_names_its_seed_nodes_and_credentials() -> None:
    url = "redis+cluster://app:s%40cret@10.0.0.1:6379,[::1]:6380, node-c:7000/0"
    assert parse_cluster_url(url) == ClusterURL(
        nodes=(("10.0.0.1", 6379), ("::1", 6380), ("node-c", 7000)), username="app", password="s@cret"
    )
    assert parse_cluster_url("redis+cluster://h:1") == ClusterURL(nodes=(("h", 1),))
    assert parse_cluster_url("rediss+cluster://:pw@h:1/").tls
    assert parse_cluster_url("valkey+cluster://h:1").nodes == (("h", 1),)
    assert Settings(redis_url="redis+cluster://h:1,h:2").redis_url == "redis+cluster://h:1,h:2"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://h:6379/3", "only database 0"),
        ("redis+cluster://h:6379/0/x", "only database 0"),
        ("redis+cluster://", "at least one cluster node"),
        ("redis+cluster://:pw@", "at least one cluster node"),
        ("redis+cluster://h", "host:port"),
        ("redis+cluster://h:0", "host:port"),
        ("redis+cluster://h:70000", "host:port"),
        ("redis+cluster://:pw@h:1,:2", "host:port"),
        ("redis+cluster://h:1,", "host:port"),
        ("redis+cluster://h:1?ssl_cert_reqs=none", "no ?options"),
    ],
)
def test_a_malformed_cluster_url_is_refused_at_start_up_with_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValidationError) as err:
        Settings(redis_url=url)
    assert says in str(err.value) and "redis+cluster://" in str(err.value)
    assert "pw" not in str(err.value).replace("password", "")


def test_ack_replicas_on_a_cluster_url_is_accepted() -> None:
    settings = Settings(redis_url="redis+cluster://h:1", queue=QueueSettings(ack_replicas=1, ack_timeout_ms=300))
    assert (settings.queue.ack_replicas, settings.queue.ack_timeout_ms) == (1, 300)
    assert Settings(redis_url="redis://h:1", queue=QueueSettings(ack_replicas=1)).queue.ack_replicas == 1


# ------------------------------------------------------------------------------------------------- the clients


def _primaries(cluster: LocalCluster) -> list[int]:
    return [int(address.rsplit(":", 1)[1]) for address, role in cluster.roles().items() if role == "master"]


def _urls(cluster: LocalCluster) -> dict[str, str]:
    ports = _primaries(cluster)
    return {
        "one node": f"redis+cluster://127.0.0.1:{ports[0]}",
        "every primary": "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/0",
        "plain redis:// of a node": f"redis://127.0.0.1:{ports[1]}/0",
    }


SHARD_KEYS = [f"sb:{{{tag}}}:probe" for tag in TAGS]
"""One key per logical shard: 1,024 slots, spread over every primary."""


def _per_primary(cluster: LocalCluster) -> dict[int, int]:
    counts = {}
    for port in _primaries(cluster):
        with redis.Redis(host="127.0.0.1", port=port) as node:
            counts[port] = node.dbsize()
    return counts


@pytest.mark.cluster
@pytest.mark.parametrize("form", ["one node", "every primary", "plain redis:// of a node"])
async def test_the_async_client_of_a_cluster_url_reaches_every_primary(
    form: str, cluster_url: str, redis_cluster: LocalCluster
) -> None:
    client = async_client(_urls(redis_cluster)[form])
    try:
        assert isinstance(client, aioredis.RedisCluster) and is_cluster(client)
        async with client.pipeline(transaction=False) as pipe:  # one pipeline over 1,024 slots, split per node
            for key in SHARD_KEYS:
                pipe.set(key, key)
            assert await pipe.execute() == [True] * SHARDS
        assert await client.mget_nonatomic(SHARD_KEYS) == [k.encode() for k in SHARD_KEYS]
        per_primary = _per_primary(redis_cluster)
        assert len(per_primary) == 3 and all(n > 0 for n in per_primary.values()), per_primary
        assert sum(per_primary.values()) == SHARDS
        # the package's options: timeouts, health checks, primaries only, hiredis packing on every node
        nodes = client.get_nodes()
        assert len(nodes) == 6 and not client.read_from_replicas
        assert {n.connection_kwargs["socket_timeout"] for n in nodes} == {connection.DEFAULT_OPTIONS["socket_timeout"]}
        assert {n.connection_kwargs["health_check_interval"] for n in nodes} == {30}
        assert {n.connection_kwargs["decode_responses"] for n in nodes} == {False}
        assert {n.connection_kwargs["socket_keepalive"] for n in nodes} == {True}
        assert {n.connection_class for n in nodes} == {connection._TCPConnection}
        assert {type(c) for n in client.get_primaries() for c in n._connections} == {connection._TCPConnection}
    finally:
        await client.aclose()


@pytest.mark.cluster
@pytest.mark.parametrize("form", ["one node", "every primary", "plain redis:// of a node"])
def test_the_sync_client_of_a_cluster_url_reaches_every_primary(
    form: str, cluster_url: str, redis_cluster: LocalCluster
) -> None:
    client = sync_client(_urls(redis_cluster)[form])
    try:
        assert isinstance(client, redis.RedisCluster)
        pipe = client.pipeline(transaction=False)
        for key in SHARD_KEYS:
            pipe.set(key, "v")
        pipe.execute()
        assert client.mget_nonatomic(SHARD_KEYS) == [b"v"] * SHARDS
        assert len(client.get_primaries()) == 3
        per_primary = _per_primary(redis_cluster)
        assert all(n > 0 for n in per_primary.values()) and sum(per_primary.values()) == SHARDS
    finally:
        client.close()


@pytest.mark.cluster
def test_a_plain_url_is_probed_once_and_a_single_server_stays_a_single_server(
    cluster_url: str, redis_cluster: LocalCluster, redis_url: str
) -> None:
    node = _urls(redis_cluster)["plain redis:// of a node"]
    assert is_cluster_node(node) and connection._PROBED[node] is True
    assert not is_cluster_node(redis_url)
    single = sync_client(redis_url)
    try:
        assert type(single) is redis.Redis
    finally:
        single.close()
    assert not is_cluster_node("unix:///nowhere.sock")  # the embedded default is never asked
    assert not is_cluster_node("redis://127.0.0.1:1/0", connect_timeout_s=0.2)  # unreachable: one server, asked again
    assert "redis://127.0.0.1:1/0" not in connection._PROBED
    with pytest.raises(ConfigError, match="only database 0"):
        async_client(node.removesuffix("/0") + "/2")


@pytest.mark.cluster
async def test_the_multiplexed_factory_gives_a_cluster_client_of_its_own(
    cluster_url: str, redis_cluster: LocalCluster, async_redis: aioredis.Redis
) -> None:
    template = async_client(_urls(redis_cluster)["one node"])
    try:
        assert not MultiplexedConnection.supports(template)
        streams = multiplexed_like(template, max_connections=2)
        assert isinstance(streams, aioredis.RedisCluster) and streams is not template
        await streams.set(SHARD_KEYS[0], "x")
        await streams.aclose()
        assert await template.get(SHARD_KEYS[0]) == b"x"  # the template's pools are its own
        assert {n.connection_class for n in streams.get_nodes()} == {connection._TCPConnection}
        single = multiplexed_like(async_redis)
        assert isinstance(single, MultiplexedRedis)
        await single.aclose()
    finally:
        await template.aclose()


# -------------------------------------------------------------------------------------------- readers and scripts


@pytest.fixture
async def cluster_client(cluster_url: str) -> AsyncIterator[aioredis.RedisCluster]:
    client = async_client(cluster_url)  # the fixture's plain URL: found to be a cluster
    assert isinstance(client, aioredis.RedisCluster)
    await client.initialize()  # the slot map, for get_node_from_key below
    yield client
    await client.aclose()


@pytest.mark.cluster
async def test_the_stats_readers_sum_the_fenced_counters_of_every_primary(
    cluster_client: aioredis.RedisCluster, redis_cluster: LocalCluster
) -> None:
    shards = [0, 1, 300, 511, 700, 1023]
    for i, shard in enumerate(shards, start=1):
        await cluster_client.hincrby(ShardKeys(shard).stats, FENCED_FIELD, i)
    homes = {cluster_client.get_node_from_key(ShardKeys(s).stats).port for s in shards}
    assert len(homes) == 3  # the counters live on all three primaries
    assert await fenced_total(cluster_client) == sum(range(1, len(shards) + 1))
    stats = await read_stats(cluster_client)
    assert stats.fenced_rejections == 21 and stats.runnable_sessions == 0 and stats.accepted == 0


def _flush_scripts(cluster: aioredis.RedisCluster) -> None:
    for node in cluster.get_primaries():
        with redis.Redis(host=node.host, port=node.port) as direct:
            direct.script_flush()


SESSIONS = [session_key("acme", "assistant", "telegram", "bot1", f"chat-{i}") for i in range(40)]


@pytest.mark.cluster
async def test_one_slot_scripts_run_through_the_wrappers_and_reload_after_noscript(
    cluster_client: aioredis.RedisCluster,
) -> None:
    homes = {cluster_client.get_node_from_key(SessionKeys(s).lease).port for s in SESSIONS}
    assert len(homes) == 3
    lease = Lease(cluster_client, worker_id="w1", lease_ms=30_000)  # type: ignore[arg-type]
    tokens = [await lease.acquire(s) for s in SESSIONS]  # EVALSHA routed by the first key; NOSCRIPT loads it
    assert all(t is not None and t.epoch > 1 for t in tokens)
    assert await Lease(cluster_client, worker_id="w2", lease_ms=30_000).acquire(SESSIONS[0]) is None  # type: ignore[arg-type]
    assert all([await lease.renew(t) for t in tokens if t is not None])

    _flush_scripts(cluster_client)  # as a restarted node, or a failover to a replica, would
    for token in tokens:
        assert token is not None
        assert await lease.renew(token)  # NOSCRIPT on each primary: loaded again and run
    assert (await cluster_client.script_exists(scripts.LEASE_RENEW.sha)) == [True]

    # Script.many: one non-transactional pipeline of calls on many slots (and nodes)
    calls = [([SessionKeys(s).lease], [t.token, 30_000]) for s, t in zip(SESSIONS, tokens, strict=True) if t]
    _flush_scripts(cluster_client)
    assert await scripts.LEASE_RENEW.many(cluster_client, calls) == [1] * len(SESSIONS)  # type: ignore[arg-type]

    await scripts.load_all(cluster_client)  # type: ignore[arg-type]
    for node in cluster_client.get_primaries():
        with redis.Redis(host=node.host, port=node.port) as direct:
            assert all(direct.script_exists(*(s.sha for s in scripts.ALL)))


@pytest.mark.cluster
async def test_budget_scripts_run_on_the_cluster(cluster_client: aioredis.RedisCluster) -> None:
    rule = BudgetRule(scope="tenant", credits=10.0, alert_at=(0.5,))
    for tenant in ("acme", "globex", "initech", "umbrella", "hooli", "stark"):
        budgets = Budgets(cluster_client, (rule,))  # type: ignore[arg-type]
        counters = budgets.counters(tenant, "assistant", "u1", "telegram/bot1/1")
        [alert] = await budgets.charge(counters, 6.0)
        assert alert.tenant == tenant and alert.spent == 6.0
        assert await budgets.spent(counters) == [6.0]
        assert not (await budgets.admit(tenant, "assistant", "u1", "telegram/bot1/1")).refused
    slots = {key_slot(c.key.encode()) for c in counters}
    assert len(slots) == 1


# ------------------------------------------------------------------------------------------------ the web streams


@pytest.mark.cluster
async def test_the_web_stream_fanout_reads_sessions_of_every_primary_by_polling(
    cluster_client: aioredis.RedisCluster,
) -> None:
    fanout = StreamFanout(cluster_client)  # the web tier's main client is a cluster client: no blocking reader
    fanout.start()
    try:
        sessions = SESSIONS[:12]
        assert len({cluster_client.get_node_from_key(SessionKeys(s).web).port for s in sessions}) == 3
        subs = {s: fanout.subscribe(s, None)[0] for s in sessions}
        written = {s: (await cluster_client.xadd(SessionKeys(s).web, {"type": "delta", "data": f'{{"n":{i}}}'}))
                   for i, s in enumerate(sessions)}  # fmt: skip
        for i, session in enumerate(sessions):
            async with asyncio.timeout(10):
                while not (batch := await subs[session].next(10)):
                    pass
            [event] = batch
            assert (event.id, event.data) == (written[session].decode(), {"n": i})
        late = SESSIONS[20]  # followed after the reader started: found at the next poll
        sub = fanout.subscribe(late, None)[0]
        await cluster_client.xadd(SessionKeys(late).web, {"type": "delta", "data": '{"n":99}'})
        async with asyncio.timeout(10):
            while not (batch := await sub.next(10)):
                pass
        assert [e.data for e in batch] == [{"n": 99}]
    finally:
        await fanout.aclose()
    assert await cluster_client.ping()  # the fan-out closed its own clients only


@pytest.mark.cluster
async def test_the_web_tier_starts_on_a_cluster_and_its_metrics_read_every_primary(
    cluster_client: aioredis.RedisCluster, cluster_url: str, tmp_path: Path, aiohttp_client: Any
) -> None:
    for shard in (0, 511, 1023):
        await cluster_client.hincrby(ShardKeys(shard).stats, FENCED_FIELD, 2)
    settings = load_settings({"SWITCHBOARD_REDIS_URL": cluster_url, "SWITCHBOARD_DATA_DIR": str(tmp_path)})
    client = await aiohttp_client(create_app(settings))
    health = await client.get("/healthz")
    assert health.status == 200 and (await health.json())["redis"] is True
    metrics = await client.get("/metrics")
    assert metrics.status == 200
    assert "switchboard_fenced_rejections_total 6.0" in await metrics.text()


@pytest.mark.cluster
async def test_the_web_tier_starts_with_ack_replicas_on_a_cluster_found_behind_a_plain_url(
    cluster_url: str, tmp_path: Path, aiohttp_client: Any
) -> None:
    settings = load_settings(
        {
            "SWITCHBOARD_REDIS_URL": cluster_url,
            "SWITCHBOARD_DATA_DIR": str(tmp_path),
            "SWITCHBOARD_QUEUE__ACK_REPLICAS": "1",
        }
    )
    client = await aiohttp_client(create_app(settings))
    health = await client.get("/healthz")
    assert health.status == 200 and (await health.json())["redis"] is True
