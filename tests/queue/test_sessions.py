from __future__ import annotations

import redis.asyncio as aioredis

from switchboard.channels.base import Capabilities, Receipt, SendContext
from switchboard.control.reading import session_views, sessions_in_scope
from switchboard.control.scope import OperatorScope
from switchboard.core.actions import Action, SendText
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError
from switchboard.outbound.deliver import NO_CHANNEL, ChannelDeliverer
from switchboard.outbound.outbox import Ephemeral
from switchboard.queue.ingest import Ingestor
from switchboard.queue.lease import Lease
from switchboard.queue.sessions import timeline
from switchboard.queue.stats import QUEUE_WAIT_BUCKETS, bucket_field, read_stats
from switchboard.settings import QueueSettings

from .conftest import RecordingDeliverer, make_drainer, make_message


async def test_list_sessions_and_timeline(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    await ingestor.ingest(make_message("a", conversation="done"))
    await make_drainer(client, queue_settings, deliverer).drain(make_message("x", conversation="done").session_key)
    await ingestor.ingest(make_message("b", conversation="waiting"))
    await ingestor.ingest(make_message("c", conversation="busy", channel="web"))
    busy = make_message("x", conversation="busy", channel="web").session_key
    assert await Lease(client, worker_id="w", lease_ms=10_000).acquire(busy)

    everything = OperatorScope.everything("test")
    listed = await session_views(client, await sessions_in_scope(client, everything, 50))
    sessions = {s.key.split("/")[-1]: s for s in listed}
    assert {k: (v.state, v.inbox_depth) for k, v in sessions.items()} == {
        "done": ("done", 0),
        "waiting": ("queued", 1),
        "busy": ("reasoning", 1),
    }
    assert sessions["busy"].channel == "web" and sessions["done"].received == 1
    assert [s.split("/")[-1] for s in await sessions_in_scope(client, everything, 1)] == ["busy"]

    events = await timeline(client, sessions["done"].key)
    assert [e["kind"] for e in events] == [
        "message_received",
        "run_queued",
        "run_started",
        "reply_sent",
        "run_completed",
    ]
    assert all(e["ts"] > 0 and e["id"] for e in events)
    assert events[0]["chars"] == 1 and "text" not in events[0]  # facts, never message bodies
    assert len(await timeline(client, sessions["done"].key, count=2)) == 2


async def test_read_stats_on_an_empty_database(client: aioredis.Redis) -> None:
    stats = await read_stats(client)
    assert stats.accepted == 0 and stats.queue_wait.count == 0
    assert stats.queue_wait.buckets[-1] == (float("inf"), 0)
    assert len(stats.run_duration.buckets) == 14


def test_bucket_field() -> None:
    assert bucket_field(0.0, QUEUE_WAIT_BUCKETS) == "le:0.005"
    assert bucket_field(0.3, QUEUE_WAIT_BUCKETS) == "le:0.5"
    assert bucket_field(1e9, QUEUE_WAIT_BUCKETS) == "le:+Inf"


async def test_channel_deliverer_routes_by_channel_and_account() -> None:
    class Adapter:
        name = "telegram"
        capabilities = Capabilities(max_text=4096, streaming="edits", edits=True)

        def __init__(self) -> None:
            self.done: list[tuple[Action, str]] = []

        async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
            self.done.append((action, send.idempotency_key))
            return Receipt(platform_ids=("1",))

    adapter = Adapter()
    deliverer = ChannelDeliverer({("telegram", "default"): adapter})  # type: ignore[dict-item]
    conv = make_message("x").conversation
    assert deliverer.capabilities(conv).streaming == "edits"
    receipt = await deliverer.perform(SendText(text="hi"), conv, Ephemeral("k"))
    assert receipt.platform_ids == ("1",) and adapter.done[0][1] == "k"
    other = conv.model_copy(update={"account": "support"})
    assert deliverer.capabilities(other) is NO_CHANNEL
    try:
        await deliverer.perform(SendText(text="hi"), other, Ephemeral("k"))
    except DeliveryError as err:
        assert not err.retryable
    else:
        raise AssertionError("a conversation without an adapter was delivered")
