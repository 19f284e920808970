"""The streaming policy through the real drain: edit budget, previews across re-runs and workers, native streams."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import redis.asyncio as aioredis

from switchboard.channels.base import Capabilities, Rate, Receipt, SendContext
from switchboard.channels.render.split import RENDER_HEADROOM, split_head
from switchboard.core.actions import Action, EditText, StreamText
from switchboard.core.messages import ConversationRef
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.outbound.notices import CANCELLED_TEXT
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.settings import QueueSettings
from switchboard.worker.drain import Drainer
from switchboard.worker.drainturn import DrainOutcome

from .conftest import agent_for, make_message
from .outbound_channel import Crash, FakeChannel, FakePlatform

ROOMY = Rate(1000.0, 1000)
EDITS = Capabilities(
    max_text=100, edits=True, streaming="edits", bot_rate=ROOMY, chat_rate=ROOMY, edit_rate=Rate(0.0001, 2)
)
"""100 characters a message, and an edit budget of two edits (the next token comes in 10,000 s)."""
LIMIT = int(EDITS.max_text * RENDER_HEADROOM)


def _reply(paragraphs: int = 40) -> str:
    return "\n\n".join(f"Paragraph {n}: " + " ".join(f"word{n}x{k}" for k in range(12)) for n in range(paragraphs))


def _expected(reply: str) -> list[str]:
    """What the platform shows at the end: the preview made the reply's first part, the channel's own split after."""
    head, rest = split_head(reply, LIMIT)
    return [head, *(rest[i : i + EDITS.max_text] for i in range(0, len(rest), EDITS.max_text))]


def _streaming_runner(reply: str, runs: list[int], *, crash_after: int | None = None):  # type: ignore[no-untyped-def]
    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        runs.append(1)
        pieces = [reply[i : i + 10] for i in range(0, len(reply), 10)]
        for n, piece in enumerate(pieces):
            if crash_after is not None and n == crash_after:
                raise Crash
            await sink.delta(piece)
        return TurnResult(text=reply, steps=1)

    return runner


def _drainer(
    client: aioredis.Redis, settings: QueueSettings, channel: FakeChannel, runner, worker: str = "w1"
) -> Drainer:  # type: ignore[no-untyped-def]
    deliverer = ChannelDeliverer({("telegram", "default"): channel})
    return Drainer(client, settings, runner=runner, deliverer=deliverer, agent_for=agent_for, worker_id=worker)


def _streamed_edits(channel: FakeChannel) -> list[Action]:
    """Preview edits made while streaming (not the final one, which makes the preview the reply's first part)."""
    return [a for a, key in channel.performed if isinstance(a, EditText) and not key.endswith(":0")]


async def test_streaming_by_edits_stays_within_the_shared_edit_budget_and_the_reply_is_complete(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    reply, runs = _reply(), []
    platform = FakePlatform()
    channel = FakeChannel(platform, EDITS)
    await ingestor.ingest(make_message("write a lot"))
    await _drainer(client, queue_settings, channel, _streaming_runner(reply, runs)).drain(make_message("x").session_key)
    assert len(reply) // 10 > 200  # hundreds of deltas ...
    assert 1 <= len(_streamed_edits(channel)) <= 2  # ... and never more edits than the budget holds
    parts = _expected(reply)
    assert len(parts) > 10
    assert platform.texts() == parts  # the preview became part 1; the rest followed, in order
    assert "".join(platform.texts()) == reply
    assert platform.count("post") == len(parts)  # one preview, never a second one
    assert all(len(text) <= EDITS.max_text for text in platform.texts())


async def test_a_second_worker_streaming_into_the_same_chat_shares_the_edit_budget(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    reply = _reply(10)
    first_platform, second_platform = FakePlatform(), FakePlatform()
    first, second = FakeChannel(first_platform, EDITS), FakeChannel(second_platform, EDITS)
    one = make_message("a", conversation="chat-9")
    await ingestor.ingest(one)
    await _drainer(client, queue_settings, first, _streaming_runner(reply, [])).drain(one.session_key)
    # a new turn in the same chat, run by another worker: the budget is spent
    two = make_message("b", conversation="chat-9")
    await ingestor.ingest(two)
    await _drainer(client, queue_settings, second, _streaming_runner(reply, []), "w2").drain(two.session_key)
    assert len(_streamed_edits(first)) + len(_streamed_edits(second)) <= 2
    assert "".join(second_platform.texts()) == reply


async def test_a_re_run_after_a_crash_mid_stream_edits_the_same_preview(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    reply, runs = _reply(), []
    platform = FakePlatform()
    session = make_message("x").session_key
    await ingestor.ingest(make_message("write a lot"))
    dying = _drainer(
        client, queue_settings, FakeChannel(platform, EDITS), _streaming_runner(reply, runs, crash_after=50)
    )
    with pytest.raises(Crash):
        await dying.drain_session(session)
    assert platform.count("post") == 1  # the preview

    await client.delete(SessionKeys(session).lease)
    again = _drainer(client, queue_settings, FakeChannel(platform, EDITS), _streaming_runner(reply, runs), "w2")
    assert await again.drain_session(session) is DrainOutcome.RELEASED
    assert len(runs) == 2  # the turn had no reply yet: it ran again
    assert platform.texts() == _expected(reply)  # the first run's preview became part 1: no second preview


async def test_a_streamed_reply_killed_after_its_third_message_resumes_at_the_fourth_on_another_worker(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    reply, runs = _reply(), []
    platform = FakePlatform(die_after_posts=3)  # the preview, then parts 2 and 3
    session = make_message("x").session_key
    await ingestor.ingest(make_message("write a lot"))
    with pytest.raises(Crash):
        await _drainer(client, queue_settings, FakeChannel(platform, EDITS), _streaming_runner(reply, runs)).drain(
            session
        )
    parts = _expected(reply)
    assert platform.texts() == parts[:3]

    await client.delete(SessionKeys(session).lease)
    second = FakeChannel(platform, EDITS)
    await _drainer(client, queue_settings, second, _streaming_runner(reply, runs), "w2").drain(session)
    assert len(runs) == 1  # the reply was made: only its send was resumed
    assert platform.texts() == parts  # parts 4.. only, none twice
    assert not any(isinstance(a, EditText) for a, _ in second.performed)  # part 1 was already the preview


async def test_native_streaming_opens_appends_within_the_budget_and_closes_with_the_whole_reply(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    reply, runs = _reply(), []
    platform = FakePlatform()
    channel = FakeChannel(platform, replace(EDITS, streaming="native"))
    await ingestor.ingest(make_message("write a lot"))
    await _drainer(client, queue_settings, channel, _streaming_runner(reply, runs)).drain(make_message("x").session_key)
    assert platform.count("stream_open") == 1
    assert platform.count("stream_open") + platform.count("stream_append") <= 2  # the edit budget
    streams = [a for a, _ in channel.performed if isinstance(a, StreamText)]
    final = streams[-1]
    assert final.final and final.handle == "s1" and final.text == reply
    assert "".join(platform.texts()) == reply  # the channel split the complete reply
    assert platform.count("edit") == 0


async def test_a_channel_without_streaming_gets_the_final_reply_only(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    reply = _reply(5)
    platform = FakePlatform()
    channel = FakeChannel(platform, replace(EDITS, streaming="none"))
    await ingestor.ingest(make_message("write"))
    await _drainer(client, queue_settings, channel, _streaming_runner(reply, [])).drain(make_message("x").session_key)
    assert [kind for kind, _ in platform.calls if kind not in ("status", "typing")] == ["post"] * len(
        channel.split(reply)
    )
    assert "".join(platform.texts()) == reply


async def test_native_streaming_declined_for_a_conversation_falls_back_to_edits(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    class NoThreads(FakeChannel):
        """Like Slack outside a thread: the opening ``StreamText`` answers without a handle."""

        async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
            if isinstance(action, StreamText) and action.handle is None:
                return Receipt(parts=0, detail={"streaming": "unavailable"})
            return await super().perform(action, conversation, send)

    reply = _reply()
    platform = FakePlatform()
    channel = NoThreads(platform, replace(EDITS, streaming="native"))
    await ingestor.ingest(make_message("write a lot"))
    await _drainer(client, queue_settings, channel, _streaming_runner(reply, [])).drain(make_message("x").session_key)
    assert platform.texts() == _expected(reply)
    assert len(_streamed_edits(channel)) <= 1  # the declined opening took one token of the two


async def test_a_turn_stopped_mid_stream_closes_its_preview_with_the_notice(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    reply = _reply()
    platform = FakePlatform()
    streamed = asyncio.Event()

    async def hangs(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        for start in range(0, 300, 10):
            await sink.delta(reply[start : start + 10])
        streamed.set()
        await asyncio.sleep(3600)  # the model is still writing when the user stops it
        raise AssertionError("not stopped")

    session = make_message("x").session_key
    await ingestor.ingest(make_message("write a lot"))
    drainer = _drainer(client, queue_settings, FakeChannel(platform, EDITS), hangs)
    task = asyncio.create_task(drainer.drain(session))
    await asyncio.wait_for(streamed.wait(), 30)
    assert drainer.cancel(session, "stopped on request")
    await asyncio.wait_for(task, 30)
    assert platform.count("post") == 1  # the preview, and no reply after it
    (preview,) = platform.texts()
    room = LIMIT - len(CANCELLED_TEXT) - 2
    assert preview == f"{split_head(reply[:300], room)[0]}\n\n{CANCELLED_TEXT}"  # what streamed, and the notice
    assert len(preview) <= EDITS.max_text


def _slow_runner(reply: str, pause_s: float):  # type: ignore[no-untyped-def]
    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        for start in range(0, len(reply), 10):
            await sink.delta(reply[start : start + 10])
            await asyncio.sleep(pause_s)
        return TurnResult(text=reply, steps=1)

    return runner


async def test_a_reply_written_sooner_than_stream_after_goes_out_once_whole(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    reply = _reply(10)
    platform = FakePlatform()
    channel = FakeChannel(platform, EDITS)
    message = make_message("quick", conversation="chat-fast")
    await ingestor.ingest(message)
    settings = queue_settings.model_copy(update={"stream_after_s": 60.0})
    await _drainer(client, settings, channel, _streaming_runner(reply, [])).drain(message.session_key)
    assert not [a for a, _ in channel.performed if isinstance(a, EditText)]  # no preview opened, none edited
    assert platform.texts() == [reply[i : i + EDITS.max_text] for i in range(0, len(reply), EDITS.max_text)]
    edit_budget = "sb:{rate:telegram/default}:edit:chat-fast"
    assert await client.exists(edit_budget) == 0  # no edit token was taken


async def test_a_reply_written_for_longer_than_stream_after_streams_into_a_preview(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    reply = _reply(2)
    platform = FakePlatform()
    channel = FakeChannel(platform, replace(EDITS, edit_rate=ROOMY))
    message = make_message("slow", conversation="chat-slow")
    await ingestor.ingest(message)
    settings = queue_settings.model_copy(update={"stream_after_s": 0.05})
    await _drainer(client, settings, channel, _slow_runner(reply, 0.02)).drain(message.session_key)
    edits = _streamed_edits(channel)
    assert edits  # the preview was opened once the reply had been written for a while, and edited as it grew
    assert reply[:10] in platform.texts()[0]
    assert "".join(platform.texts()) == reply


async def test_an_edit_refused_is_not_asked_again_until_its_wait_has_passed(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    reply, runs = _reply(), []
    channel = FakeChannel(FakePlatform(), EDITS)
    message = make_message("many deltas", conversation="chat-budget")
    await ingestor.ingest(message)
    before = (await client.info("commandstats")).get("cmdstat_time", {}).get("calls", 0)
    await _drainer(client, queue_settings, channel, _streaming_runner(reply, runs)).drain(message.session_key)
    asked = (await client.info("commandstats")).get("cmdstat_time", {}).get("calls", 0) - before
    deltas = len(reply) // 10
    sends = len(_expected(reply))
    assert deltas > 200
    # every send takes a token (one bucket script each, which reads the server's clock once); the edit budget is
    # asked until it refuses, and then no more for the 10,000 s it said to wait
    assert asked <= sends + 8


@pytest.mark.parametrize("mode", ["edits", "native"])
async def test_a_turn_stopped_before_stream_after_shows_nothing_and_ends_the_drain(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, mode: str
) -> None:
    reply = _reply()
    platform = FakePlatform()
    written = asyncio.Event()

    async def hangs(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        for start in range(0, 300, 10):
            await sink.delta(reply[start : start + 10])
        written.set()
        await asyncio.sleep(3600)  # still writing when it is stopped, well within stream_after
        raise AssertionError("not stopped")

    session = make_message("x").session_key
    await ingestor.ingest(make_message("write a lot"))
    settings = queue_settings.model_copy(update={"stream_after_s": 60.0})
    drainer = _drainer(client, settings, FakeChannel(platform, replace(EDITS, streaming=mode)), hangs)
    task = asyncio.create_task(drainer.drain_session(session))
    await asyncio.wait_for(written.wait(), 30)
    assert drainer.cancel(session, "stopped on request")
    assert await asyncio.wait_for(task, 30) is DrainOutcome.RELEASED
    shown = [kind for kind, _ in platform.calls if kind not in ("status", "typing")]
    assert shown == []  # nothing was opened, so there is nothing to close: no preview, no stream, no partial reply
    keys = SessionKeys(session)
    assert await client.llen(keys.inbox) == 0 and await client.exists(keys.lease, keys.drain, keys.outbox) == 0
