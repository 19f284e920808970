"""Streaming a 20,000-character reply to Telegram: how many platform calls the streaming policy makes.

The real Telegram adapter against the fake Bot API, the real drain and a real Redis (embedded): a model streams
the reply in 40-character deltas at ``--chars-per-s``. Side by side in one run: a group (streaming by editing a
preview under the shared edit budget, ``edit_rate`` 0.2/s with a burst of 1) and a private chat (drafts,
``edit_rate`` 1/s). For each: deltas (what editing on every delta would cost), the edits or drafts made, the
budget's bound (burst + rate × streaming time), the messages of the final reply, whether it arrived complete, and
the wall time (the group's final parts wait for Telegram's 20 messages a minute there).

    python -m bench.streaming
    python -m bench.streaming --chars-per-s 2000
    python -m bench.streaming --quick
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from switchboard.channels.render.telegram import visible_text
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.telegram.fake.platform import FakeTelegram
from switchboard.channels.telegram.settings import TelegramSettings
from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.queue.connection import async_client
from switchboard.queue.embedded import EmbeddedRedis
from switchboard.queue.ingest import Ingestor
from switchboard.settings import QueueSettings
from switchboard.worker.drain import Drainer

TOKEN = "123456:BENCH-token-abcdefghijklmnopqrstuv"
REPLY = " ".join(f"word{n}" for n in range(3000))[:20_000]
DELTA = 40
AGENT = Agent(name="assistant", profile=AgentProfile(name="A"), instructions="Answer.")


def _runner(chars_per_s: float):  # type: ignore[no-untyped-def]
    async def stream(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        started = time.monotonic()
        for n, start in enumerate(range(0, len(REPLY), DELTA)):
            await asyncio.sleep(max(0.0, started + n * DELTA / chars_per_s - time.monotonic()))
            await sink.delta(REPLY[start : start + DELTA])
        return TurnResult(text=REPLY, steps=1)

    return stream


async def _one(url: str, fake: FakeTelegram, chat: int, kind: str, chars_per_s: float) -> str:
    redis = async_client(url)
    queue = QueueSettings(name=f"bench{chat}", max_attempts=1)
    settings = TelegramSettings.model_validate({"bot_token": TOKEN, "api_base_url": fake.base_url})
    channel = TelegramChannel(settings, account="default")
    extra = {"chat_id": str(chat), "chat_type": kind}
    conversation = ConversationRef(agent="assistant", channel="telegram", conversation=str(chat), extra=extra)
    message = InboundMessage(dedup_key=f"b{chat}", conversation=conversation, sender=Sender(id="u"), text="go")
    await Ingestor(redis, queue).ingest(message)
    drainer = Drainer(
        redis,
        queue,
        runner=_runner(chars_per_s),
        deliverer=ChannelDeliverer({("telegram", "default"): channel}),
        agent_for=lambda _: AGENT,
        worker_id="bench",
    )
    started = time.monotonic()
    await drainer.drain(message.session_key)
    elapsed = time.monotonic() - started
    caps = channel.capabilities_for(conversation)
    await channel.aclose()
    await redis.aclose()
    streaming_s = len(REPLY) / chars_per_s
    bound = caps.edit_rate.burst + caps.edit_rate.per_s * streaming_s
    method = "editMessageText" if caps.streaming == "edits" else "sendMessageDraft"
    calls = len(fake.sent(chat, method)) - (1 if caps.streaming == "edits" else 0)  # not the final edit
    texts = [visible_text(text) for (c, _), text in sorted(fake.state.messages.items()) if c == chat]
    complete = " ".join(texts).split() == REPLY.split()
    return (
        f"{kind:<11} {len(REPLY) // DELTA:>6} {method:<17} {calls:>5} {bound:>6.1f} {len(texts):>8} "
        f"{'yes' if complete else 'NO':>8} {elapsed:>8.1f}"
    )


async def main(chars_per_s: float) -> None:
    """Run both chats and print one row each."""
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp), port=0)
        server.start()
        try:
            async with FakeTelegram(token=TOKEN) as fake:
                rows = [
                    await _one(server.url, fake, -100500, "supergroup", chars_per_s),
                    await _one(server.url, fake, 500, "private", chars_per_s),
                ]
        finally:
            server.stop()
    print(f"20,000-character reply streamed at {chars_per_s:g} chars/s in {DELTA}-character deltas")
    print(f"{'chat':<11} {'deltas':>6} {'call':<17} {'calls':>5} {'bound':>6} {'messages':>8} {'complete':>8} {'s':>8}")
    for row in rows:
        print(row)


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--chars-per-s", type=float, default=1000.0)
    cli.add_argument("--quick", action="store_true", help="stream at 10,000 chars/s (figures less telling)")
    ns = cli.parse_args()
    asyncio.run(main(10_000.0 if ns.quick else ns.chars_per_s))
