"""A platform's ``retry_after`` never holds a worker slot longer than the longest deferral allowed.

Telegram answers a flooding bot with 429 and ``retry_after`` — tens of seconds usually, hours for a bot provoked
into spamming a group. The outbox slept that long up to five times, and the reply send once more, inside the
drain: the session's lease and a worker slot stayed taken for the whole wait (12 sleeps of a day for
``retry_after: 86400``). Like a model provider's ``retry-after``, a platform's wait longer than
``SWITCHBOARD_QUEUE__MAX_DEFER_S`` now fails the send at once (dead-lettered: the turn stays completed, the model is
not re-run); a shorter one is still honoured.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from switchboard.errors import RateLimitedError
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.settings import QueueSettings
from switchboard.worker.drainturn import DrainOutcome
from tests.queue.conftest import make_message
from tests.queue.test_sending import Refusing, Runner, drainer_for


async def test_a_send_never_sleeps_longer_than_the_longest_deferral_in_a_worker(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))
    runner, waits = Runner(), []
    flood_wait = [RateLimitedError("429: Too Many Requests", channel="telegram", retry_after=86_400.0)] * 12
    deliverer = Refusing(list(flood_wait))
    outcome = await drainer_for(client, queue_settings, deliverer, runner, waits).drain_session(session)

    assert outcome is DrainOutcome.RELEASED
    assert runner.calls == 1  # the model is never re-run for it
    assert deliverer.reply_calls == 1 and waits == []  # before: twelve sleeps of 86,400 s
    events = await read_events(client, session)
    kinds = [e["kind"] for e in events]
    assert kinds.count("run_completed") == 1 and "reply_sent" not in kinds and "run_dead_lettered" not in kinds
    (dead,) = [e for e in events if e["kind"] == "send_dead_lettered"]
    assert "telegram asked to wait 86400 s" in dead["reason"], dead
    assert f"SWITCHBOARD_QUEUE__MAX_DEFER_S ({queue_settings.max_defer_s:.0f} s)" in dead["reason"], dead
    assert await client.llen(SessionKeys(session).inbox) == 0


async def test_a_platform_wait_within_the_longest_deferral_is_still_honoured(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    settings = queue_settings.model_copy(update={"max_defer_s": 60.0})
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))
    runner, waits = Runner(), []
    deliverer = Refusing([RateLimitedError("429", channel="telegram", retry_after=60.0), None])
    await drainer_for(client, settings, deliverer, runner, waits).drain_session(session)

    assert runner.calls == 1 and waits == [60.0]
    assert deliverer.texts() == ["answer: hello"]
    kinds = [e["kind"] for e in await read_events(client, session)]
    assert kinds.count("reply_sent") == 1 and "send_dead_lettered" not in kinds


async def test_short_platform_waits_add_up_to_the_longest_deferral_at_most(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    settings = queue_settings.model_copy(update={"max_defer_s": 60.0})
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))
    runner, waits = Runner(), []
    # each wait alone is allowed, but not all of them in a row: a platform cannot hold the slot by splitting a wait
    deliverer = Refusing([RateLimitedError("429", channel="telegram", retry_after=40.0)] * 12)
    await drainer_for(client, settings, deliverer, runner, waits).drain_session(session)

    assert runner.calls == 1
    assert waits == [40.0]  # before: nine sleeps of 40 s (the outbox's and the send loop's waits, uncounted)
    events = await read_events(client, session)
    (dead,) = [e for e in events if e["kind"] == "send_dead_lettered"]
    assert "kept asking to wait (80 s in all)" in dead["reason"], dead
