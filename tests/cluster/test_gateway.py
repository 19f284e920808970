"""The gateway on a 3-primary cluster under load: workers SIGKILLed, a primary SIGKILLed, shards moved (issue #26).

Real web tier and ``switchboard worker`` processes on ``redis+cluster://`` (:mod:`tests.cluster.gateway`), Telegram
and web chat traffic, every message answered 2xx checked by :func:`tests.chaos.checker.check`: answered exactly once,
in order per session.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from switchboard.channels.telegram.fake.platform import FakeTelegram
from switchboard.queue.connection import as_redis, async_client
from switchboard.queue.keys import SessionKeys
from switchboard.queue.shards import SHARDS, SLOTS_PER_SHARD
from switchboard.queue.stats import read_stats
from tests.chaos.conftest import fake, pools
from tests.chaos.harness import Gateway, WorkerPool, chaos_env, key_of, text
from tests.cluster.gateway import Outcome, Traffic, finish, session_shards, workers_ready
from tests.cluster.gateway import cluster_url as url_of
from tests.cluster.reshard import move_shards, owner_of, primaries
from tests.cluster.servers import LocalCluster

__all__ = ["fake", "pools"]

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]

WORKERS = 3
KILLS = 8
KILL_GAP_S = (0.8, 1.6)
MAX_ATTEMPTS = "10"
"""A kill counts as an attempt; as in tests/chaos/test_kills.py, not what is measured here."""
LEASE_MS = "3000"
CHAOS_PACE_S = 0.4
"""Slower senders: the kills (one every ~1.2 s) fall while messages still arrive."""
LOSS_WINDOW_S = 1.0
"""Without ``ACK_REPLICAS`` (no ``WAIT``), what a primary acknowledged in about its last replication round
trip may not be on the replica it is replaced by: a message acknowledged that long before the kill may be lost or
answered twice; one acknowledged earlier, or after the promotion, may not."""


@pytest.fixture
async def gateway(base_env: dict[str, str], fake: FakeTelegram) -> AsyncIterator[Callable[..., Any]]:
    """Build the web tier on the Redis at a URL (closed at teardown)."""
    made: list[Gateway] = []

    async def build(url: str, **queue: str) -> tuple[Gateway, dict[str, str]]:
        env = chaos_env(base_env | {"SWITCHBOARD_REDIS_URL": url}, fake.base_url, **queue)
        made.append(Gateway(env))
        await made[-1].start()
        return made[-1], env

    yield build
    for g in made:
        await g.close()


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster for one test that changes its topology."""
    with LocalCluster(tmp_path / "cluster") as c:
        yield c


@pytest.fixture
def own_cluster_two_replicas(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster for one test that kills a primary and still needs a replica behind the one promoted in its place."""
    with LocalCluster(tmp_path / "cluster", replicas=2) as c:
        yield c


async def _lease_holders(redis: aioredis.Redis, sessions: range) -> dict[str, list[int]]:
    """Worker id → the test sessions whose lease it holds now (one ``GET`` per session: their slots differ)."""
    holders: dict[str, list[int]] = {}
    for session in sessions:
        value = text(await redis.get(SessionKeys(key_of(session)).lease))
        if value:
            holders.setdefault(value.split(":", 1)[1], []).append(session)
    return holders


def _assert_exactly_once_in_order(outcome: Outcome, traffic: Traffic) -> None:
    report, web = outcome.report, outcome.web
    assert report.acked == traffic.sessions * traffic.messages, outcome.summary()
    assert not report.lost and not report.dead_lettered, outcome.summary()
    assert not report.unexplained_duplicates, outcome.summary()
    assert report.duplicate_replies <= report.counters["send_window_duplicates"], outcome.summary()
    assert not report.inversions and not report.misrouted, outcome.summary()
    assert report.max_runs_per_session == 1, outcome.summary()
    assert web.acked == traffic.web_sessions * traffic.messages, outcome.summary()
    assert not web.lost and not web.duplicates and not web.out_of_order, outcome.summary()


# ------------------------------------------------------------------------------------------- the harness itself


async def test_the_web_tier_on_the_cluster_answers_2xx_and_stores_each_message(
    redis_cluster: LocalCluster, cluster_url: str, gateway: Callable[..., Any]
) -> None:
    web, _env = await gateway(url_of(redis_cluster))
    client = as_redis(async_client(cluster_url))
    try:
        traffic = Traffic(web, client, sessions=4, web_sessions=2, messages=3)
        await traffic.open()
        await asyncio.wait_for(traffic.run(), 30)
        assert traffic.acked == 18 and not traffic.refused
        for session in range(4):
            assert await client.llen(SessionKeys(key_of(session)).inbox) == 3
        assert (await read_stats(client)).accepted == 18
    finally:
        await client.aclose()


async def test_the_harness_on_one_node_answers_every_message_once_in_order(
    redis_url: str,
    gateway: Callable[..., Any],
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
) -> None:
    """The same senders, workers and checks on the embedded single server: what the cluster tests rely on works."""
    web, env = await gateway(redis_url)
    client = as_redis(async_client(redis_url))
    pool = pools(env, 2)
    try:
        await workers_ready(pool)
        traffic = Traffic(web, client, sessions=6, web_sessions=2, messages=8)
        await traffic.open()
        await asyncio.wait_for(traffic.run(), 30)
        outcome = await finish(traffic, fake, pool)
        print(f"\n[one node] {outcome.summary()}")
        _assert_exactly_once_in_order(outcome, traffic)
        assert outcome.report.answered == 48 and not outcome.refused
    finally:
        await client.aclose()


# ------------------------------------------------------------------------------------------------------- chaos


@pytest.mark.parametrize("where", [pytest.param("cluster"), pytest.param("one node", marks=pytest.mark.chaos)])
async def test_workers_sigkilled_under_load_answer_every_message_once_in_order(
    where: str,
    request: pytest.FixtureRequest,
    gateway: Callable[..., Any],
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
) -> None:
    """On the cluster; and the same on the embedded single server, so the test's own kill loop and checks are known
    to work while the cluster case cannot run."""
    rng = random.Random(26)
    if where == "cluster":
        url = url_of(request.getfixturevalue("redis_cluster"))
        request.getfixturevalue("cluster_url")  # every primary flushed
    else:
        url = request.getfixturevalue("redis_url")
    web, env = await gateway(url, QUEUE__MAX_ATTEMPTS=MAX_ATTEMPTS, QUEUE__LEASE_MS=LEASE_MS)
    client = as_redis(async_client(url))
    pool = pools(env, WORKERS)
    try:
        await workers_ready(pool)
        traffic = Traffic(web, client, disrupt_after=20, pace_s=CHAOS_PACE_S)
        await traffic.open()
        load = asyncio.create_task(traffic.run())

        async def chaos() -> None:
            """Kill a worker inside a run (or any after 1 s without one), one crash at a time (tests/chaos)."""
            await traffic.halfway.wait()
            while len(pool.signals) < KILLS:
                await asyncio.sleep(rng.uniform(*KILL_GAP_S))
                waited = 0.0
                while True:
                    alive = pool.alive()
                    if len(alive) >= WORKERS - 1:
                        busy = await _lease_holders(client, range(traffic.sessions))
                        running = [slot for slot in alive if pool.worker_id(slot) in busy]
                        if running or waited >= 1.0:
                            pool.kill(rng.choice(running or alive))
                            break
                    waited += 0.02
                    await asyncio.sleep(0.02)

        await asyncio.wait_for(asyncio.gather(load, chaos()), 60)
        outcome = await finish(traffic, fake, pool)
        print(f"\n[chaos, {where}] {len(pool.signals)} kills, {pool.restarts} restarts; {outcome.summary()}")
        _assert_exactly_once_in_order(outcome, traffic)
        assert len(pool.signals) == KILLS
        assert not outcome.report.unexplained_takeovers and not outcome.report.stale_epochs, outcome.summary()
        assert outcome.report.takeovers > 0, "no kill interrupted a run: the test proved nothing"
    finally:
        await client.aclose()


# ---------------------------------------------------------------------------------------------------- failover


def _wait_promoted(cluster: LocalCluster, replica_ports: list[int], timeout: float = 20.0) -> int:
    """Until one of the replicas is promoted; its port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for port in replica_ports:
            with cluster.node(port).client() as c:
                if c.info("replication")["role"] == "master":
                    cluster.wait_healthy(timeout)
                    return port
        time.sleep(0.05)
    raise AssertionError(f"none of the replicas {replica_ports} promoted: {cluster.describe()}")


async def _kill_a_primary_under_load(
    cluster: LocalCluster,
    gateway: Callable[..., Any],
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    **queue: str,
) -> tuple[Outcome, Traffic, Gateway, float, str]:
    """SIGKILL the primary holding most of the test's sessions halfway through the load; wait for its replica.

    Returns the outcome, the traffic, the web tier, when the primary was killed, and a summary.
    """
    web, env = await gateway(url_of(cluster), **queue)
    client = as_redis(async_client(url_of(cluster)))
    pool = pools(env, 2)
    try:
        await workers_ready(pool)
        traffic = Traffic(web, client, disrupt_after=60)
        await traffic.open()
        seed = cluster.startup_nodes[0]
        owners = [owner_of(seed, SLOTS_PER_SHARD * shard).port for shard in session_shards(range(12)).values()]
        victim = max(set(owners), key=owners.count)
        with cluster.node(victim).client() as c:
            replicas = [int(r["port"]) for r in c.info("replication").values() if isinstance(r, dict)]
        load = asyncio.create_task(traffic.run())
        await asyncio.wait_for(traffic.halfway.wait(), 30)
        cluster.node(victim).kill()
        killed_at = time.time()
        replica = await asyncio.to_thread(_wait_promoted, cluster, replicas)
        promoted_at = time.time()
        await asyncio.wait_for(load, 50)
        outcome = await finish(traffic, fake, pool)
    finally:
        await client.aclose()
    summary = (
        f"{outcome.summary()}; killed {victim}, promoted {replica} in {promoted_at - killed_at:.2f}s, "
        f"{pool.restarts} worker restarts"
    )
    return outcome, traffic, web, killed_at, summary


async def test_a_primary_sigkilled_under_load_loses_reorders_or_repeats_nothing_acknowledged_outside_the_window(
    own_cluster: LocalCluster,
    gateway: Callable[..., Any],
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    record_property: Callable[[str, Any], None],
) -> None:
    outcome, traffic, web, killed_at, summary = await _kill_a_primary_under_load(own_cluster, gateway, fake, pools)
    report = outcome.report
    posted = {(p.session, p.index): p for p in web.posted if 200 <= p.status < 300}
    window = {k for k, p in posted.items() if killed_at - LOSS_WINDOW_S <= p.done_at <= killed_at}
    summary += f", {len(window)} Telegram messages acknowledged in the last {LOSS_WINDOW_S:g}s before the kill"
    print(f"\n[cluster failover] {summary}")
    record_property("cluster_failover", summary)
    assert report.acked == traffic.sessions * traffic.messages, summary
    assert set(report.lost) <= window and set(report.duplicates) <= window, summary
    assert not report.inversions and not report.misrouted, summary
    web_window = {m for m, at in outcome.web.acked_at.items() if killed_at - LOSS_WINDOW_S <= at <= killed_at}
    assert set(outcome.web.lost) <= web_window and set(outcome.web.duplicates) <= web_window, summary
    assert not outcome.web.out_of_order, summary
    assert sum(outcome.refused.values()) > 0, "the kill fell outside the load: nothing was refused meanwhile"


async def test_with_ack_replicas_a_primary_sigkilled_under_load_loses_repeats_or_reorders_nothing_acknowledged(
    own_cluster_two_replicas: LocalCluster,
    gateway: Callable[..., Any],
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    record_property: Callable[[str, Any], None],
) -> None:
    """``ACK_REPLICAS=1``: a message is answered 2xx only once a replica has it, so no window.

    Two replicas per primary: the promoted one must have a replica of its own to confirm the writes after the kill
    (with one, its shards are answered 503 until the killed node is back as its replica).
    """
    outcome, traffic, _, _, summary = await _kill_a_primary_under_load(
        own_cluster_two_replicas, gateway, fake, pools, QUEUE__ACK_REPLICAS="1", QUEUE__ACK_TIMEOUT_MS="300"
    )
    report = outcome.report
    print(f"\n[cluster failover, ACK_REPLICAS=1] {summary}")
    record_property("cluster_failover_ack_1", summary)
    assert report.acked == traffic.sessions * traffic.messages, summary
    assert not report.lost and not report.dead_lettered, summary
    assert not report.inversions and not report.misrouted, summary
    # a reply sent just before the primary died whose record had not reached the replica is sent again, as after a
    # worker's crash in the same window: counted by the queue, and nothing else repeats
    assert report.duplicate_replies <= report.counters["send_window_duplicates"], summary
    web = outcome.web
    assert web.acked == traffic.web_sessions * traffic.messages, summary
    assert not web.lost and not web.duplicates and not web.out_of_order, summary
    assert sum(outcome.refused.values()) > 0, "the kill fell outside the load: nothing was refused meanwhile"


# ---------------------------------------------------------------------------------------------- slot migration


async def test_a_third_of_the_shards_moved_under_load_answer_every_message_once_in_order(
    own_cluster: LocalCluster,
    gateway: Callable[..., Any],
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
) -> None:
    seed = own_cluster.startup_nodes[0]
    shards = session_shards(range(12))
    source = owner_of(seed, SLOTS_PER_SHARD * shards[0])  # a third of the shards: every one this primary holds
    moved = [n for n in range(SHARDS) if SLOTS_PER_SHARD * n in source.slots]
    target = next(n for n in primaries(seed) if n.id != source.id)
    web, env = await gateway(url_of(own_cluster))
    client = as_redis(async_client(url_of(own_cluster)))
    pool = pools(env, 2)
    try:
        await workers_ready(pool)
        traffic = Traffic(web, client, disrupt_after=40)
        assert 300 < len(moved) < 400 and shards[0] in moved
        await traffic.open()
        load = asyncio.create_task(traffic.run())
        await asyncio.wait_for(traffic.halfway.wait(), 30)
        move = await asyncio.to_thread(move_shards, seed, moved, target.address)
        await asyncio.wait_for(load, 50)
        outcome = await finish(traffic, fake, pool)
        print(f"\n[cluster slot migration] moved {move.slots} slots, {move.keys} keys in {move.seconds:.2f}s; "
              f"{outcome.summary()}")  # fmt: skip
        _assert_exactly_once_in_order(outcome, traffic)
        with redis.Redis(host=target.host, port=target.port) as c:
            for session, shard in shards.items():
                if shard in moved:
                    assert c.execute_command("CLUSTER", "COUNTKEYSINSLOT", SLOTS_PER_SHARD * shard) > 0, session
    finally:
        await client.aclose()
