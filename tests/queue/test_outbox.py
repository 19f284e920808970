from __future__ import annotations

import json
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.channels.base import Receipt, SendContext
from switchboard.channels.web.adapter import WebChannel
from switchboard.core.actions import Action, SendText
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError, RateLimitedError
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.outbound.outbox import Outbox, idempotency_key
from switchboard.outbound.webstream import WebStreamPublisher
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease
from switchboard.queue.ledger import Ledger
from switchboard.queue.stats import read_stats
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey
from switchboard.worker.drainturn import DrainOutcome

from .conftest import RecordingDeliverer, make_drainer, make_message


class Crash(BaseException):
    """Stands for the process dying: nothing after it runs."""


async def test_rerun_after_crash_between_send_and_ack_sends_no_duplicate(
    ingestor: Ingestor,
    client: aioredis.Redis,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = make_message("x").session_key
    keys = SessionKeys(session)
    await ingestor.ingest(make_message("hello"))

    real_complete = Ledger.complete

    async def crash(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise Crash

    monkeypatch.setattr(Ledger, "complete", crash)
    with pytest.raises(Crash):
        await make_drainer(client, queue_settings, deliverer).drain_session(session)
    assert deliverer.texts() == ["echo: hello"]
    assert await client.llen(keys.inbox) == 1  # never acked

    # the dead worker's lease expires; another worker re-runs the same turn
    await client.delete(keys.lease)
    monkeypatch.setattr(Ledger, "complete", real_complete)
    again = RecordingDeliverer()
    outcome = await make_drainer(client, queue_settings, again, worker_id="w2").drain_session(session)
    assert outcome is DrainOutcome.RELEASED
    assert again.texts() == []  # the reply was already recorded as sent
    assert await client.llen(keys.inbox) == 0
    assert (await read_stats(client)).send_window_duplicates == 0


async def test_crash_inside_the_send_window_resends_once_and_is_counted(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))

    class DiesAfterSending(RecordingDeliverer):
        async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
            receipt = await super().perform(action, conversation, send)
            if action.kind == "text":
                raise Crash  # the platform got it; the worker died before recording it
            return receipt

    first = DiesAfterSending()
    with pytest.raises(Crash):
        await make_drainer(client, queue_settings, first).drain_session(session)
    await client.delete(SessionKeys(session).lease)
    second = RecordingDeliverer()
    await make_drainer(client, queue_settings, second, worker_id="w2").drain_session(session)
    assert first.texts() == second.texts() == ["echo: hello"]
    keys = [[s.key for s in d.sent if s.action.kind == "text"] for d in (first, second)]
    assert keys[0] == keys[1]  # same idempotency key on the re-run
    assert (await read_stats(client)).send_window_duplicates == 1


async def test_rate_limited_send_is_retried_without_rerunning_the_model(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    runs: list[int] = []
    waits: list[float] = []

    class Limited(RecordingDeliverer):
        refusals = 2

        async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
            if action.kind == "text" and self.refusals:
                self.refusals -= 1
                raise RateLimitedError("429", channel="telegram", retry_after=1.5)
            return await super().perform(action, conversation, send)

    async def runner(request, sink, store):  # type: ignore[no-untyped-def]
        from .conftest import echo_runner

        runs.append(1)
        return await echo_runner(request, sink, store)

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)

    from switchboard.worker.drain import Drainer

    from .conftest import agent_for

    deliverer = Limited()
    await ingestor.ingest(make_message("hi"))
    drainer = Drainer(
        client,
        queue_settings,
        runner=runner,
        deliverer=deliverer,
        agent_for=agent_for,
        worker_id="w1",
        sleep=fake_sleep,
    )
    await drainer.drain(make_message("x").session_key)
    assert len(runs) == 1 and waits == [1.5, 1.5]
    assert deliverer.texts() == ["echo: hi"]


async def test_failed_send_drops_its_claim(client: aioredis.Redis) -> None:
    session = make_message("x").session_key
    lease = await Lease(client, worker_id="w1", lease_ms=10_000).acquire(session)
    assert lease is not None
    conv = make_message("x").conversation

    async def refuse(action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        raise DeliveryError("bad chat", channel="telegram", retryable=False)

    outbox = Outbox(client, lease, refuse)
    with pytest.raises(DeliveryError):
        await outbox.send(SendText(text="x"), conv, run_id="run-1", logical="reply")
    assert await client.hexists(SessionKeys(session).outbox, idempotency_key("run-1", "reply")) == 0


def test_idempotency_key_is_stable_and_distinct() -> None:
    assert idempotency_key("r", "reply") == idempotency_key("r", "reply", 0)
    assert len({idempotency_key("r", "reply"), idempotency_key("r", "reply", 1), idempotency_key("s", "reply")}) == 3


def _web_deliverer(client: aioredis.Redis, crash: str | None = None) -> ChannelDeliverer:
    """The web chat's real delivery path; ``crash`` kills the worker right ``before`` or ``after`` the reply's write."""
    publisher = WebStreamPublisher(client)

    async def publish(session: SessionKey, type: str, data: dict[str, Any]) -> str:
        if type == "message" and crash == "before":
            raise Crash
        entry = await publisher.publish(session, type, data)
        if type == "message" and crash == "after":
            raise Crash
        return entry

    return ChannelDeliverer({("web", "default"): WebChannel(publish)})


async def _web_replies(client: aioredis.Redis, session: SessionKey) -> list[str]:
    entries: Any = await client.xrange(SessionKeys(session).web)
    return [json.loads(f[b"data"])["text"] for _id, f in entries if f[b"type"] == b"message"]


@pytest.mark.parametrize("crash", ["after", "before"])
async def test_a_web_reply_is_delivered_exactly_once_across_a_crash(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, crash: str
) -> None:
    """The web chat's delivery is a Redis write: appended and recorded in one script, no send window to count."""
    message = make_message("hello", channel="web")
    session = message.session_key
    await ingestor.ingest(message)
    with pytest.raises(Crash):
        await make_drainer(client, queue_settings, _web_deliverer(client, crash)).drain_session(session)  # type: ignore[arg-type]
    await client.delete(SessionKeys(session).lease)  # the dead worker's lease expires
    outcome = await make_drainer(client, queue_settings, _web_deliverer(client), worker_id="w2").drain_session(session)  # type: ignore[arg-type]
    assert outcome is DrainOutcome.RELEASED
    assert await _web_replies(client, session) == ["echo: hello"]
    assert (await read_stats(client)).send_window_duplicates == 0
    assert await client.llen(SessionKeys(session).inbox) == 0 and await client.exists(SessionKeys(session).outbox) == 0
