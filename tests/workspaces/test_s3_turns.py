"""A session's workspace belongs to the session: turns on two workers (two hosts, two local roots) over one bucket.

The store is an S3 API served by moto on a loopback port (``conftest.py``); the model is replayed; the channel is
Telegram's fake Bot API, so the file a user sends arrives and leaves through the real adapter.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.channels.registry import ChannelSet
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.telegram.settings import TelegramSettings
from switchboard.core.actions import SendFile
from switchboard.core.agent.attachments import AttachmentSupport
from switchboard.core.agent.replay import RecordedStep, ReplayModel
from switchboard.core.agent.runtime import Runtime
from switchboard.core.messages import Attachment, ConversationRef, InboundMessage, Posted, Sender, session_key
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.turn import TurnRequest
from switchboard.core.workspaces.disk import Quotas, workspace_for
from switchboard.core.workspaces.s3 import S3Workspaces
from switchboard.errors import DeliveryError
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.outbound.outbox import Outbox
from switchboard.queue.ingest import Ingestor
from switchboard.queue.lease import Lease
from switchboard.settings import QueueSettings
from switchboard.worker.drain import Drainer
from switchboard.worker.files import ChannelAttachments
from tests.core.turns import MemorySink, MemoryStore, agent, answer_step, calls_step
from tests.fakes.telegram_api import FakeTelegram

from .conftest import StoreFactory, keys

TOKEN = "123456:TEST-token-abcdefghijklmnopqrstuv"
FILE_TOOLS = ("read_file", "write_file", "list_files", "send_file")


@pytest.fixture
async def telegram() -> AsyncIterator[TelegramChannel]:
    async with FakeTelegram(token=TOKEN, username="bot") as fake:
        settings = TelegramSettings.model_validate(
            {"bot_token": TOKEN, "secret_token": "s3cret", "api_base_url": fake.base_url}
        )
        adapter = TelegramChannel(settings, account="default")
        adapter.fake = fake  # type: ignore[attr-defined]
        yield adapter
        await adapter.aclose()


def worker(store: S3Workspaces, steps: list[RecordedStep], attachments: AttachmentSupport | None = None) -> Runtime:
    """One worker's runtime: its own local root, the shared store, a replayed model."""
    models = ModelFactory(ProviderConfig())
    models.override("offline", ReplayModel(steps, strict=False))
    tools = default_registry()
    gateway = ToolGateway(tools, workspace_root=store.root, workspaces=store.workspaces, store=store)
    return Runtime(
        models=models,
        tools=tools,
        workspace_root=store.root,
        gateway=gateway,
        attachments=attachments,
        model_backoff_s=0.0,
    )


def turn(text: str = "go", *, attachments: tuple[Attachment, ...] = (), msg_id: str = "m1") -> TurnRequest:
    msg = InboundMessage(
        id=msg_id,
        dedup_key=f"u-{msg_id}",
        conversation=ConversationRef(agent="a", channel="telegram", account="default", conversation="42"),
        sender=Sender(id="7"),
        text=text,
        event=Posted(attachments=attachments),
    )
    return TurnRequest(
        session_key=msg.session_key,
        agent=agent(tools=FILE_TOOLS),
        messages=[msg],
        run_id=f"run-{msg_id}",
        deadline=time.time() + 60,
    )


def tool_texts(history: list[Any]) -> str:
    return "\n".join(entry.text for entry in history if entry.role == "tool")


async def test_a_file_written_on_worker_a_is_there_for_the_next_turn_on_worker_b(
    make_store: StoreFactory, tmp_path: Path, s3: Any, bucket: str
) -> None:
    store_a, store_b = make_store(tmp_path / "host-a"), make_store(tmp_path / "host-b")
    first = turn("note it", msg_id="m1")
    written = [
        calls_step(("write_file", {"path": "notes/plan.md", "content": "figures: 42"}), step=1),
        answer_step("noted", step=2),
    ]
    result = await worker(store_a, written).run_turn(first, MemorySink(), MemoryStore())
    assert result.text == "noted"
    assert [k.rsplit("/", 2)[-2:] for k in await keys(s3, bucket)] == [["notes", "plan.md"]]

    second = turn("what was it?", msg_id="m2")
    assert second.session_key == first.session_key
    read = [calls_step(("read_file", {"path": "notes/plan.md"}), step=1), answer_step("42", step=2)]
    result = await worker(store_b, read).run_turn(second, MemorySink(), MemoryStore())
    assert "figures: 42" in tool_texts(result.history)  # the model read what worker A wrote
    assert (workspace_for(store_b.root, second.session_key) / "notes/plan.md").read_text() == "figures: 42"


async def test_a_file_the_user_sent_on_telegram_is_sent_back_by_another_worker(
    make_store: StoreFactory, tmp_path: Path, telegram: TelegramChannel, async_redis: aioredis.Redis
) -> None:
    store_a, store_b = make_store(tmp_path / "host-a"), make_store(tmp_path / "host-b")
    report = b"%PDF-1.4 quarterly figures"
    stored = telegram.fake.store_file(report, name="q3.pdf")  # type: ignore[attr-defined]
    support = AttachmentSupport(source=ChannelAttachments(ChannelSet({("telegram", "default"): telegram})))
    request = turn(attachments=(Attachment(kind="document", ref=stored.file_id, size=len(report)),))
    await worker(store_a, [answer_step("got it")], support).run_turn(request, MemorySink(), MemoryStore())
    (saved,) = (workspace_for(store_a.root, request.session_key) / "inbox").iterdir()

    # worker B (another host, nothing on its disk) sends it back through the adapter, reading from the store
    lease = await Lease(async_redis, worker_id="worker-b", lease_ms=30_000).acquire(request.session_key)
    assert lease is not None
    deliverer = ChannelDeliverer({("telegram", "default"): telegram})
    outbox = Outbox(async_redis, lease, deliverer.perform, workspace_store=store_b)
    conversation = request.messages[0].conversation
    sent = await outbox.send(SendFile(path=f"inbox/{saved.name}"), conversation, run_id="run-b", logical="file")
    assert sent.receipt is not None
    assert [f.content for f in telegram.fake.files] == [report]  # type: ignore[attr-defined]
    assert not workspace_for(store_b.root, request.session_key).exists()  # read from the store, not a local copy

    # the same send from worker B's local directory alone (the old way) finds nothing
    local_only = Outbox(async_redis, lease, deliverer.perform, workspace_root=store_b.root)
    with pytest.raises(DeliveryError, match="no such file"):
        await local_only.send(SendFile(path=f"inbox/{saved.name}"), conversation, run_id="run-b", logical="again")


async def test_a_write_over_the_session_quota_is_refused_to_the_model_and_nothing_is_stored(
    make_store: StoreFactory, tmp_path: Path, s3: Any, bucket: str
) -> None:
    store = make_store(tmp_path / "host-a", quotas=Quotas(session_bytes=1000))
    steps = [
        calls_step(("write_file", {"path": "a.txt", "content": "x" * 600}), step=1),
        calls_step(("write_file", {"path": "b.txt", "content": "y" * 600}), step=2),
        answer_step("done", step=3),
    ]
    result = await worker(store, steps).run_turn(turn(), MemorySink(), MemoryStore())
    texts = tool_texts(result.history)
    assert "the session workspace would hold 1200 bytes, over the 1000-byte quota" in texts  # the model is told
    assert [k.rsplit("/", 1)[-1] for k in await keys(s3, bucket)] == ["a.txt"]


async def test_a_write_over_the_tenant_quota_in_the_store_is_refused_though_this_host_holds_nothing_of_it(
    make_store: StoreFactory, tmp_path: Path, s3: Any, bucket: str
) -> None:
    quotas = Quotas(session_bytes=10_000, tenant_bytes=1500)
    store_a, store_b = make_store(tmp_path / "host-a", quotas=quotas), make_store(tmp_path / "host-b", quotas=quotas)
    # another session of the same tenant holds 1000 bytes, written on host A
    mine = turn()
    tenant = mine.messages[0].conversation.tenant
    other = session_key(tenant, "a", "telegram", "default", "99")
    await store_a.hydrate(other)
    home = workspace_for(store_a.root, other)
    store_a.workspaces.store(home, home / "big.bin", b"z" * 1000)
    await store_a.persist(other)
    before = await keys(s3, bucket)

    steps = [calls_step(("write_file", {"path": "c.txt", "content": "w" * 600}), step=1), answer_step("ok", step=2)]
    result = await worker(store_b, steps).run_turn(mine, MemorySink(), MemoryStore())
    assert "this tenant's workspaces would hold 1600 bytes" in tool_texts(result.history)
    assert await keys(s3, bucket) == before


async def test_through_the_drain_worker_b_sends_the_file_a_turn_on_worker_a_wrote(
    make_store: StoreFactory, tmp_path: Path, telegram: TelegramChannel, async_redis: aioredis.Redis
) -> None:
    settings = QueueSettings(name="sbws", lease_ms=30_000, max_attempts=3, retry_backoff_s=0.0, history_maxlen=50)
    ingestor = Ingestor(async_redis, settings)
    deliverer = ChannelDeliverer({("telegram", "default"): telegram})
    served = agent(tools=FILE_TOOLS)

    def drainer(store: S3Workspaces, steps: list[RecordedStep], name: str) -> Drainer:
        runtime = worker(store, steps)
        return Drainer(async_redis, settings, runner=runtime.run_turn, deliverer=deliverer,
                       agent_for=lambda m: served, worker_id=name, workspace_root=store.root,
                       workspace_store=store)  # fmt: skip

    first, second = turn("make the report", msg_id="m1").messages[0], turn("send it", msg_id="m2").messages[0]
    write = [calls_step(("write_file", {"path": "out/report.csv", "content": "q,total\n3,42\n"}), step=1),
             answer_step("written", step=2)]  # fmt: skip
    send = [calls_step(("send_file", {"path": "out/report.csv"}), step=1), answer_step("sent", step=2)]
    await ingestor.ingest(first)
    await drainer(make_store(tmp_path / "host-a"), write, "worker-a").drain(first.session_key)
    await ingestor.ingest(second)
    await drainer(make_store(tmp_path / "host-b"), send, "worker-b").drain(second.session_key)
    (file,) = telegram.fake.files  # type: ignore[attr-defined]
    assert (file.filename, file.content) == ("report.csv", b"q,total\n3,42\n")
