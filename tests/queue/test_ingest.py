from __future__ import annotations

import json
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from switchboard.core.messages import InboundMessage
from switchboard.errors import QueueUnavailableError
from switchboard.queue.connection import async_client
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.queue.jobs import entry, job_age_s, parse_entry
from switchboard.queue.keys import SessionKeys
from switchboard.settings import LimitsSettings, QueueSettings
from tests.shardindexes import stats_of

from .conftest import make_message, queued_entries


async def test_ingest_stores_message_and_queues_one_drain_entry_and_wakes_its_shard(
    ingestor: Ingestor, client: aioredis.Redis
) -> None:
    msg = make_message("hello")
    keys = SessionKeys(msg.session_key)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.ssubscribe(keys.shard.ready)
    result = await ingestor.ingest(msg)
    assert not result.duplicate and result.drain_enqueued
    assert [i.decode() for i in await client.lrange(keys.inbox, 0, -1)] == [result.message_id]
    stored = json.loads(await client.hget(keys.messages, result.message_id))
    assert stored["id"] == result.message_id and stored["text"] == "hello"
    assert await client.zscore(SessionKeys(msg.session_key).shard.runnable, msg.session_key) is not None
    assert await client.zscore(SessionKeys(msg.session_key).shard.sessions, msg.session_key) is not None
    kinds = [e["kind"] for e in await read_events(client, msg.session_key)]
    assert kinds == ["message_received", "run_queued"]

    # the session's shard queue holds its entry (the flag names the job), and the shard's worker was woken
    job_id = (await client.get(keys.drain)).decode()
    assert await queued_entries(client, msg.session_key) == [entry(msg.session_key, job_id)]
    assert parse_entry(entry(msg.session_key, job_id)) == (msg.session_key, job_id)
    assert 0 <= (job_age_s(job_id) or -1) < 60
    woken = None
    for _ in range(50):
        woken = woken or await pubsub.get_message(timeout=0.1)
    assert (
        woken is not None and woken["type"] == "smessage" and woken["data"] == entry(msg.session_key, job_id).encode()
    )
    await pubsub.aclose()


async def test_second_message_while_drain_pending_enqueues_nothing(ingestor: Ingestor, client: aioredis.Redis) -> None:
    first = await ingestor.ingest(make_message("a"))
    second = await ingestor.ingest(make_message("b"))
    assert first.drain_enqueued and not second.drain_enqueued
    assert len(await queued_entries(client, make_message("x").session_key)) == 1
    keys = SessionKeys(make_message("x").session_key)
    assert [i.decode() for i in await client.lrange(keys.inbox, 0, -1)] == [first.message_id, second.message_id]


async def test_duplicate_returns_original_id_and_changes_nothing(ingestor: Ingestor, client: aioredis.Redis) -> None:
    msg = make_message("hello", dedup="update-42")
    first = await ingestor.ingest(msg)
    keys = SessionKeys(msg.session_key)
    before = {k: await client.dump(k) for k in (keys.inbox, keys.messages, keys.events, keys.meta)}
    again = await ingestor.ingest(make_message("hello (retry)", dedup="update-42"))
    assert again.duplicate and again.message_id == first.message_id and not again.drain_enqueued
    after = {k: await client.dump(k) for k in (keys.inbox, keys.messages, keys.events, keys.meta)}
    assert before == after
    assert await client.ttl(keys.dedup("update-42")) > 24 * 3600
    counters = await stats_of(client)
    assert counters[b"accepted"] == b"1" and counters[b"deduplicated"] == b"1"


async def test_same_dedup_key_in_another_session_is_a_new_message(ingestor: Ingestor) -> None:
    a = await ingestor.ingest(make_message("x", conversation="c1", dedup="same"))
    b = await ingestor.ingest(make_message("x", conversation="c2", dedup="same"))
    assert not b.duplicate and a.message_id != b.message_id


async def test_web_echo_written_in_the_same_script(ingestor: Ingestor, client: aioredis.Redis) -> None:
    msg = make_message("hi", channel="web")
    data = json.dumps({"text": "hi"})
    result = await ingestor.ingest(msg, echo={"type": "user", "data": data})
    entries = await client.xrange(SessionKeys(msg.session_key).web)
    assert [(f[b"type"], f[b"data"]) for _, f in entries] == [
        (b"user", data.encode()),
        (b"status", b'{"status":"queued"}'),
    ]
    assert all(len(f) == 2 for _, f in entries)
    dup = await ingestor.ingest(msg, echo={"type": "user", "data": data})
    assert dup.duplicate and dup.message_id == result.message_id
    assert await client.xlen(SessionKeys(msg.session_key).web) == 2


async def test_ingest_refuses_when_redis_is_unreachable(queue_settings: QueueSettings) -> None:
    dead = async_client("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    try:
        with pytest.raises(QueueUnavailableError):
            await Ingestor(dead, queue_settings).ingest(make_message("lost?"))
    finally:
        await dead.aclose()


async def test_ingest_times_out_with_queue_unavailable(redis_url: str, sync_redis: redis.Redis) -> None:
    settings = QueueSettings(name="sbtest", ingest_timeout_s=0.2)
    client = async_client(redis_url)
    try:
        await client.ping()
        sync_redis.execute_command("CLIENT", "PAUSE", "1000", "WRITE")
        with pytest.raises(QueueUnavailableError):
            await Ingestor(client, settings).ingest(make_message("slow"))
    finally:
        sync_redis.execute_command("CLIENT", "UNPAUSE")
        await client.aclose()


async def test_a_batch_sent_after_an_answered_one_times_out_at_its_own_deadline(
    redis_url: str, sync_redis: redis.Redis
) -> None:
    """A stuck batch times out at its own deadline, not at an earlier batch's; and again after a reconnect."""
    import asyncio

    settings = QueueSettings(name="sbtest", ingest_timeout_s=0.4)
    client = async_client(redis_url)
    ingestor = Ingestor(client, settings)
    loop = asyncio.get_running_loop()
    try:
        assert not (await ingestor.ingest(make_message("answered"))).duplicate
        await asyncio.sleep(0.2)  # the first batch's deadline is 0.2 s from now
        sync_redis.execute_command("CLIENT", "PAUSE", "3000", "WRITE")
        started = loop.time()
        with pytest.raises(QueueUnavailableError):
            await ingestor.ingest(make_message("stuck"))
        assert loop.time() - started >= 0.4, "timed out at the earlier batch's deadline"
        sync_redis.execute_command("CLIENT", "UNPAUSE")
        started = loop.time()
        with pytest.raises(QueueUnavailableError):  # the connection that timed out is dropped; a later stall still
            sync_redis.execute_command("CLIENT", "PAUSE", "3000", "WRITE")  # times out on the next one
            await ingestor.ingest(make_message("stuck again"))
        assert 0.4 <= loop.time() - started < 2.5
    finally:
        sync_redis.execute_command("CLIENT", "UNPAUSE")
        await client.aclose()


async def test_concurrent_ingests_keep_order_and_dedup_within_one_batch(
    ingestor: Ingestor, client: aioredis.Redis
) -> None:
    import asyncio

    msgs = [make_message(f"m{i}") for i in range(20)]
    twin = make_message("twin", dedup=msgs[3].dedup_key)
    results = await asyncio.gather(*(ingestor.ingest(m) for m in [*msgs, twin]))
    keys = SessionKeys(msgs[0].session_key)
    inbox = [i.decode() for i in await client.lrange(keys.inbox, 0, -1)]
    assert inbox == [r.message_id for r in results[:20]]  # submission order is acceptance order
    assert results[20].duplicate and results[20].message_id == results[3].message_id
    assert sum(r.drain_enqueued for r in results) == 1
    assert len(await queued_entries(client, make_message("x").session_key)) == 1


async def test_ingest_survives_a_script_cache_flush(ingestor: Ingestor, client: aioredis.Redis) -> None:
    import asyncio

    first = await ingestor.ingest(make_message("before"))
    await client.script_flush()
    results = await asyncio.gather(*(ingestor.ingest(make_message(f"after{i}")) for i in range(10)))
    assert all(not r.duplicate for r in results)
    inbox = await client.lrange(SessionKeys(make_message("x").session_key).inbox, 0, -1)
    # refused with NOSCRIPT as one batch, sent again one by one in the batch's order: the session's order holds
    assert [i.decode() for i in inbox] == [first.message_id, *(r.message_id for r in results)]


async def test_only_a_platform_messages_call_is_guarded_by_the_one_before_it(ingestor: Ingestor) -> None:
    """The script's KEYS[13] is a platform call's guard in a wave, but a web chat call's web stream: never both."""
    platform = ingestor._script_call(make_message("a"), "sequential", None, False)
    platform.after("guard")
    assert len(platform.keys) == 13 and platform.keys[12] == "guard"
    web = ingestor._script_call(make_message("b"), "sequential", {"type": "user", "data": "{}"}, False)
    stream = web.keys[12]
    with pytest.raises(ValueError, match="KEYS"):
        web.after("guard")
    assert web.keys[12] == stream and "guard" not in web.keys


async def _commands(client: aioredis.Redis) -> dict[str, int]:
    return {name: int(stats["calls"]) for name, stats in (await client.info("commandstats")).items()}


async def _commands_per_message(
    client: aioredis.Redis, ingestor: Ingestor, messages: list[InboundMessage], **kwargs: Any
) -> dict[str, int]:
    """Commands the server ran (inside the ingest script too) for each of ``messages``, after the session's first."""
    await ingestor.ingest(make_message("warm-up", channel=messages[0].conversation.channel), **kwargs)
    before = await _commands(client)
    for message in messages:
        result = await ingestor.ingest(message, **kwargs)
        assert not (result.duplicate or result.limited or result.reused)
    after = await _commands(client)
    after.pop("cmdstat_info", None)
    return {name: calls - before.get(name, 0) for name, calls in after.items() if calls != before.get(name, 0)}


async def test_a_platform_message_costs_one_command_per_write_and_no_limit_commands_without_limits(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings)  # no abuse limits
    calls = await _commands_per_message(client, ingestor, [make_message(f"m{i}") for i in range(4)])
    # per message: the script, the dedup record, the record, the inbox, runnable, sessions, received, meta, two facts,
    # accepted; the drain was pending already
    assert sum(calls.values()) == 4 * 12, calls
    assert not {"cmdstat_get", "cmdstat_hsetnx", "cmdstat_time", "cmdstat_llen", "cmdstat_expire"} & set(calls), calls


async def test_a_web_chat_message_refreshes_no_ttl_and_counts_its_sender_in_a_step_of_its_own(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings, LimitsSettings())  # every abuse limit on, idle TTL on
    echo = {"type": "user", "data": '{"text": "hi"}'}
    messages = [make_message(f"m{i}", channel="web") for i in range(4)]
    calls = await _commands_per_message(client, ingestor, messages, echo=echo, idempotent=True)
    # the 12 above, the retention stamp, the limits (TIME, LLEN, the session meter's read and write), the echo and
    # its status; then the sender meter's own script on the sender's slot (EVALSHA, TIME, its read and write)
    assert sum(calls.values()) == 4 * 23, calls
    assert calls["cmdstat_evalsha"] == 8 and calls["cmdstat_get"] == 8 and calls["cmdstat_time"] == 8, calls
    assert "cmdstat_mget" not in calls and "cmdstat_expire" not in calls, calls


async def test_without_a_per_sender_limit_the_sender_meter_costs_nothing(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings, LimitsSettings(messages_per_sender_per_minute=0))
    echo = {"type": "user", "data": '{"text": "hi"}'}
    messages = [make_message(f"m{i}", channel="web") for i in range(4)]
    calls = await _commands_per_message(client, ingestor, messages, echo=echo, idempotent=True)
    assert sum(calls.values()) == 4 * 19, calls  # the 23 above less the sender meter's script
    assert calls["cmdstat_evalsha"] == 4 and calls["cmdstat_get"] == 4, calls
