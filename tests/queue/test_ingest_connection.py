"""Ingest's fast path: the multiplexed connection (lost connections, flushed scripts, batches) and hand-built JSON."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from switchboard.core.events import EventAdapter, MessageReceived, RunQueued
from switchboard.core.messages import InboundMessage
from switchboard.errors import QueueUnavailableError
from switchboard.queue import scripts
from switchboard.queue.connection import MultiplexedConnection, async_client
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.settings import QueueSettings
from tests.shardindexes import stats_sync

from .conftest import make_message


def test_clients_from_async_client_are_multiplexed(client: aioredis.Redis) -> None:
    assert MultiplexedConnection.supports(client)


async def test_ingest_survives_a_flushed_script_cache(ingestor: Ingestor, sync_redis: redis.Redis) -> None:
    await ingestor.ingest(make_message("before"))
    sync_redis.script_flush()
    results = await asyncio.gather(*(ingestor.ingest(make_message(f"after {i}")) for i in range(5)))
    assert not any(r.duplicate for r in results)
    assert int(stats_sync(sync_redis).get(b"accepted") or 0) == 6


async def test_a_killed_connection_fails_its_callers_and_the_next_ingest_reconnects(
    ingestor: Ingestor, sync_redis: redis.Redis
) -> None:
    await ingestor.ingest(make_message("warm"))
    sync_redis.execute_command("CLIENT", "PAUSE", "500", "WRITE")
    pending = asyncio.ensure_future(ingestor.ingest(make_message("in flight")))
    await asyncio.sleep(0.1)
    sync_redis.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    try:
        with pytest.raises(QueueUnavailableError):  # lost with its connection: the platform retries
            await pending
    finally:
        sync_redis.execute_command("CLIENT", "UNPAUSE")
    result = await ingestor.ingest(make_message("after"))
    assert not result.duplicate


async def test_concurrent_ingests_share_one_connection(client: aioredis.Redis, queue_settings: QueueSettings) -> None:
    await scripts.load_all(client)  # as a worker does at start; a cold cache sends each caller through a fallback
    ingestor = Ingestor(client, queue_settings)
    results = await asyncio.gather(*(ingestor.ingest(make_message(f"m{i}", dedup=f"d{i}")) for i in range(50)))
    assert len({r.message_id for r in results}) == 50
    listed = await client.client_list()
    assert len(listed) <= 3  # the multiplexed connection (plus the one redis-py used for CLIENT LIST)


async def test_an_unreachable_redis_is_queue_unavailable(queue_settings: QueueSettings) -> None:
    dead = async_client("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    try:
        ingestor = Ingestor(dead, queue_settings)
        for _ in range(2):
            try:
                await ingestor.ingest(make_message("lost?"))
            except QueueUnavailableError:
                continue
            pytest.fail("ingest into an unreachable Redis must fail")
    finally:
        await dead.aclose()


async def test_the_stored_record_and_facts_match_their_models(ingestor: Ingestor, client: aioredis.Redis) -> None:
    draft = make_message('quote " backslash \\ and ünïcode ✓')
    result = await ingestor.ingest(draft)
    keys = SessionKeys(draft.session_key)
    stored = InboundMessage.model_validate_json(await client.hget(keys.messages, result.message_id))
    assert stored.id == result.message_id and stored.received_at > draft.received_at - 60
    assert stored.model_dump(exclude={"id", "received_at"}) == draft.model_dump(exclude={"id", "received_at"})
    entries = await client.xrange(keys.events)
    facts = [EventAdapter.validate_json(fields[b"data"]) for _id, fields in entries]
    assert [type(f) for f in facts] == [MessageReceived, RunQueued]
    received = facts[0]
    assert isinstance(received, MessageReceived)
    assert (received.message_id, received.channel, received.sender, received.chars) == (
        result.message_id,
        draft.conversation.channel,
        draft.sender.id,
        len(draft.text),
    )
    assert received.at == stored.received_at == facts[1].at


async def test_without_multiplexing_the_pool_pipeline_path_still_ingests(
    ingestor: Ingestor, sync_redis: redis.Redis
) -> None:
    ingestor._coalescer._mux = None  # as for a TLS/RESP3 client, or a redis-py whose connections cannot be taken over
    sync_redis.script_flush()
    results = await asyncio.gather(*(ingestor.ingest(make_message(f"m{i}", dedup=f"p{i}")) for i in range(10)))
    assert len({r.message_id for r in results}) == 10 and not any(r.duplicate for r in results)
    assert int(stats_sync(sync_redis).get(b"accepted") or 0) == 10


async def test_a_client_serves_more_concurrent_blocking_calls_than_redis_py_s_default_pool(redis_url: str) -> None:
    # redis-py 8 caps a pool at 100 connections and raises past it; a worker at its concurrency cap holds more
    client = async_client(redis_url)
    try:
        results = await asyncio.gather(*(client.blpop([f"test:nothing:{i}"], timeout=0.2) for i in range(150)))
    finally:
        await client.aclose()
    assert results == [None] * 150
