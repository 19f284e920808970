"""The outbox's send context: multi-part progress across workers, shared rate buckets, 429 holds, workspace files."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from switchboard.channels.base import Capabilities, Rate
from switchboard.core.actions import SendFile, SendText
from switchboard.core.workspaces.disk import workspace_for
from switchboard.errors import DeliveryError, FencedWriteError, RateLimitedError
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.outbound.outbox import Outbox
from switchboard.outbound.ratelimits import SendBuckets
from switchboard.queue.connection import async_client
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease, LeaseToken
from switchboard.settings import QueueSettings

from .conftest import RecordingDeliverer, make_drainer, make_message
from .outbound_channel import Crash, FakeChannel, FakePlatform

ROOMY = Capabilities(max_text=10, bot_rate=Rate(1000.0, 1000), chat_rate=Rate(1000.0, 1000))
"""Ten characters a message, and rates no test here runs out of (unless it means to)."""


@pytest.fixture
async def other_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A second connection: what another worker process would have."""
    redis = async_client(redis_url)
    yield redis
    await redis.aclose()


def _outbox(
    client: aioredis.Redis,
    lease: LeaseToken,
    channel: FakeChannel,
    *,
    sleeps: list[float] | None = None,
    workspace_root: Path | None = None,
) -> Outbox:
    deliverer = ChannelDeliverer({("telegram", "default"): channel})

    async def sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)

    return Outbox(
        client,
        lease,
        deliverer.perform,
        sleep=sleep,
        max_wait_s=600.0,
        buckets=SendBuckets(client, sleep=sleep),
        capabilities=deliverer.capabilities,
        workspace_root=workspace_root,
    )


async def _lease(client: aioredis.Redis, worker: str, session: str) -> LeaseToken:
    lease = await Lease(client, worker_id=worker, lease_ms=30_000).acquire(session)
    assert lease is not None
    return lease


async def test_a_multi_part_send_killed_after_part_two_resumes_at_part_three_on_another_worker(
    client: aioredis.Redis, other_client: aioredis.Redis
) -> None:
    message = make_message("x")
    session, conversation = message.session_key, message.conversation
    platform = FakePlatform(die_after_posts=2)
    text = "".join(f"part {n:>4}." for n in range(1, 6))  # five messages of ten characters
    reply = SendText(text=text)

    first = await _lease(client, "w1", session)
    with pytest.raises(Crash):
        await _outbox(client, first, FakeChannel(platform, ROOMY)).send(
            reply, conversation, run_id="run-1", logical="reply", durable=True
        )
    assert platform.texts() == ["part    1.", "part    2."]

    # the first worker is gone; another process takes the session over and retries the send
    await client.delete(SessionKeys(session).lease)
    second = await _lease(other_client, "w2", session)
    outcome = await _outbox(other_client, second, FakeChannel(platform, ROOMY)).send(
        reply, conversation, run_id="run-1", logical="reply", durable=True
    )
    assert platform.texts() == [f"part {n:>4}." for n in range(1, 6)]  # parts 3-5 only: none twice
    assert outcome.receipt is not None and outcome.receipt.platform_ids == tuple(platform.order)

    # the dead worker's context can record nothing more
    stale = _outbox(client, first, FakeChannel(platform, ROOMY))
    with pytest.raises(FencedWriteError):
        await stale.send(reply, conversation, run_id="run-1", logical="other")


async def test_a_send_refused_midway_keeps_its_parts_and_the_retry_resumes(client: aioredis.Redis) -> None:
    message = make_message("x")
    platform = FakePlatform(refuse_post=3)
    lease = await _lease(client, "w1", message.session_key)
    outbox = _outbox(client, lease, FakeChannel(platform, ROOMY))
    text = "a" * 10 + "b" * 10 + "c" * 10 + "d" * 5
    with pytest.raises(DeliveryError):
        await outbox.send(SendText(text=text), message.conversation, run_id="run-1", logical="act:1")
    assert platform.texts() == ["a" * 10, "b" * 10]
    # not durable, yet the record stays: it holds delivered parts
    assert await outbox.recorded_ids("run-1", "act:1") == tuple(platform.order)
    await outbox.send(SendText(text=text), message.conversation, run_id="run-1", logical="act:1")
    assert platform.texts() == ["a" * 10, "b" * 10, "c" * 10, "d" * 5]


_TAKER = """
import asyncio, sys
from switchboard.channels.base import Capabilities, Rate
from switchboard.core.messages import ConversationRef
from switchboard.queue.connection import async_client
from switchboard.outbound.ratelimits import SendBuckets

async def main(url, chat, times):
    redis = async_client(url)
    caps = Capabilities(max_text=100, bot_rate=Rate(0.001, 5), chat_rate=Rate(0.001, 4))
    conversation = ConversationRef(agent="a", channel="telegram", conversation=chat)
    buckets = SendBuckets(redis)
    waits = [await buckets.take(conversation, caps) for _ in range(times)]
    print(" ".join("taken" if w == 0 else "refused" for w in waits))
    await redis.aclose()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def _take_in_process(redis_url: str, chat: str, times: int) -> list[str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _TAKER,
        redis_url,
        chat,
        str(times),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    return out.decode().split()


async def test_two_processes_sending_to_one_chat_share_its_bucket(redis_url: str) -> None:
    # the chat's bucket holds 4 tokens and refills one in 1,000 s; the bot's holds 5
    first = await _take_in_process(redis_url, "chat-1", 3)
    second = await _take_in_process(redis_url, "chat-1", 2)
    assert first == ["taken", "taken", "taken"]
    assert second == ["taken", "refused"]  # the 4th token was the chat's last, whoever took the others
    # another chat has its own bucket, but the bot's is shared: one token of its 5 is left
    assert await _take_in_process(redis_url, "chat-2", 2) == ["taken", "refused"]


async def test_pace_waits_for_a_token_without_blocking_and_gives_up_past_its_bound(client: aioredis.Redis) -> None:
    caps = Capabilities(max_text=100, chat_rate=Rate(0.01, 1))  # one send per 100 s
    conversation = make_message("x").conversation
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    buckets = SendBuckets(client, sleep=sleep, max_wait_s=30.0)
    await buckets.pace(conversation, caps)
    assert sleeps == []
    with pytest.raises(RateLimitedError) as refused:
        await buckets.pace(conversation, caps)
    assert 90.0 < refused.value.retry_after <= 100.0  # the bucket's own refill time, not a wall-clock measurement
    patient = SendBuckets(client, sleep=sleep, max_wait_s=1000.0)
    with pytest.raises(RateLimitedError):  # the fake sleep lets no time pass: it tries until the bound
        await patient.pace(conversation, caps)
    assert sleeps and all(90.0 < s <= 100.0 for s in sleeps)


async def test_a_429_is_retried_alone_and_keeps_the_order_of_parts_and_sends(client: aioredis.Redis) -> None:
    message = make_message("x")
    conversation = message.conversation
    platform = FakePlatform(limit_post=2, retry_after=0.2)
    waits: list[float] = []

    async def sleep(seconds: float) -> None:  # really waits: the chat is held for the platform's retry_after
        waits.append(seconds)
        await asyncio.sleep(seconds + 0.05)  # a little longer: the server's clock and ours tick apart

    lease = await _lease(client, "w1", message.session_key)
    outbox = _outbox(client, lease, FakeChannel(platform, ROOMY))
    outbox._sleep = sleep
    await outbox.send(SendText(text="first one." + "second one" + "third one."), conversation, run_id="r", logical="a")
    await outbox.send(SendText(text="next"), conversation, run_id="r", logical="b")
    assert platform.texts() == ["first one.", "second one", "third one.", "next"]  # in order, none twice
    assert waits == [0.2]  # the platform's retry_after, once; nothing else was re-run


async def test_a_429_holds_the_chat_for_every_worker(client: aioredis.Redis, other_client: aioredis.Redis) -> None:
    message = make_message("x")
    conversation = message.conversation
    platform = FakePlatform(limit_post=1, retry_after=60.0)
    lease = await _lease(client, "w1", message.session_key)
    outbox = _outbox(client, lease, FakeChannel(platform, ROOMY))
    outbox.max_wait_s = 0.0  # this worker gives the send up at once (the reply's retries take over)
    with pytest.raises(RateLimitedError):
        await outbox.send(SendText(text="hello"), conversation, run_id="r", logical="a")

    # another worker sending to the same chat now waits for the hold instead of collecting its own 429
    other = SendBuckets(other_client, max_wait_s=0.0)
    with pytest.raises(RateLimitedError) as held:
        await other.pace(conversation, ROOMY)
    assert 50.0 < held.value.retry_after <= 60.0  # what is left of the hold (the server's clock)
    elsewhere = conversation.model_copy(update={"conversation": "another-chat"})
    await other.pace(elsewhere, ROOMY)  # other chats are not held
    assert platform.texts() == []


async def test_read_file_sends_a_workspace_file_from_any_worker_and_refuses_escapes(
    client: aioredis.Redis, tmp_path: Path
) -> None:
    message = make_message("x")
    root = tmp_path / "workspaces"
    home = workspace_for(root, message.session_key)
    (home / "out").mkdir(parents=True)
    (home / "out" / "report.txt").write_bytes(b"figures")
    (tmp_path / "secret.txt").write_bytes(b"not yours")
    (home / "link.txt").symlink_to(tmp_path / "secret.txt")
    platform = FakePlatform()
    lease = await _lease(client, "w1", message.session_key)
    outbox = _outbox(client, lease, FakeChannel(platform, ROOMY), workspace_root=root)

    sent = await outbox.send(SendFile(path="out/report.txt"), message.conversation, run_id="r", logical="f1")
    assert sent.receipt is not None and platform.files[sent.receipt.platform_ids[0]] == b"figures"
    for n, path in enumerate(["../../secret.txt", str(tmp_path / "secret.txt"), "link.txt", "missing.txt"]):
        with pytest.raises(DeliveryError) as refused:
            await outbox.send(SendFile(path=path), message.conversation, run_id="r", logical=f"bad:{n}")
        assert not refused.value.retryable
    assert list(platform.files.values()) == [b"figures"]


async def test_no_typing_reaches_a_channel_that_shows_none(
    client: aioredis.Redis, queue_settings: QueueSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
    from switchboard.queue.ingest import Ingestor
    from switchboard.worker import drain as drain_module

    monkeypatch.setattr(drain_module, "TYPING_DELAY_S", 0.0)
    quiet = RecordingDeliverer(typing=False, typing_refresh_s=0.01)

    async def slow(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        for _ in range(20):  # long enough for several refreshes, had any been scheduled
            await asyncio.sleep(0.01)
        return TurnResult(text="done", steps=1)

    await Ingestor(client, queue_settings).ingest(make_message("slow"))
    await make_drainer(client, queue_settings, quiet, slow).drain(make_message("x").session_key)
    assert [s.action.kind for s in quiet.sent] == ["status", "text", "status"]
