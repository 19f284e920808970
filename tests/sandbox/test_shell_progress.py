"""A long ``shell`` call's progress on the user's channel, through the real outbound path.

Real Redis, the real drain (outbox, edit budget, typing), the real runtime and tool gateway on replayed model
decisions, the host's bubblewrap sandbox, and the channel adapters against their fake platform servers. The slow
command waits for a file the test writes once it has seen what it wants to see, so nothing depends on how fast the
host is: the command runs exactly as long as the test needs.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from switchboard.channels.meta.whatsapp.adapter import WhatsAppChannel
from switchboard.channels.meta.whatsapp.fake.payloads import PHONE_NUMBER_ID
from switchboard.channels.meta.whatsapp.fake.platform import FakeWhatsApp
from switchboard.channels.registry import BuildContext
from switchboard.channels.slack.adapter import SlackChannel
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.telegram.settings import TelegramSettings
from switchboard.core.agent.replay import RecordedStep, ReplayModel
from switchboard.core.agent.runtime import Runtime
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.builtin.shell import ShellOptions, shell_tools
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.workspaces.disk import workspace_for
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.sandbox.runner import Sandbox
from switchboard.settings import QueueSettings
from switchboard.worker.drain import Drainer
from tests.channels.slack_support import BOT_TOKEN, dm, make_channel
from tests.channels.test_whatsapp import settings as whatsapp_settings
from tests.core.turns import agent, answer_step, calls_step
from tests.fakes.telegram_api import FakeCall, FakeTelegram
from tests.waiting import wait_until

TOKEN = "123456:TEST-token-abcdefghijklmnopqrstuv"
WA_USER = "15551234567"
SLOW = "while [ ! -e go ]; do sleep 0.05; done; echo slow"
"""Runs until the test writes ``go`` into the session's workspace."""
QUEUE = QueueSettings(name="sbprogress", lease_ms=30_000, max_attempts=3, retry_backoff_s=0.0, history_maxlen=50)
FAST = ShellOptions(progress_after_s=0.1, progress_every_s=0.1, progress_notices=2)
"""Short intervals: the test sees several updates within a few seconds."""


@pytest.fixture
async def telegram() -> AsyncIterator[tuple[TelegramChannel, FakeTelegram]]:
    async with FakeTelegram(token=TOKEN, username="bot") as fake:
        block = TelegramSettings.model_validate(
            {"bot_token": TOKEN, "secret_token": "s3cret", "api_base_url": fake.base_url}
        )
        adapter = TelegramChannel(block, account="default")
        yield adapter, fake
        await adapter.aclose()


@pytest.fixture
async def whatsapp() -> AsyncIterator[tuple[WhatsAppChannel, FakeWhatsApp]]:
    async with FakeWhatsApp(token="EAAtest") as fake:
        adapter = WhatsAppChannel(whatsapp_settings(graph_base_url=fake.graph_url), BuildContext(account="default"))
        yield adapter, fake
        await adapter.aclose()


def inbound(conversation: ConversationRef, msg_id: str = "m1") -> InboundMessage:
    return InboundMessage(
        id=msg_id, dedup_key=f"u-{msg_id}", conversation=conversation, sender=Sender(id="7"), text="build it"
    )


def drainer(
    redis: aioredis.Redis, root: Path, sandbox: Sandbox, steps: list[RecordedStep], deliverer: ChannelDeliverer
) -> Drainer:
    models = ModelFactory(ProviderConfig())
    models.override("offline", ReplayModel(steps, strict=False))
    tools = ToolRegistry(shell_tools(sandbox, FAST))
    runtime = Runtime(
        models=models,
        tools=tools,
        workspace_root=root,
        gateway=ToolGateway(tools, workspace_root=root),
        model_backoff_s=0.0,
    )
    served = agent(tools=("shell",))
    return Drainer(
        redis, QUEUE, runner=runtime.run_turn, deliverer=deliverer, agent_for=lambda m: served, worker_id="w1",
        workspace_root=root,
    )  # fmt: skip


async def history_of(redis: aioredis.Redis, message: InboundMessage) -> bytes:
    """The session's conversation history as stored (JSON entries, joined)."""
    entries = await redis.lrange(SessionKeys(message.session_key).history, 0, -1)
    return b"".join(e if isinstance(e, bytes) else e.encode() for e in entries)


def seconds(text: str) -> int:
    """The elapsed time a running status shows (``⏳ Running … — 3 s``)."""
    found = re.search(r" — (\d+) s\n", text + "\n")
    assert found is not None, text
    return int(found.group(1))


def telegram_status(fake: FakeTelegram) -> tuple[list[FakeCall], list[FakeCall]]:
    """The status messages posted and the edits made to them."""
    posts = [c for c in fake.sent(method="sendMessage") if "Running" in c.params["text"]]
    edits = [c for c in fake.sent(method="editMessageText")]
    return posts, edits


async def test_an_editing_channel_shows_one_status_message_kept_up_to_date_then_its_final_state(
    telegram: tuple[TelegramChannel, FakeTelegram], bwrap: Sandbox, tmp_path: Path, async_redis: aioredis.Redis
) -> None:
    channel, fake = telegram
    conversation = ConversationRef(agent="a", channel="telegram", account="default", conversation="4201")
    message = inbound(conversation)
    steps = [calls_step(("shell", {"commands": [SLOW, "echo quick"], "timeout_ms": 60_000}), step=1),
             answer_step("Built.", step=2)]  # fmt: skip
    deliverer = ChannelDeliverer({("telegram", "default"): channel})
    await Ingestor(async_redis, QUEUE).ingest(message)
    drain = asyncio.create_task(drainer(async_redis, tmp_path, bwrap, steps, deliverer).drain(message.session_key))

    def texts_so_far() -> list[str]:
        posts, edits = telegram_status(fake)
        return [c.params["text"] for c in posts + edits]

    # the status is edited with growing elapsed times while the slow command runs, and shows the quick one's end
    # (Telegram shows the Markdown as HTML)
    quick_done = "<code>echo quick</code> — exit 0"
    await wait_until(
        lambda: len({seconds(c.params["text"]) for c in telegram_status(fake)[1]}) >= 2,
        "two different elapsed times shown",
    )
    await wait_until(
        lambda: any(quick_done in text and " — running" in text for text in texts_so_far()),
        "the quick command shown done while the slow one runs",
    )
    (workspace_for(tmp_path, message.session_key) / "go").write_text("")
    await asyncio.wait_for(drain, 30)

    posts, edits = telegram_status(fake)
    [post] = posts  # one status message, posted once
    assert post.params["text"].startswith("⏳ Running 2 commands — ")
    [edited] = {int(c.params["message_id"]) for c in edits}  # every edit is of one message: the status message
    [current] = [text for (_, mid), text in fake.state.messages.items() if mid == edited]
    assert current.startswith("✅ Done in "), current
    *running, final = [c.params["text"] for c in edits]
    shown = [seconds(text) for text in running]
    assert len(set(shown)) >= 2 and shown == sorted(shown), running  # the elapsed time only grows
    assert any(quick_done in text and " — running" in text for text in [post.params["text"], *running])
    assert final.startswith("✅ Done in ") and final.count(" — exit 0") == 2, final

    # the reply is its own message; nothing of the status is the agent's reply or in the conversation's history
    texts = [c.params["text"] for c in fake.sent(method="sendMessage")]
    assert texts[-1] == "Built." and sum("Running" in t for t in texts) == 1
    history = await history_of(async_redis, message)
    assert b"Built." in history and b"Running" not in history and b"Done in" not in history

    # and it stopped with the call: no edit after the final state
    before = len(fake.sent(method="editMessageText"))
    await asyncio.sleep(5 * FAST.progress_every_s)
    assert len(fake.sent(method="editMessageText")) == before


async def test_a_stopped_call_says_so_and_stops_updating(
    telegram: tuple[TelegramChannel, FakeTelegram], bwrap: Sandbox, tmp_path: Path, async_redis: aioredis.Redis
) -> None:
    channel, fake = telegram
    conversation = ConversationRef(agent="a", channel="telegram", account="default", conversation="4202")
    message = inbound(conversation)
    steps = [calls_step(("shell", {"commands": [SLOW], "timeout_ms": 60_000}), step=1), answer_step("x", step=2)]
    worker = drainer(async_redis, tmp_path, bwrap, steps, ChannelDeliverer({("telegram", "default"): channel}))
    await Ingestor(async_redis, QUEUE).ingest(message)
    drain = asyncio.create_task(worker.drain(message.session_key))
    await wait_until(lambda: len(telegram_status(fake)[0]) == 1, "one status message")
    assert worker.cancel(message.session_key, "stopped on request")
    await asyncio.wait_for(drain, 30)

    final = telegram_status(fake)[1][-1].params["text"]
    assert final.startswith("⏹ Stopped after ") and "<code>while [ ! -e go ]" in final, final
    before = len(fake.sent(method="editMessageText"))
    await asyncio.sleep(5 * FAST.progress_every_s)
    assert len(fake.sent(method="editMessageText")) == before


async def test_progress_that_cannot_be_shown_never_fails_the_call(
    telegram: tuple[TelegramChannel, FakeTelegram], bwrap: Sandbox, tmp_path: Path, async_redis: aioredis.Redis
) -> None:
    channel, fake = telegram
    conversation = ConversationRef(agent="a", channel="telegram", account="default", conversation="4203")
    message = inbound(conversation)
    steps = [calls_step(("shell", {"commands": [SLOW]}), step=1), answer_step("Built.", step=2)]
    fake.refuse_next(
        1, status=400, description="Bad Request: not enough rights to send text messages", method="sendMessage"
    )
    worker = drainer(async_redis, tmp_path, bwrap, steps, ChannelDeliverer({("telegram", "default"): channel}))
    await Ingestor(async_redis, QUEUE).ingest(message)
    drain = asyncio.create_task(worker.drain(message.session_key))
    await wait_until(
        lambda: any(c.status == 400 for c in fake.calls), "the status message refused (400)"
    )  # the status message was refused
    (workspace_for(tmp_path, message.session_key) / "go").write_text("")
    await asyncio.wait_for(drain, 30)
    assert telegram_status(fake) == ([], [])
    assert [c.params["text"] for c in fake.sent(method="sendMessage")] == ["Built."]
    history = await history_of(async_redis, message)
    assert b"slow" in history  # the command ran to its end and the model read its output


async def test_a_channel_that_cannot_edit_gets_a_bounded_number_of_notices_and_typing(
    whatsapp: tuple[WhatsAppChannel, FakeWhatsApp], bwrap: Sandbox, tmp_path: Path, async_redis: aioredis.Redis
) -> None:
    channel, fake = whatsapp
    extra = {"phone_number_id": PHONE_NUMBER_ID, "wa_id": WA_USER, "wamid": "wamid.IN0001"}
    conversation = ConversationRef(agent="a", channel="whatsapp", account="default", conversation=WA_USER, extra=extra)
    message = inbound(conversation)
    steps = [calls_step(("shell", {"commands": [SLOW]}), step=1), answer_step("Built.", step=2)]
    worker = drainer(async_redis, tmp_path, bwrap, steps, ChannelDeliverer({("whatsapp", "default"): channel}))
    await Ingestor(async_redis, QUEUE).ingest(message)
    started = time.monotonic()
    drain = asyncio.create_task(worker.drain(message.session_key))

    def notices() -> list[str]:
        return [t for t in fake.state.texts(WA_USER) if "Running" in t]

    await wait_until(lambda: len(notices()) == FAST.progress_notices, "every progress notice")
    # run on past the time a third notice would have come (0.1 s × 6² = 3.6 s into the call), and then some
    third = FAST.progress_after_s * 6**2
    await asyncio.sleep(max(third * 1.5 - (time.monotonic() - started), 0))
    (workspace_for(tmp_path, message.session_key) / "go").write_text("")
    await asyncio.wait_for(drain, 30)

    shown = notices()
    assert len(shown) == FAST.progress_notices, shown
    assert all(n.startswith("⏳ Running ```while [ ! -e go ]; do sleep 0.05; done; echo slow``` — ") for n in shown), (
        shown
    )
    assert fake.state.texts(WA_USER)[-1] == "Built."
    assert len(fake.state.texts(WA_USER)) == FAST.progress_notices + 1  # no "done" notice: the reply follows
    typing = [c for c in fake.state.calls if c.path.endswith("/messages") and "typing_indicator" in c.body]
    assert typing, "the typing indicator shows the agent at work between notices"


@pytest.fixture
async def slack() -> AsyncIterator[tuple[SlackChannel, FakeSlack]]:
    async with FakeSlack(bot_token=BOT_TOKEN) as fake:
        adapter = make_channel(fake.api_url)
        yield adapter, fake
        await adapter.aclose()


async def test_slack_edits_its_status_message_the_same_way(
    slack: tuple[SlackChannel, FakeSlack], bwrap: Sandbox, tmp_path: Path, async_redis: aioredis.Redis
) -> None:
    channel, fake = slack
    message = inbound(dm().model_copy(update={"agent": "a"}))
    steps = [calls_step(("shell", {"commands": [SLOW]}), step=1), answer_step("Built.", step=2)]
    worker = drainer(async_redis, tmp_path, bwrap, steps, ChannelDeliverer({("slack", "default"): channel}))
    await Ingestor(async_redis, QUEUE).ingest(message)
    drain = asyncio.create_task(worker.drain(message.session_key))
    await wait_until(
        lambda: len(fake.sent("chat.update")) >= 1, "a chat.update while the command runs"
    )  # an update while the command runs
    (workspace_for(tmp_path, message.session_key) / "go").write_text("")
    await asyncio.wait_for(drain, 30)

    [status] = [m for m in fake.state.messages.values() if "Running" in m["text"] or "Done in" in m["text"]]
    assert status["text"].startswith("✅ Done in ") and status["edits"] >= 2, status  # one update, then the end
    assert len([c for c in fake.sent() if "Running" in c.params["text"]]) == 1
    assert [m["text"] for m in fake.state.messages.values() if m is not status] == ["Built."]
