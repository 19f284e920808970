"""Deployment-wide counters kept in Redis by the scripts that do the work: deferrals, drops, send dead letters.

Before this, ``runs_deferred`` was counted but never read, and neither a platform message dropped by an abuse limit
nor a reply whose send was dead-lettered was counted anywhere ``/metrics`` reads.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from switchboard.queue.ingest import Ingestor
from switchboard.queue.stats import read_stats
from switchboard.settings import LimitsSettings, QueueSettings

from .conftest import RecordingDeliverer, make_message
from .test_defer import Provider, drainer, rate_limited
from .test_sending import Refusing, Runner, drainer_for, refused


def _limits(**values: int) -> LimitsSettings:
    off = dict.fromkeys(LimitsSettings.model_fields, 0)
    return LimitsSettings.model_validate(off | values)


async def test_platform_messages_dropped_by_a_limit_are_counted_and_web_refusals_are_not(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    ingestor = Ingestor(client, queue_settings, _limits(messages_per_session_per_minute=1))
    assert (await ingestor.ingest(make_message("one"))).limited is None
    assert (await ingestor.ingest(make_message("two"))).limited == "session_rate"
    assert (await ingestor.ingest(make_message("three"))).limited == "session_rate"
    web = make_message("w", conversation="web1", channel="web")
    echo = {"type": "user", "data": '{"text":"w"}'}
    assert (await ingestor.ingest(web, echo=echo)).limited is None
    assert (await ingestor.ingest(make_message("w2", conversation="web1", channel="web"), echo=echo)).limited
    stats = await read_stats(client)
    assert stats.messages_dropped == 2  # the web chat's refusal was a 429, not a drop
    assert stats.accepted == 2


async def test_a_dead_lettered_send_is_counted(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))
    await ingestor.ingest(make_message("again"))
    deliverer = Refusing([refused(), None])
    await drainer_for(client, queue_settings, deliverer, Runner(), []).drain_session(session)
    stats = await read_stats(client)
    assert stats.send_dead_letters == 1 and stats.runs_completed == 2 and stats.dead_letters == 0


async def test_a_deferred_turn_is_counted(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))
    await drainer(client, queue_settings, RecordingDeliverer(), Provider(rate_limited(3600))).drain_session(session)
    stats = await read_stats(client)
    assert stats.runs_deferred == 1 and stats.runs_completed == 0
