"""A model provider's ``retry-after`` defers the turn (no tight retry loop), and failures say what kind they were.

Before this, a 429 with ``retry-after: 3600`` was retried ``max_attempts`` times within a second and dead-lettered,
and every failure told the user only "Sorry, this message could not be answered".
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.errors import BudgetExceededError, ModelError
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.reaper import Reaper
from switchboard.settings import QueueSettings
from switchboard.worker.drain import Drainer
from switchboard.worker.drainturn import DrainOutcome

from .conftest import RecordingDeliverer, agent_for, make_message

_GLOBAL = GlobalKeys()


class Provider:
    """A runner whose model provider fails with ``errors`` in turn, then answers."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls: list[float] = []

    async def __call__(self, request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        self.calls.append(time.time())
        if self.errors:
            raise self.errors.pop(0)
        return TurnResult(text="answer: " + request.messages[-1].text, steps=1)


def drainer(
    client: aioredis.Redis, settings: QueueSettings, deliverer: RecordingDeliverer, runner: Provider
) -> Drainer:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    return Drainer(
        client, settings, runner=runner, deliverer=deliverer, agent_for=agent_for, worker_id="w1", sleep=sleep
    )


def rate_limited(wait: float) -> ModelError:
    return ModelError("openai: rate limited: slow down", retryable=True, retry_after=wait, code="rate_limit")


async def sweep(client: aioredis.Redis, settings: QueueSettings) -> int:
    await client.delete(_GLOBAL.reaper_lock)
    return await Reaper(client, settings, worker_id="w1").sweep()


async def test_a_provider_retry_after_defers_the_turn_and_tells_the_user_once(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    session = make_message("x").session_key
    keys = SessionKeys(session)
    message_id = (await ingestor.ingest(make_message("hello"))).message_id
    runner, deliverer = Provider(rate_limited(3600), rate_limited(3600)), RecordingDeliverer()
    before = time.time()

    outcome = await drainer(client, queue_settings, deliverer, runner).drain_session(session)

    assert outcome is DrainOutcome.DEFERRED
    assert len(runner.calls) == 1  # not three attempts within a second
    due = await client.zscore(SessionKeys(session).shard.deferred, session)
    assert due is not None and before + 3600 <= due <= time.time() + 3600
    events = await read_events(client, session)
    deferred = [e for e in events if e["kind"] == "run_deferred"]
    assert len(deferred) == 1 and abs(deferred[0]["until"] - due) < 0.01 and "rate limited" in deferred[0]["reason"]
    assert "run_failed" not in [e["kind"] for e in events]
    assert deliverer.texts() == [
        "The AI model provider is rate-limiting us; your message will be answered in about 60 minutes."
    ]
    assert deliverer.texts("error") == []  # a notice, not an error that ends the reply
    assert await client.llen(keys.inbox) == 1 and await client.exists(keys.lease) == 0
    assert int(await client.hget(keys.attempts, message_id) or 0) == 0  # handed back: not a failure

    # the reaper leaves it alone while the wait lasts, even with its drain flag gone
    await client.delete(keys.drain)
    assert await sweep(client, queue_settings) == 0
    # a drain that starts early anyway gives the session back without running anything
    early = await drainer(client, queue_settings, deliverer, runner).drain_session(session)
    assert early is DrainOutcome.DEFERRED and len(runner.calls) == 1

    # once due, the reaper gives it a drain job; the provider still limits: deferred again, the user not told twice
    await client.zadd(SessionKeys(session).shard.deferred, {session: time.time() - 1})
    assert await sweep(client, queue_settings) == 1
    again = await drainer(client, queue_settings, deliverer, runner).drain_session(session)
    assert again is DrainOutcome.DEFERRED and len(runner.calls) == 2 and len(deliverer.texts()) == 1

    await client.zadd(SessionKeys(session).shard.deferred, {session: time.time() - 1})
    done = await drainer(client, queue_settings, deliverer, runner).drain_session(session)
    assert done is DrainOutcome.RELEASED and len(runner.calls) == 3
    assert deliverer.texts()[-1] == "answer: hello"
    assert await client.zscore(SessionKeys(session).shard.deferred, session) is None
    assert await client.exists(keys.attempts) == 0
    kinds = [e["kind"] for e in await read_events(client, session)]
    assert kinds.count("run_deferred") == 2 and kinds.count("run_completed") == 1 and "run_failed" not in kinds


async def test_a_wait_longer_than_max_defer_fails_the_message_at_once_with_a_clear_reason(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    settings = queue_settings.model_copy(update={"max_defer_s": 900.0})
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))
    runner, deliverer = Provider(rate_limited(3600)), RecordingDeliverer()
    await drainer(client, settings, deliverer, runner).drain_session(session)

    assert len(runner.calls) == 1
    dead = [e for e in await read_events(client, session) if e["kind"] == "run_dead_lettered"]
    assert len(dead) == 1 and "MAX_DEFER_S" in dead[0]["reason"] and "3600" in dead[0]["reason"]
    [notice] = [s.action for s in deliverer.sent if s.action.kind == "error"]
    assert "model provider is not answering" in notice.message and "will not be retried" in notice.message  # type: ignore[union-attr]


async def test_failure_notices_name_the_kind_of_failure_and_leak_nothing(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    secret = "sk-live-0123456789abcdef"
    failures: dict[str, Exception] = {
        "misconfigured": ModelError(f"openai: 401 invalid key {secret}", code="auth"),
        "not answering": ModelError(f"openai: 503 from https://internal.example/{secret}", retryable=True),
        "time or work": BudgetExceededError(f"step budget 8 exhausted ({secret})", budget="steps"),
        "internal error": RuntimeError(f"KeyError in tool: {secret}"),
    }
    for i, (words, err) in enumerate(failures.items()):
        message = make_message(f"m{i}", conversation=f"c{i}")
        await ingestor.ingest(message)
        runner, deliverer = Provider(*[err] * queue_settings.max_attempts), RecordingDeliverer()
        await drainer(client, queue_settings, deliverer, runner).drain_session(message.session_key)
        [notice] = [s.action for s in deliverer.sent if s.action.kind == "error"]
        text = notice.message  # type: ignore[union-attr]
        assert words in text and "will not be retried" in text, text
        assert secret not in text and "Sorry, this message could not be answered" not in text
        dead = [e for e in await read_events(client, message.session_key) if e["kind"] == "run_dead_lettered"]
        assert secret in dead[0]["reason"]  # the operators' record keeps the detail


async def test_a_short_provider_wait_defers_quietly(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))
    runner, deliverer = Provider(rate_limited(5)), RecordingDeliverer()
    assert await drainer(client, queue_settings, deliverer, runner).drain_session(session) is DrainOutcome.DEFERRED
    assert deliverer.texts() == []  # five seconds are not worth a notice
    due = await client.zscore(SessionKeys(session).shard.deferred, session)
    assert due is not None and due - time.time() <= 5
