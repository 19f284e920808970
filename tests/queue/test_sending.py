"""A finished turn's reply is retried on its own: a refused or failing send never re-runs the model.

Before this, the drain treated a failed reply send like a failed run: a permanent platform refusal re-ran the model
``max_attempts`` times (one ``usage_metered`` each) before the dead letter.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from switchboard.channels.base import Receipt, SendContext
from switchboard.core.actions import Action
from switchboard.core.events import UsageMetered
from switchboard.core.messages import ConversationRef
from switchboard.core.turn import HistoryEntry, SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.errors import DeliveryError, RateLimitedError
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.stats import read_stats
from switchboard.settings import QueueSettings
from switchboard.worker.drain import Drainer
from switchboard.worker.drainturn import DrainOutcome

from .conftest import RecordingDeliverer, agent_for, make_message


class Crash(BaseException):
    """Stands for the process dying: nothing after it runs."""


class Runner:
    """Answers like a model would, and meters one usage per run (what a re-run would double)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        self.calls += 1
        await sink.event(UsageMetered(model="m", steps=1, tool_calls=0, input_tokens=10, output_tokens=5, credits=0.25))
        return TurnResult(text="answer: " + request.messages[-1].text, steps=1)


class Refusing(RecordingDeliverer):
    """Refuses the reply (``kind == "text"``) according to ``plan``: an error per call, ``None`` delivers it."""

    def __init__(self, plan: list[DeliveryError | None]) -> None:
        super().__init__()
        self.plan = plan
        self.reply_calls = 0

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        if action.kind == "text":
            self.reply_calls += 1
            error = self.plan.pop(0) if self.plan else None
            if error is not None:
                raise error
        return await super().perform(action, conversation, send)


def drainer_for(
    client: aioredis.Redis,
    settings: QueueSettings,
    deliverer: RecordingDeliverer,
    runner: Runner,
    waits: list[float],
    *,
    worker_id: str = "w1",
) -> Drainer:
    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    return Drainer(
        client, settings, runner=runner, deliverer=deliverer, agent_for=agent_for, worker_id=worker_id, sleep=sleep
    )


def refused() -> DeliveryError:
    text = "telegram refused sendMessage: 400 Bad Request: chat not found"
    return DeliveryError(text, channel="telegram", retryable=False)


def unavailable() -> DeliveryError:
    return DeliveryError("telegram: 502 Bad Gateway", channel="telegram", retryable=True)


async def test_a_permanently_refused_reply_is_dead_lettered_without_rerunning_the_model(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    session = make_message("x").session_key
    keys = SessionKeys(session)
    await ingestor.ingest(make_message("hello"))
    runner, waits = Runner(), []
    deliverer = Refusing([refused()])
    outcome = await drainer_for(client, queue_settings, deliverer, runner, waits).drain_session(session)

    assert outcome is DrainOutcome.RELEASED
    assert runner.calls == 1 and deliverer.reply_calls == 1 and waits == []
    events = await read_events(client, session)
    kinds = [e["kind"] for e in events]
    assert kinds.count("usage_metered") == 1
    assert kinds.count("run_completed") == 1 and "run_failed" not in kinds and "run_dead_lettered" not in kinds
    dead = [e for e in events if e["kind"] == "send_dead_lettered"]
    assert len(dead) == 1 and dead[0]["attempts"] == 1 and "chat not found" in dead[0]["reason"], dead
    assert "reply_sent" not in kinds
    assert deliverer.texts("error") == ["undelivered"]  # told (best effort) that the reply could not be delivered
    assert await client.llen(keys.inbox) == 0 and await client.exists(keys.outbox, keys.dead) == 0
    history = [HistoryEntry.model_validate_json(h) for h in await client.lrange(keys.history, 0, -1)]
    assert [(h.role, h.text) for h in history] == [("user", "hello"), ("assistant", "answer: hello")]
    stats = await read_stats(client)
    assert stats.runs_completed == 1 and stats.runs_failed == 0 and stats.dead_letters == 0


async def test_a_failing_send_is_retried_with_back_off_and_delivered_once(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    settings = queue_settings.model_copy(update={"send_backoff_s": 0.5, "send_max_attempts": 5})
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))
    runner, waits = Runner(), []
    # a 502, then six 429s in a row (the outbox itself honours five of them), then delivered
    limited = [RateLimitedError("429", channel="telegram", retry_after=7.0) for _ in range(6)]
    deliverer = Refusing([unavailable(), *limited, None])
    await drainer_for(client, settings, deliverer, runner, waits).drain_session(session)

    assert runner.calls == 1
    assert deliverer.texts() == ["answer: hello"]
    # back-off 0.5 after the 502; the outbox honours five 429s (7 s each), then the send waits 7 s (> 1.0 back-off)
    assert waits == [0.5, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0]
    kinds = [e["kind"] for e in await read_events(client, session)]
    assert kinds.count("usage_metered") == 1 and kinds.count("reply_sent") == 1 and kinds.count("run_completed") == 1
    assert "run_failed" not in kinds and "send_dead_lettered" not in kinds
    assert (await read_stats(client)).send_window_duplicates == 0


async def test_a_send_that_keeps_failing_is_dead_lettered_after_its_own_attempts(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    settings = queue_settings.model_copy(update={"send_backoff_s": 1.0, "send_max_attempts": 4})
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))
    runner, waits = Runner(), []
    deliverer = Refusing([unavailable() for _ in range(10)])
    await drainer_for(client, settings, deliverer, runner, waits).drain_session(session)

    assert runner.calls == 1 and deliverer.reply_calls == 4 and waits == [1.0, 2.0, 4.0]
    events = await read_events(client, session)
    dead = [e for e in events if e["kind"] == "send_dead_lettered"]
    assert len(dead) == 1 and dead[0]["attempts"] == 4 and "502" in dead[0]["reason"]
    assert [e["kind"] for e in events].count("run_completed") == 1


async def test_a_new_worker_resumes_a_pending_send_without_rerunning_the_model(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    settings = queue_settings.model_copy(update={"send_backoff_s": 2.0, "send_max_attempts": 5})
    session = make_message("x").session_key
    keys = SessionKeys(session)
    await ingestor.ingest(make_message("hello"))
    await ingestor.ingest(make_message("after"))
    runner = Runner()
    backing_off = asyncio.Event()

    async def stalls(seconds: float) -> None:
        backing_off.set()
        await asyncio.Event().wait()  # the worker is stopped while backing off before the second send attempt

    first = Refusing([unavailable()])
    doomed = Drainer(
        client, settings, runner=runner, deliverer=first, agent_for=agent_for, worker_id="w1", sleep=stalls
    )
    task = asyncio.create_task(doomed.drain_session(session))
    await asyncio.wait_for(backing_off.wait(), timeout=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert runner.calls == 1 and first.reply_calls == 1 and first.texts() == []
    assert await client.llen(keys.inbox) == 2  # the turn is not acked: nothing behind it can overtake the reply

    assert await client.exists(keys.lease) == 0  # given up at shutdown
    second, waits = Refusing([unavailable(), None]), []
    outcome = await drainer_for(client, settings, second, runner, waits, worker_id="w2").drain_session(session)
    assert outcome is DrainOutcome.RELEASED
    assert runner.calls == 2  # once for "hello" (not re-run), once for "after"
    assert second.texts() == ["answer: hello", "answer: after"]  # resumed first, in order
    assert waits == [4.0]  # the third send attempt overall: back-off 2 × 2²⁻¹, counted across the restart
    events = await read_events(client, session)
    kinds = [e["kind"] for e in events]
    assert kinds.count("usage_metered") == 2 and kinds.count("reply_sent") == 2 and kinds.count("run_completed") == 2
    assert await client.exists(keys.outbox) == 0
    assert (await read_stats(client)).send_window_duplicates == 0


async def test_a_worker_killed_in_the_send_window_resends_without_rerunning_the_model(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))
    runner = Runner()

    class DiesAfterSending(RecordingDeliverer):
        async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
            receipt = await super().perform(action, conversation, send)
            if action.kind == "text":
                raise Crash  # the platform got it; the worker died before recording it
            return receipt

    first = DiesAfterSending()
    with pytest.raises(Crash):
        await drainer_for(client, queue_settings, first, runner, []).drain_session(session)
    await client.delete(SessionKeys(session).lease)
    second = RecordingDeliverer()
    await drainer_for(client, queue_settings, second, runner, [], worker_id="w2").drain_session(session)
    assert runner.calls == 1
    assert first.texts() == second.texts() == ["answer: hello"]
    assert (await read_stats(client)).send_window_duplicates == 1  # the HTTP send window stays counted
    kinds = [e["kind"] for e in await read_events(client, session)]
    assert kinds.count("usage_metered") == 1 and kinds.count("run_completed") == 1


class Broken(RecordingDeliverer):
    """A channel whose every send for the message ``bad`` raises what no adapter declares (a plain ``ValueError``)."""

    def __init__(self, bad: str) -> None:
        super().__init__()
        self.bad = bad
        self.raised = 0

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        if getattr(action, "reply_to", None) == self.bad:
            self.raised += 1
            raise ValueError("URL should be absolute")
        return await super().perform(action, conversation, send)


async def test_any_exception_of_a_send_dead_letters_the_reply_and_the_session_goes_on(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    first, second = make_message("first"), make_message("second")
    session = first.session_key
    bad = (await ingestor.ingest(first)).message_id
    await ingestor.ingest(second)
    runner, waits = Runner(), []
    deliverer = Broken(bad)
    outcome = await drainer_for(client, queue_settings, deliverer, runner, waits).drain_session(session)

    assert outcome is DrainOutcome.RELEASED  # before: the ValueError escaped the drain, again at every drain
    assert runner.calls == 2 and deliverer.texts() == ["answer: second"]
    # status, reply (every attempt) and the "undelivered" notice all raised, and each was handled
    assert deliverer.raised >= queue_settings.send_max_attempts + 2
    events = await read_events(client, session)
    (dead,) = [e for e in events if e["kind"] == "send_dead_lettered"]
    assert dead["message_id"] == bad and dead["attempts"] == queue_settings.send_max_attempts, dead
    assert "failed unexpectedly (ValueError)" in dead["reason"], dead
    kinds = [e["kind"] for e in events]
    assert kinds.count("run_completed") == 2 and "run_failed" not in kinds and "run_dead_lettered" not in kinds
    assert await client.llen(SessionKeys(session).inbox) == 0
