"""Abuse limits inside the ingest script and the session quota: counted in Redis, refused with nothing written."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.core.events import EventAdapter, MessageDropped
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.queue import limits
from switchboard.queue.connection import async_client
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.settings import LimitsSettings, QueueSettings

from .conftest import make_message

_ECHO = {"type": "user", "data": '{"text":"hi"}'}


def _limits(**values: int) -> LimitsSettings:
    off = dict.fromkeys(LimitsSettings.model_fields, 0)
    return LimitsSettings.model_validate(off | values)


def _from(sender: str, conversation: str, dedup: str | None = None) -> InboundMessage:
    msg = make_message("hi", conversation=conversation, dedup=dedup)
    return msg.model_copy(update={"sender": Sender(id=sender)})


async def _xrange(redis: aioredis.Redis, key: Any) -> list[Any]:
    entries: list[Any] = await redis.xrange(key)  # type: ignore[assignment]
    return entries


async def _dump(client: aioredis.Redis) -> dict[Any, Any]:
    """Every key with its serialised value: equal before and after means nothing was written."""
    return {key: await client.dump(key) for key in sorted(await client.keys("*"))}


async def test_session_rate_refuses_with_retry_after_and_writes_nothing(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(messages_per_session_per_minute=3))
    accepted = [await ingestor.ingest(make_message(f"m{i}"), echo=_ECHO) for i in range(3)]
    assert all(r.limited is None and not r.duplicate for r in accepted)
    before = await _dump(client)
    refused = await ingestor.ingest(make_message("one too many"), echo=_ECHO)
    assert refused.limited == "session_rate" and not refused.drain_enqueued
    assert 0 < refused.retry_after_ms <= 60_000 / 3 + 1
    assert await _dump(client) == before
    # another session is not affected
    other = await ingestor.ingest(make_message("elsewhere", conversation="c2"), echo=_ECHO)
    assert other.limited is None


async def test_platform_drop_is_recorded_as_a_fact_and_nothing_is_queued(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(messages_per_session_per_minute=1))
    first = await ingestor.ingest(make_message("first"))
    keys = SessionKeys(make_message("x").session_key)
    inbox, messages = await client.lrange(keys.inbox, 0, -1), await client.hgetall(keys.messages)
    refused = await ingestor.ingest(make_message("second"))
    assert refused.limited == "session_rate"
    assert await client.lrange(keys.inbox, 0, -1) == inbox == [first.message_id.encode()]
    assert await client.hgetall(keys.messages) == messages
    assert await client.llen(keys.shard.drainq) == 1
    entries = await _xrange(client, keys.events)
    dropped = EventAdapter.validate_json(entries[-1][1][b"data"])
    assert isinstance(dropped, MessageDropped)
    assert (dropped.reason, dropped.channel, dropped.sender) == ("session_rate", "telegram", "u1")
    kinds = [e["kind"] for e in await read_events(client, keys.session)]
    assert kinds == ["message_received", "run_queued", "message_dropped"]


async def test_sender_rate_counts_across_sessions(client: aioredis.Redis, queue_settings: QueueSettings) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(messages_per_sender_per_minute=2))
    assert (await ingestor.ingest(_from("spammer", "c1"))).limited is None
    assert (await ingestor.ingest(_from("spammer", "c2"))).limited is None
    refused = await ingestor.ingest(_from("spammer", "c3"), echo=_ECHO)
    assert refused.limited == "sender_rate" and refused.retry_after_ms > 0
    assert (await ingestor.ingest(_from("someone-else", "c3"))).limited is None


async def test_a_message_ingest_refuses_hands_its_sender_token_back(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    """The sender meter counts before ingest (its own slot); a duplicate or another limit's refusal gives it back."""
    ingestor = Ingestor(client, queue_settings, _limits(messages_per_sender_per_minute=2, inbox_depth=1))
    first = await ingestor.ingest(_from("u", "c1", dedup="e1"))
    assert first.limited is None
    for _ in range(5):  # platform retries: duplicates, each counted and handed back
        assert (await ingestor.ingest(_from("u", "c1", dedup="e1"))).duplicate
    assert (await ingestor.ingest(_from("u", "c1", dedup="e2"))).limited == "inbox_full"  # handed back too
    assert (await ingestor.ingest(_from("u", "c2", dedup="e3"))).limited is None  # the second of two
    assert (await ingestor.ingest(_from("u", "c3", dedup="e4"))).limited == "sender_rate"


async def test_a_retry_over_the_sender_limit_is_still_a_duplicate(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(messages_per_sender_per_minute=1))
    first = await ingestor.ingest(_from("u", "c1", dedup="e1"))
    assert (await ingestor.ingest(_from("u", "c2", dedup="e2"))).limited == "sender_rate"
    retry = await ingestor.ingest(_from("u", "c1", dedup="e1"))
    assert retry.duplicate and retry.limited is None and retry.message_id == first.message_id


async def test_concurrent_messages_of_one_sender_are_counted_exactly(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    """30 messages of one sender into 30 chats at once (one batch of takes): exactly the limit land."""
    ingestor = Ingestor(client, queue_settings, _limits(messages_per_sender_per_minute=10))
    results = await asyncio.gather(*(ingestor.ingest(_from("u", f"c{n}", dedup=f"e{n}")) for n in range(30)))
    assert [r.limited for r in results].count(None) == 10
    assert {r.limited for r in results} == {None, "sender_rate"}
    retries = await asyncio.gather(*(ingestor.ingest(_from("u", f"c{n}", dedup=f"e{n}")) for n in range(30)))
    assert sum(r.duplicate for r in retries) == 10  # the accepted ones; the rest are refused again


async def test_inbox_depth_bounds_the_waiting_messages(client: aioredis.Redis, queue_settings: QueueSettings) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(inbox_depth=2))
    for i in range(2):
        assert (await ingestor.ingest(make_message(f"m{i}"), echo=_ECHO)).limited is None
    before = await _dump(client)
    refused = await ingestor.ingest(make_message("m2"), echo=_ECHO)
    assert refused.limited == "inbox_full" and refused.retry_after_ms > 0
    assert await _dump(client) == before
    # once the drain takes one off the inbox, the next message fits
    await client.lpop(SessionKeys(make_message("x").session_key).inbox)
    assert (await ingestor.ingest(make_message("m3"), echo=_ECHO)).limited is None


async def test_a_retry_of_an_accepted_message_is_a_duplicate_not_a_refusal(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(messages_per_session_per_minute=1, inbox_depth=1))
    first = await ingestor.ingest(make_message("hello", dedup="update-1"))
    assert (await ingestor.ingest(make_message("next"))).limited is not None
    retry = await ingestor.ingest(make_message("hello", dedup="update-1"))
    assert retry.duplicate and retry.limited is None and retry.message_id == first.message_id


async def test_zero_means_no_limit(client: aioredis.Redis, queue_settings: QueueSettings) -> None:
    ingestor = Ingestor(client, queue_settings, _limits())
    results = [await ingestor.ingest(make_message(f"m{i}"), echo=_ECHO) for i in range(150)]
    assert all(r.limited is None for r in results)
    assert await client.llen(SessionKeys(make_message("x").session_key).inbox) == 150
    assert not await client.keys("sb:rate:*") and not await client.keys("*:rate")


async def test_default_limits_apply_when_given_settings(client: aioredis.Redis, queue_settings: QueueSettings) -> None:
    defaults = LimitsSettings()
    ingestor = Ingestor(client, queue_settings, defaults)
    results = [
        await ingestor.ingest(make_message(f"m{i}")) for i in range(defaults.messages_per_session_per_minute + 1)
    ]
    assert [r.limited for r in results].count(None) == defaults.messages_per_session_per_minute
    assert results[-1].limited == "session_rate"


async def test_two_processes_share_the_counters(
    redis_url: str, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    other_client = async_client(redis_url)
    try:
        one = Ingestor(client, queue_settings, _limits(messages_per_session_per_minute=2))
        two = Ingestor(other_client, queue_settings, _limits(messages_per_session_per_minute=2))
        assert (await one.ingest(make_message("a"))).limited is None
        assert (await two.ingest(make_message("b"))).limited is None
        assert (await one.ingest(make_message("c"))).limited == "session_rate"
        assert (await two.ingest(make_message("d"))).limited == "session_rate"
    finally:
        await other_client.aclose()


async def test_a_sender_id_with_odd_characters_is_counted_and_logged_safely(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(messages_per_sender_per_minute=1))
    odd = 'a"b\\c/d\n{e}'
    conv = ConversationRef(agent="assistant", channel="telegram", conversation="c9")
    msg = InboundMessage(dedup_key="e1", conversation=conv, sender=Sender(id=odd), text="x")
    assert (await ingestor.ingest(msg)).limited is None
    refused = await ingestor.ingest(msg.model_copy(update={"dedup_key": "e2"}))
    assert refused.limited == "sender_rate"
    entries = await _xrange(client, SessionKeys(msg.session_key).events)
    assert json.loads(entries[-1][1][b"data"])["sender"] == odd


async def test_session_quota_per_address(client: aioredis.Redis) -> None:
    two = _limits(sessions_per_address_per_hour=2)
    assert await limits.count_session(client, "192.0.2.7", two, timeout_s=1) == 0
    assert await limits.count_session(client, "192.0.2.7", two, timeout_s=1) == 0
    before = await _dump(client)
    wait = await limits.count_session(client, "192.0.2.7", two, timeout_s=1)
    assert 0 < wait <= limits.HOUR_MS // 2 + 1
    assert await _dump(client) == before
    assert await limits.count_session(client, "192.0.2.8", two, timeout_s=1) == 0
    assert await limits.count_session(client, "192.0.2.7", _limits(), timeout_s=1) == 0


async def test_ipv6_addresses_are_counted_per_64(client: aioredis.Redis) -> None:
    one = _limits(sessions_per_address_per_hour=1)
    assert await limits.count_session(client, "2001:db8:1:2::1", one, timeout_s=1) == 0
    assert await limits.count_session(client, "2001:db8:1:2:ffff::9", one, timeout_s=1) > 0
    assert await limits.count_session(client, "2001:db8:1:3::1", one, timeout_s=1) == 0
    assert await client.exists(GlobalKeys().address_rate("2001:db8:1:2::/64"))


@pytest.mark.parametrize(("wait_ms", "seconds"), [(1, 1), (999, 1), (1000, 1), (1001, 2), (59_001, 60)])
def test_retry_after_rounds_up_to_whole_seconds(wait_ms: int, seconds: int) -> None:
    assert limits.retry_after_s(wait_ms) == seconds
