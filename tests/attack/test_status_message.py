"""Attacks on the live status message of a long ``shell`` call, with real parts.

Real Redis, the real drain (outbox, lease, edit budget), the real runtime and tool gateway on replayed model
decisions, the host's bubblewrap sandbox, and the real channel adapters against the fake platforms, told at their
HTTP boundary to misbehave in time (429 until ``retry_after`` has passed, a slow answer). The same command run again
later in a turn is a new action with its own status. ``xfail(strict=True)`` pins a known defect.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from switchboard.channels.base import Rate
from switchboard.channels.registry import ChannelSet
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.channels.telegram import adapter as telegram_module
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.telegram.fake.state import _Planned
from switchboard.channels.web.adapter import WebChannel
from switchboard.core.agent.replay import RecordedStep, ReplayModel
from switchboard.core.agent.runtime import Runtime
from switchboard.core.messages import ConversationRef
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.builtin import progress as progress_module
from switchboard.core.tools.builtin.progress import Progress, ProgressOptions
from switchboard.core.tools.builtin.shell import ShellOptions, shell_tools
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.workspaces.disk import workspace_for
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.outbound.outbox import Outbox
from switchboard.outbound.ratelimits import SendBuckets
from switchboard.outbound.toolstatus import StatusBoard
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease
from switchboard.sandbox.runner import Sandbox
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey
from switchboard.worker.drain import Drainer
from switchboard.worker.drainturn import DrainOutcome
from tests.channels.slack_support import BOT_TOKEN, dm, make_channel
from tests.channels.test_telegram import BOT, TOKEN, settings
from tests.core.turns import agent, answer_step, calls_step
from tests.fakes.telegram_api import FakeTelegram, check_html
from tests.sandbox.conftest import sandbox_of
from tests.sandbox.test_shell_progress import SLOW, history_of, inbound
from tests.waiting import wait_until
from tests.webchat.conftest import SSE, Chat, read_sse

ROOMY = Rate(1000.0, 1000)
QUEUE = QueueSettings(name="sbstatusatk", lease_ms=30_000, max_attempts=3, retry_backoff_s=0.0, history_maxlen=50)
FAST = ShellOptions(progress_after_s=0.1, progress_every_s=0.1, progress_notices=2)
GROUP_CHAT = -100555


def group(thread: str | None = None) -> ConversationRef:
    """A Telegram supergroup (or one of its forum topics): every topic shares the chat's send and edit budget."""
    extra = {"chat_id": str(GROUP_CHAT), "chat_type": "supergroup"} | ({"message_thread_id": thread} if thread else {})
    return ConversationRef(agent="a", channel="telegram", account="default", conversation=str(GROUP_CHAT),
                           thread=thread, extra=extra)  # fmt: skip


def private(chat: int) -> ConversationRef:
    return ConversationRef(agent="a", channel="telegram", account="default", conversation=str(chat))


@pytest.fixture
def bwrap() -> Sandbox:
    return sandbox_of("bwrap")


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
async def channel(fake: FakeTelegram) -> AsyncIterator[TelegramChannel]:
    adapter = TelegramChannel(settings(fake.base_url), account="default")
    yield adapter
    await adapter.aclose()


def roomy_sends(monkeypatch: pytest.MonkeyPatch, edit_rate: Rate | None = None) -> None:
    """Telegram's declared rates, with sends unmetered (the test meters only what it attacks)."""
    for name in ("CAPABILITIES", "GROUP_CAPABILITIES"):
        caps = getattr(telegram_module, name)
        changed = replace(caps, chat_rate=ROOMY, bot_rate=ROOMY, edit_rate=edit_rate or caps.edit_rate)
        monkeypatch.setattr(telegram_module, name, changed)


class Hold:
    """Telegram after a 429: once it answered ``method`` with 429, it answers every such call so until
    ``retry_after`` has passed (the fake's own plan counts calls; the real API counts time)."""

    def __init__(self, fake: FakeTelegram, monkeypatch: pytest.MonkeyPatch, method: str, retry_after: int) -> None:
        self.armed = False
        self.until = 0.0
        original = fake.state.planned

        def planned(name: str) -> _Planned | None:
            now = time.time()
            if name == method and (self.armed or now < self.until):
                if self.armed:
                    self.armed, self.until = False, now + retry_after
                return _Planned(name, 429, f"Too Many Requests: retry after {retry_after}", retry_after)
            return original(name)

        monkeypatch.setattr(fake.state, "planned", planned)

    def arm(self) -> None:
        """The next call of the method is the one that trips the platform's limit."""
        self.armed = True


async def board_for(
    redis: aioredis.Redis, channel: TelegramChannel, conversation: ConversationRef, *, worker: str = "w1"
) -> StatusBoard:
    """The status messages of run ``run-1`` in ``conversation``, as the drain builds them (real outbox, buckets)."""
    lease = await Lease(redis, worker_id=worker, lease_ms=30_000).acquire(conversation.session_key)
    assert lease is not None
    deliverer = ChannelDeliverer({("telegram", "default"): channel})
    buckets = SendBuckets(redis)
    outbox = Outbox(redis, lease, deliverer.perform, buckets=buckets, capabilities=deliverer.capabilities)
    caps = deliverer.capabilities(conversation)
    return StatusBoard(caps, conversation, outbox=outbox, perform=deliverer.perform, buckets=buckets, run_id="run-1")


def make_drainer(
    redis: aioredis.Redis,
    root: Path,
    sandbox: Sandbox,
    steps: list[RecordedStep],
    deliverer: ChannelDeliverer,
    *,
    queue: QueueSettings = QUEUE,
    worker_id: str = "w1",
) -> Drainer:
    """A worker's drain over the real runtime, the ``shell`` tool with short progress intervals, and ``steps``."""
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
        redis, queue, runner=runtime.run_turn, deliverer=deliverer, agent_for=lambda m: served, worker_id=worker_id,
        workspace_root=root,
    )  # fmt: skip


def shell_then(answer: str, *commands: str) -> list[RecordedStep]:
    return [calls_step(("shell", {"commands": list(commands), "timeout_ms": 60_000}), step=1),
            answer_step(answer, step=2)]  # fmt: skip


def statuses(fake: FakeTelegram, chat: int) -> dict[int, str]:
    """The status messages of ``chat`` as they stand now (message id → text), in the order they were posted."""
    found: dict[int, str] = {}
    for (chat_id, mid), text in sorted(fake.state.messages.items(), key=lambda item: item[0][1]):
        if chat_id == chat and any(mark in text for mark in ("⏳", "✅", "⏹", "⚠️")):
            found[mid] = text
    return found


def go(root: Path, conversation: ConversationRef) -> None:
    """Let the session's slow command end."""
    (workspace_for(root, inbound(conversation).session_key) / "go").write_text("")


# -- 429 with retry_after ------------------------------------------------------------------------------------------


async def test_the_final_state_is_not_lost_to_a_429_with_retry_after_on_an_edit(
    async_redis: aioredis.Redis, fake: FakeTelegram, channel: TelegramChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    roomy_sends(monkeypatch, edit_rate=ROOMY)
    hold = Hold(fake, monkeypatch, "editMessageText", retry_after=3)
    status = (await board_for(async_redis, channel, private(4401))).open("status:call-429")
    assert await status.post("⏳ Running `make` — 5 s")
    hold.arm()
    assert not await status.edit("⏳ Running `make` — 10 s")  # 429: the chat is held for 3 s, for every worker
    await status.edit("✅ Done in 12 s: `make` (exit 0)", final=True)
    assert status.message_id is not None
    key = (4401, int(status.message_id))
    await wait_until(
        lambda: fake.state.messages[key].startswith("✅ Done in "), "the status message edited to ✅ Done", timeout=6.0
    )


async def test_calls_ending_in_a_held_chat_make_no_calls_into_the_hold(
    async_redis: aioredis.Redis, fake: FakeTelegram, channel: TelegramChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    roomy_sends(monkeypatch, edit_rate=ROOMY)
    hold = Hold(fake, monkeypatch, "editMessageText", retry_after=3)
    topics = [str(n) for n in range(11, 16)]  # five sessions (forum topics) in one group chat
    boards = [await board_for(async_redis, channel, group(topic)) for topic in topics]
    calls = [b.open("status:call") for b in boards]
    for n, status in enumerate(calls):
        assert await status.post(f"⏳ Running `job {n}` — 5 s")
    hold.arm()
    assert not await calls[0].edit("⏳ Running `job 0` — 10 s")  # Telegram: 429, retry after 3 s
    await asyncio.gather(*(s.edit(f"✅ Done in 12 s: `job {n}` (exit 0)", final=True) for n, s in enumerate(calls)))
    refused = [c for c in fake.calls if c.method == "editMessageText" and c.status == 429]
    assert len(refused) == 1, f"{len(refused)} edits answered 429: the hold was not honoured"


async def test_an_edit_to_the_text_already_shown_is_no_failure(
    async_redis: aioredis.Redis, fake: FakeTelegram, channel: TelegramChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-run's final state may equal what an earlier attempt left: Telegram's 'message is not modified' is fine."""
    roomy_sends(monkeypatch, edit_rate=ROOMY)
    status = (await board_for(async_redis, channel, private(4402))).open("status:call-same")
    assert await status.post("⏳ Running `make` — 5 s")
    assert await status.edit("✅ Done in 9 s: `make` (exit 0)", final=True)
    assert await status.edit("✅ Done in 9 s: `make` (exit 0)", final=True)  # the same text again
    refused = [c for c in fake.calls if c.method == "editMessageText" and c.status != 200]
    assert [c.status for c in refused] == [400]  # Telegram refused it as not modified; the status counts it as shown
    assert status.message_id is not None
    assert fake.state.messages[(4402, int(status.message_id))] == "✅ Done in 9 s: <code>make</code> (exit 0)"


async def test_a_deleted_status_message_is_not_edited_again_and_again(
    async_redis: aioredis.Redis, fake: FakeTelegram, channel: TelegramChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    roomy_sends(monkeypatch, edit_rate=ROOMY)
    status = (await board_for(async_redis, channel, private(4403))).open("status:call-deleted")
    ticks = itertools.count()
    progress = Progress(
        status, ["make"], ProgressOptions(after_s=0.01, every_s=0.01), clock=lambda: float(next(ticks))
    )  # each reading a second later: every update has new text to show

    def refused() -> list[int]:
        return [c.seq for c in fake.calls if c.method == "editMessageText" and c.status == 400]

    async with progress:
        await wait_until(lambda: len(fake.sent(4403, "sendMessage")) == 1, "one message sent to chat 4403")
        [(key, _)] = [(k, t) for k, t in fake.state.messages.items() if k[0] == 4403]
        del fake.state.messages[key]  # the user deleted the status message
        await wait_until(lambda: len(refused()) >= 1, "a send refused by the fake")
        await asyncio.sleep(0.5)  # ~50 update ticks in which the call keeps running
    assert len(refused()) <= 2, f"{len(refused())} edits of a message that is gone"


# -- an edit or a post still in flight when the call ends --------------------------------------------------------


async def test_a_status_post_slower_than_the_call_is_not_left_saying_running(
    fake: FakeTelegram,
    channel: TelegramChannel,
    bwrap: Sandbox,
    tmp_path: Path,
    async_redis: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress_module, "FINAL_WAIT_S", 0.3)  # the same policy, in a shorter test
    conversation = private(4404)
    message = inbound(conversation)
    worker = make_drainer(async_redis, tmp_path, bwrap, shell_then("Built.", SLOW),
                          ChannelDeliverer({("telegram", "default"): channel}))  # fmt: skip
    fake.delay_next(1, 2.0, method="sendMessage")  # Telegram is slow to answer the status post
    await Ingestor(async_redis, QUEUE).ingest(message)
    drain = asyncio.create_task(worker.drain(message.session_key))
    await wait_until(
        lambda: not fake.state.plan, "the status post in flight (the fake's plan used up)"
    )  # the status post is in flight
    go(tmp_path, conversation)
    await asyncio.wait_for(drain, 30)
    await wait_until(
        lambda: len(fake.sent(4404, "sendMessage")) == 2, "the reply and the late status post in chat 4404"
    )  # the reply, and the status post landing late
    [(mid, text)] = statuses(fake, 4404).items()
    assert not text.startswith("⏳ Running"), f"message {mid} says {text!r} after the call ended"


async def test_a_stop_during_an_update_in_flight_still_ends_on_the_stopped_state(
    fake: FakeTelegram, channel: TelegramChannel, bwrap: Sandbox, tmp_path: Path, async_redis: aioredis.Redis
) -> None:
    conversation = private(4405)
    message = inbound(conversation)
    worker = make_drainer(async_redis, tmp_path, bwrap, shell_then("x", SLOW),
                          ChannelDeliverer({("telegram", "default"): channel}))  # fmt: skip
    await Ingestor(async_redis, QUEUE).ingest(message)
    drain = asyncio.create_task(worker.drain(message.session_key))
    await wait_until(lambda: len(statuses(fake, 4405)) == 1, "one status message in chat 4405")
    fake.delay_next(1, 3.0, method="editMessageText")  # the next update is slow to be answered
    await wait_until(
        lambda: not fake.state.plan, "the status edit in flight (the fake's plan used up)"
    )  # and is in flight now
    assert worker.cancel(message.session_key, "stopped on request")  # the user's /stop
    await asyncio.wait_for(drain, 30)
    await asyncio.sleep(3.5)  # the slow update is answered meanwhile
    [(mid, text)] = statuses(fake, 4405).items()
    stopped = [c for c in fake.sent(4405, "editMessageText") if c.params["text"].startswith("⏹ Stopped after ")]
    assert len(stopped) == 1  # the final state was made: the platform took it
    assert text.startswith("⏹ Stopped after "), f"message {mid} says {text!r} after the call was stopped"


# -- the worker's lease lost mid-call --------------------------------------------------------------------------


async def test_a_lease_lost_mid_call_leaves_no_status_saying_running(
    fake: FakeTelegram, channel: TelegramChannel, bwrap: Sandbox, tmp_path: Path, async_redis: aioredis.Redis
) -> None:
    queue = QUEUE.model_copy(update={"lease_ms": 900})  # renewed every 0.3 s: the loss is noticed at once
    conversation = private(4406)
    message = inbound(conversation)
    deliverer = ChannelDeliverer({("telegram", "default"): channel})
    first = make_drainer(async_redis, tmp_path, bwrap, shell_then("Built.", SLOW), deliverer, queue=queue)
    await Ingestor(async_redis, queue).ingest(message)
    drain = asyncio.create_task(first.drain_session(message.session_key))
    await wait_until(lambda: len(statuses(fake, 4406)) == 1, "one status message in chat 4406")
    await async_redis.delete(SessionKeys(message.session_key).lease)  # the lease lapsed: another worker may take it
    assert await asyncio.wait_for(drain, 30) is DrainOutcome.FENCED
    go(tmp_path, conversation)  # should the re-run run the command, it ends at once

    second = make_drainer(async_redis, tmp_path, bwrap, shell_then("Built.", SLOW), deliverer, queue=queue,
                          worker_id="w2")  # fmt: skip
    await asyncio.wait_for(second.drain(message.session_key), 30)
    assert fake.sent(4406, "sendMessage")[-1].params["text"] == "Built."  # the session was answered
    [(mid, text)] = statuses(fake, 4406).items()  # one status message: the re-run posted no second one
    assert not text.startswith("⏳ Running"), f"message {mid} says {text!r} after the run was answered"


# -- hostile commands, many commands, what the status never becomes --------------------------------------------


HOSTILE = [
    "echo '</code><b>x</b><a href=\"tg://user?id=1\">@admin</a> &amp; &lt;'; " + SLOW,
    "printf '*b* _i_ ~s~ ||sp|| [l](http://evil.example) \\\\'; " + SLOW,
    "echo `whoami` $(id) ```fence``` ; " + SLOW,
    "curl -H 'Authorization: Bearer {{secret:GITHUB_TOKEN}}' https://api.example/ ; " + SLOW,
    ": '" + "x" * 10_000 + " TAIL_sk_live_51Habcdefghijkl'; " + SLOW,
    "echo one\n\necho two\r\n\techo three\u2028echo four; " + SLOW,
    "echo '<!channel> @everyone <@U123>'; " + SLOW,
    *[f"sleep 0.{n}" for n in range(1, 10)],
]


async def test_hostile_commands_are_shown_escaped_cut_and_bounded_and_never_become_history(
    fake: FakeTelegram,
    channel: TelegramChannel,
    bwrap: Sandbox,
    tmp_path: Path,
    async_redis: aioredis.Redis,
) -> None:
    """Sixteen commands at once in a group chat (edit budget 0.2/s), with Markdown, HTML, backticks, newlines, a
    secret placeholder, a 10 kB command and mention syntax in them."""
    assert len(HOSTILE) == 16
    conversation = group()
    message = inbound(conversation)
    worker = make_drainer(async_redis, tmp_path, bwrap, shell_then("Built.", *HOSTILE),
                          ChannelDeliverer({("telegram", "default"): channel}))  # fmt: skip
    await Ingestor(async_redis, QUEUE).ingest(message)
    started = time.monotonic()
    drain = asyncio.create_task(worker.drain(message.session_key))
    await wait_until(
        lambda: len(fake.sent(GROUP_CHAT, "editMessageText")) >= 1, "an edit of the group's status message"
    )  # an update with the quick ones' ends
    go(tmp_path, conversation)
    await asyncio.wait_for(drain, 180)  # a guard against hanging: sixteen sandboxed commands on a loaded machine
    elapsed = time.monotonic() - started

    [(mid, html)] = statuses(fake, GROUP_CHAT).items()
    status_calls = [c for c in fake.calls if c.params.get("chat_id") == GROUP_CHAT and (
        (c.method == "sendMessage" and "⏳" in c.params.get("text", ""))
        or (c.method == "editMessageText" and c.params.get("message_id") == mid))]  # fmt: skip
    assert [c.status for c in status_calls if c.status != 200] == []  # no refusal: not one can't-parse, 429 or 400
    shown = check_html(html)  # what the group sees
    assert shown.startswith("✅ Done in "), shown
    assert '</code><b>x</b><a href="tg://user?id=1">@admin</a>' in shown  # shown as typed, not interpreted
    for text in [c.params["text"] for c in status_calls]:
        assert "x" * 61 not in text and "TAIL_sk_live" not in text  # the 10 kB command is cut at 60 characters
        assert all(len(line) <= 80 for line in check_html(text).splitlines()), text
        assert "\u2028" not in text and "\r" not in text  # one line per command
        assert "{{secret:GITHUB_TOKEN}}" in text  # the placeholder as the model wrote it, never a value
    assert "• … 10 more (" in shown  # six commands listed, the rest counted
    edits = [c for c in status_calls if c.method == "editMessageText"]
    assert len(edits) <= 1 + 0.2 * elapsed + 1 + 1, (len(edits), elapsed)  # the chat's edit budget, plus the final

    history = await history_of(async_redis, message)
    events = repr(await read_events(async_redis, message.session_key)).encode()
    for text in (history, events):
        assert "⏳ Running".encode() not in text and "✅ Done in".encode() not in text
    others = [t for (chat, m), t in fake.state.messages.items() if chat == GROUP_CHAT and m != mid]
    assert others == ["Built."] and len(fake.sent(GROUP_CHAT, "sendMessage")) == 2  # a status and the reply: no flood


async def test_many_sessions_in_one_chat_share_its_edit_budget(
    fake: FakeTelegram, channel: TelegramChannel, bwrap: Sandbox, tmp_path: Path, async_redis: aioredis.Redis
) -> None:
    """Four forum topics of one group run long calls at once: their edits together stay within the chat's budget
    (0.2/s, burst 1) and each status message still ends in its final state."""
    topics = [group(str(n)) for n in (21, 22, 23, 24)]
    deliverer = ChannelDeliverer({("telegram", "default"): channel})
    messages = [inbound(c, msg_id=f"m{n}") for n, c in enumerate(topics)]
    workers = [make_drainer(async_redis, tmp_path, bwrap, shell_then(f"Built {n}.", SLOW), deliverer,
                            worker_id=f"w{n}") for n in range(len(topics))]  # fmt: skip
    for message in messages:
        await Ingestor(async_redis, QUEUE).ingest(message)
    started = time.monotonic()
    drains = [asyncio.create_task(w.drain(m.session_key)) for w, m in zip(workers, messages, strict=True)]
    await wait_until(lambda: len(statuses(fake, GROUP_CHAT)) == len(topics), "a status message per topic", timeout=40)
    await wait_until(
        lambda: len(fake.sent(GROUP_CHAT, "editMessageText")) >= 2,
        "two edits of the group's status messages",
        timeout=40,
    )
    for conversation in topics:
        go(tmp_path, conversation)
    await asyncio.wait_for(asyncio.gather(*drains), 90)
    elapsed = time.monotonic() - started

    shown = statuses(fake, GROUP_CHAT)
    assert len(shown) == len(topics) and all(t.startswith("✅ Done in ") for t in shown.values()), shown
    edits = [c for c in fake.sent(GROUP_CHAT, "editMessageText") if c.params["message_id"] in shown]
    assert len(edits) <= 1 + 0.2 * elapsed + len(topics) + 1, (len(edits), elapsed)
    refused = [c for c in fake.calls if c.status != 200 and c.params.get("message_id") in shown]
    assert refused == []
    replies = [t for (chat, m), t in fake.state.messages.items() if chat == GROUP_CHAT and m not in shown]
    assert sorted(replies) == [f"Built {n}." for n in range(len(topics))]
    assert len(fake.sent(GROUP_CHAT, "sendMessage")) == 2 * len(topics)  # a status message and a reply per session


# -- other channels ---------------------------------------------------------------------------------------------


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(bot_token=BOT_TOKEN) as server:
        yield server


async def test_slack_status_never_pings_the_channel(async_redis: aioredis.Redis, slack: FakeSlack) -> None:
    adapter = make_channel(slack.api_url)
    try:
        conversation = dm()
        lease = await Lease(async_redis, worker_id="w1", lease_ms=30_000).acquire(conversation.session_key)
        assert lease is not None
        deliverer = ChannelDeliverer({("slack", "default"): adapter})
        outbox = Outbox(async_redis, lease, deliverer.perform)
        board = StatusBoard(deliverer.capabilities(conversation), conversation, outbox=outbox,
                            perform=deliverer.perform, buckets=None, run_id="run-1")  # fmt: skip
        status = board.open("status:call-slack")
        labels = ["echo '<!channel> <!here> <@U123> <!subteam^S1>' &amp; <https://evil.example|ok>"]
        progress = Progress(status, labels, ProgressOptions())
        assert await status.post(progress.text())
        assert await status.edit(progress.text("done"), final=True)
        sent = [c.params["text"] for c in slack.sent("chat.postMessage") + slack.sent("chat.update")]
        assert len(sent) == 2
        for text in sent:
            assert "<!" not in text and "<@" not in text and "<https" not in text, text
            assert "&lt;!channel&gt;" in text
    finally:
        await adapter.aclose()


async def test_the_web_chat_shows_a_slow_command_as_its_live_card_and_posts_no_notices(
    chat: Chat, bwrap: Sandbox, tmp_path: Path
) -> None:
    """The web chat shows tool calls as live cards: the running card is the progress, no notice message is posted
    (however long the command takes), and the reply stays the reply."""
    _, token = await chat.new_session()
    session = SessionKey(await chat.session_key(token))
    message_id = await chat.send(token, "build it", client_id="b1")
    channels = ChannelSet({("web", "default"): WebChannel(chat.publisher.publish)})
    models = ModelFactory(ProviderConfig())
    models.override("offline", ReplayModel(shell_then("Built.", SLOW), strict=False))
    tools = ToolRegistry(shell_tools(bwrap, FAST))
    runtime = Runtime(models=models, tools=tools, workspace_root=tmp_path,
                      gateway=ToolGateway(tools, workspace_root=tmp_path), model_backoff_s=0.0)  # fmt: skip
    served = agent(tools=("shell",))
    drainer = Drainer(chat.redis, QUEUE, runner=runtime.run_turn, deliverer=channels, agent_for=lambda m: served,
                      worker_id="w1", workspace_root=tmp_path)  # fmt: skip
    drain = asyncio.create_task(drainer.drain(session))
    keys = SessionKeys(session)

    async def entries() -> list[dict[bytes, bytes]]:
        return [fields for _, fields in await chat.redis.xrange(keys.web) or []]

    deadline = time.monotonic() + 20
    while not any(b'"state":"running"' in b"".join(fields.values()) for fields in await entries()):
        assert time.monotonic() < deadline, "the running card never came"
        await asyncio.sleep(0.05)
    await asyncio.sleep(FAST.progress_after_s * 6**2 * 1.2)  # past the time a second notice would have been due
    (workspace_for(tmp_path, session) / "go").write_text("")
    await asyncio.wait_for(drain, 30)

    mark = "⏳ Running".encode()
    assert not any(mark in b"".join(fields.values()) for fields in await entries())
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:  # a reload
        events: list[SSE] = []
        while not events or not (events[-1].event == "status" and (events[-1].data or {}).get("status") == "idle"):
            events += await read_sse(resp, 1)
    cards = [e.data["state"] for e in events if e.event == "tool" and e.data is not None]
    assert cards == ["running", "ok"], cards
    messages = [e.data for e in events if e.event == "message" and e.data is not None]
    assert [m["text"] for m in messages] == ["Built."] and messages[0]["reply_to"] == message_id


async def test_the_same_command_run_again_in_one_turn_really_runs_again(
    fake: FakeTelegram, channel: TelegramChannel, bwrap: Sandbox, tmp_path: Path, async_redis: aioredis.Redis
) -> None:
    conversation = private(4501)
    message = inbound(conversation)
    workspace = workspace_for(tmp_path, message.session_key)
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "n.txt").write_text("v1")
    steps = [
        calls_step(("shell", {"commands": ["cat n.txt"]}), step=1),
        calls_step(("shell", {"commands": ["printf 'v%s' 2 > n.txt"]}), step=2),
        calls_step(("shell", {"commands": ["cat n.txt"]}), step=3),  # the model checks its change
        answer_step("Changed.", step=4),
    ]
    worker = make_drainer(async_redis, tmp_path, bwrap, steps, ChannelDeliverer({("telegram", "default"): channel}))
    await Ingestor(async_redis, QUEUE).ingest(message)
    await asyncio.wait_for(worker.drain(message.session_key), 60)
    assert (workspace / "n.txt").read_text() == "v2"  # the change was made
    history = await history_of(async_redis, message)
    assert b"Changed." in history
    assert b"v2" in history, "the second `cat n.txt` answered with the first one's output (v1)"
