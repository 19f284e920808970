"""Retention of web chat sessions: every key expires after an idle TTL, and the web stream keeps to a byte budget.

Before this, only a web chat token expired: the session's inbox, history, events, meta and web stream (up to 1,000
entries of up to 32 KiB of text each) were kept forever, and the embedded server has no eviction.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis.asyncio as aioredis

from switchboard.channels.web.adapter import WebChannel
from switchboard.core.messages import InboundMessage
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.errors import FencedWriteError
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.outbound.webstream import WebStreamPublisher
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import CURRENT_LEASE, Lease, fenced_xadd
from switchboard.settings import LimitsSettings, QueueSettings
from switchboard.types import SessionKey
from tests.waiting import wait_until

from .conftest import RecordingDeliverer, make_drainer, make_message

_OWN_TTL = ("dedup:", ":rate", ":lease", ":cancel", ":effect:")
"""Keys that always carried their own short TTL."""
_SLACK_S = 3600 // 8
"""How long past the idle TTL of 3600 s a message's refresh may keep the keys (an eighth of it)."""


def _limits(**values: int) -> LimitsSettings:
    """No abuse limits (these tests send many messages fast); retention as given."""
    off = {"messages_per_session_per_minute": 0, "messages_per_sender_per_minute": 0, "inbox_depth": 0}
    return LimitsSettings.model_validate(off | values)


def _web(text: str, conversation: str = "w1") -> InboundMessage:
    return make_message(text, conversation=conversation, channel="web")


def _echo(text: str) -> dict[str, str]:
    return {"type": "user", "data": json.dumps({"text": text})}


async def _ttls(client: aioredis.Redis, session: SessionKey) -> dict[str, int]:
    """Every key of the session (its hash tag) with its TTL in seconds (-1: none)."""
    keys = [k.decode() if isinstance(k, bytes) else k for k in await client.keys(f"*<{session}>*")]
    return {k: await client.ttl(k) for k in keys}


async def test_every_key_of_a_web_session_gets_the_idle_ttl_when_a_message_arrives(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(idle_session_ttl_s=3600))
    await ingestor.ingest(_web("hello"), echo=_echo("hello"))
    ttls = await _ttls(client, _web("x").session_key)
    session_keys = SessionKeys(_web("x").session_key)
    assert {session_keys.inbox, session_keys.messages, session_keys.meta, session_keys.web} <= set(ttls)
    retained = {k: t for k, t in ttls.items() if not any(m in k for m in _OWN_TTL)}
    assert retained and all(3600 <= t <= 3600 + _SLACK_S for t in retained.values()), retained


async def _calls(client: aioredis.Redis, command: str) -> int:
    stats = await client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_message_refreshes_the_idle_ttl_only_once_per_slack_yet_every_key_it_creates_gets_it(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(idle_session_ttl_s=3600))
    keys = SessionKeys(_web("x").session_key)
    await ingestor.ingest(_web("first"), echo=_echo("first"))
    await client.delete(keys.inbox, keys.messages, keys.drain)  # as a drain leaves them: emptied, gone
    before = await _calls(client, "pexpire") + await _calls(client, "expire")
    await ingestor.ingest(_web("second"), echo=_echo("second"))
    await ingestor.ingest(_web("third"), echo=_echo("third"))
    refreshed = await _calls(client, "pexpire") + await _calls(client, "expire") - before
    assert refreshed == 3  # the new inbox, messages and drain flag once: no key of the session twice
    ttls = await _ttls(client, keys.session)
    retained = {k: t for k, t in ttls.items() if not any(m in k for m in _OWN_TTL)}
    assert {keys.inbox, keys.messages, keys.drain, keys.meta, keys.web} <= set(retained)
    assert all(3600 - 5 <= t <= 3600 + _SLACK_S for t in retained.values()), retained

    await client.hset(keys.meta, "retained_at", 0)  # the last refresh is older than the slack: all of them again
    await ingestor.ingest(_web("fourth"), echo=_echo("fourth"))
    assert await _calls(client, "pexpire") + await _calls(client, "expire") - before - refreshed == 12


async def test_the_keys_a_turn_creates_get_the_idle_ttl_too(
    client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(idle_session_ttl_s=3600))
    session = _web("x").session_key
    keys = SessionKeys(session)
    for i in range(3):
        await ingestor.ingest(_web(f"m{i}"), echo=_echo(f"m{i}"))
    await make_drainer(client, queue_settings, deliverer).drain_session(session)
    ttls = await _ttls(client, session)
    assert {keys.history, keys.epoch, keys.events, keys.meta, keys.web} <= set(ttls)
    assert all(0 < t <= 3600 + _SLACK_S for k, t in ttls.items() if not any(m in k for m in _OWN_TTL)), ttls


async def test_a_web_session_idle_past_its_ttl_is_gone_and_a_new_message_starts_afresh(
    client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(idle_session_ttl_s=1))
    session = _web("x").session_key
    await ingestor.ingest(_web("hello"), echo=_echo("hello"))
    await make_drainer(client, queue_settings, deliverer).drain_session(session)
    assert deliverer.texts() == ["echo: hello"]

    async def gone() -> bool:
        return not [k for k in await _ttls(client, session) if "dedup:" not in k]

    await wait_until(gone, "the session's keys gone", timeout=15)
    await ingestor.ingest(_web("again"), echo=_echo("again"))
    await make_drainer(client, queue_settings, deliverer).drain_session(session)
    assert deliverer.texts() == ["echo: hello", "echo: again"]


async def test_platform_sessions_keep_their_keys(
    client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(idle_session_ttl_s=3600))
    message = make_message("hello")  # telegram
    await ingestor.ingest(message)
    await make_drainer(client, queue_settings, deliverer).drain_session(message.session_key)
    keys = SessionKeys(message.session_key)
    ttls = await _ttls(client, message.session_key)
    assert ttls[keys.history] == -1 and ttls[keys.meta] == -1 and ttls[keys.events] == -1


async def test_an_idle_ttl_of_zero_keeps_a_web_session_forever_again(
    client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    session = _web("x").session_key
    await Ingestor(client, queue_settings, _limits(idle_session_ttl_s=3600)).ingest(_web("a"), echo=_echo("a"))
    await make_drainer(client, queue_settings, deliverer).drain_session(session)
    await Ingestor(client, queue_settings, _limits(idle_session_ttl_s=0)).ingest(_web("b"), echo=_echo("b"))
    await make_drainer(client, queue_settings, deliverer).drain_session(session)
    ttls = await _ttls(client, session)
    assert SessionKeys(session).history in ttls
    assert all(t == -1 for k, t in ttls.items() if not any(m in k for m in _OWN_TTL)), ttls


async def test_an_epoch_counter_that_expired_never_hands_out_an_earlier_epoch_again(client: aioredis.Redis) -> None:
    session = _web("x").session_key
    keys = SessionKeys(session)
    lease = Lease(client, worker_id="w1", lease_ms=10_000)
    first = await lease.acquire(session)
    assert first is not None
    await client.delete(keys.lease)  # the holder stalls past its lease ...
    await client.delete(keys.epoch)  # ... and the idle session's keys expire meanwhile
    started = await client.time()
    while await client.time() < (started[0], started[1] + 1000):  # expiry takes the idle TTL: at least a millisecond
        await asyncio.sleep(0.0005)
    second = await Lease(client, worker_id="w2", lease_ms=10_000).acquire(session)
    assert second is not None and second.epoch > first.epoch
    try:
        await fenced_xadd(client, first, keys.events, {"kind": "stale"}, 100)
    except FencedWriteError:
        pass
    else:
        raise AssertionError("a write under the expired epoch passed the fence")


async def test_the_web_stream_keeps_within_its_byte_budget_at_ingest(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(web_history_kib=256))
    session = _web("x").session_key
    for i in range(60):
        text = f"{i:03d}" + "x" * 30_000
        await ingestor.ingest(_web(text), echo=_echo(text))
    web = SessionKeys(session).web
    used = await client.memory_usage(web, samples=0)
    assert used is not None and used <= 256 * 1024
    entries: Any = await client.xrange(web)
    texts = [json.loads(f[b"data"]).get("text", "") for _id, f in entries if f[b"type"] == b"user"]
    assert texts and texts[-1].startswith("059")  # the newest is kept; the oldest went


class _LongReplies:
    async def __call__(self, request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        return TurnResult(text=request.messages[-1].text + "y" * 30_000, steps=1)


async def test_the_web_stream_keeps_within_its_byte_budget_as_replies_are_delivered(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits())
    session = _web("x").session_key
    for i in range(20):
        await ingestor.ingest(_web(f"{i:03d}"), echo=_echo(f"{i:03d}"))
    publisher = WebStreamPublisher(client, max_bytes=128 * 1024)
    web_deliverer = ChannelDeliverer({("web", "default"): WebChannel(publisher.publish)})
    drainer = make_drainer(client, queue_settings, web_deliverer, runner=_LongReplies())  # type: ignore[arg-type]
    await drainer.drain_session(session)
    web = SessionKeys(session).web
    used = await client.memory_usage(web, samples=0)
    assert used is not None and used <= 128 * 1024
    entries: Any = await client.xrange(web)
    replies = [json.loads(f[b"data"])["text"] for _id, f in entries if f[b"type"] == b"message"]
    assert replies and replies[-1].startswith("019")


async def test_worker_writes_outside_a_send_keep_to_the_budget(client: aioredis.Redis) -> None:
    session = _web("x").session_key
    lease = await Lease(client, worker_id="w1", lease_ms=10_000).acquire(session)
    assert lease is not None
    publisher = WebStreamPublisher(client, max_bytes=128 * 1024)
    token = CURRENT_LEASE.set(lease)
    try:
        for i in range(30):
            await publisher.publish(session, "reply_error", {"message": f"{i:03d}" + "z" * 30_000})
    finally:
        CURRENT_LEASE.reset(token)
    used = await client.memory_usage(SessionKeys(session).web, samples=0)
    assert used is not None and used <= 128 * 1024


async def test_a_turn_right_after_a_refresh_refreshes_nothing_yet_a_history_it_begins_gets_the_ttl(
    client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(idle_session_ttl_s=3600))
    session = _web("x").session_key
    keys = SessionKeys(session)
    await ingestor.ingest(_web("first"), echo=_echo("first"))  # the session's first message refreshes every key
    before = await _calls(client, "pexpire") + await _calls(client, "expire")
    await make_drainer(client, queue_settings, deliverer).drain_session(session)
    # the turn's begin and completion refresh nothing (the slack is not over); the epoch counter and the history
    # this turn created get the TTL at once
    assert await _calls(client, "pexpire") + await _calls(client, "expire") - before == 2
    ttls = await _ttls(client, session)
    assert all(0 < ttls[k] <= 3600 + _SLACK_S for k in (keys.history, keys.epoch)), ttls

    await client.hset(keys.meta, "retained_at", 0)  # the last refresh is older than the slack: a turn refreshes
    await ingestor.ingest(_web("second"), echo=_echo("second"))
    await client.hset(keys.meta, "retained_at", 0)
    before = await _calls(client, "pexpire") + await _calls(client, "expire")
    await make_drainer(client, queue_settings, deliverer).drain_session(session)
    assert await _calls(client, "pexpire") + await _calls(client, "expire") - before == 12


async def test_slots_and_dead_letters_a_turn_creates_get_the_idle_ttl(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(idle_session_ttl_s=3600))
    session = _web("x").session_key
    keys = SessionKeys(session)
    await ingestor.ingest(_web("poison"), echo=_echo("poison"))

    async def saves_then_fails(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        await store.save_slot("plan", {"step": 1})
        raise RuntimeError("boom")

    settings = queue_settings.model_copy(update={"max_attempts": 1})
    await make_drainer(client, settings, RecordingDeliverer(), runner=saves_then_fails).drain_session(session)
    assert await client.llen(keys.dead) == 1  # dead-lettered after its one attempt
    ttls = await _ttls(client, session)
    assert all(0 < ttls[k] <= 3600 + _SLACK_S for k in (keys.slots, keys.dead)), ttls
