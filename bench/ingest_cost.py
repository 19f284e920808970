"""Ingest cost: Redis commands per accepted message and Redis memory per accepted web chat message.

Deterministic (no load, no timing): a private embedded server, one ``Ingestor`` called directly, ``N`` messages
of each kind, and the server's own counters around them:

- commands per message: ``INFO commandstats`` calls (commands run inside the ingest script count, ``EVALSHA``
  itself too) divided by ``N``, for a plain Telegram message (abuse limits off), the same with every abuse limit
  on (set far above the load), and a web chat message (limits on, with its echo and idempotency key, as
  ``POST /api/chat/messages`` sends it);
- memory per web chat message: ``INFO memory`` ``used_memory`` after minus before ``N`` web chat messages of
  about 1.4 KB of text over 64 sessions (no worker runs: each message waits in its inbox, as under a burst),
  divided by ``N``.

    python -m bench.ingest_cost            # N = 2000
    python -m bench.ingest_cost --quick    # N = 100
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import uuid
from pathlib import Path

import redis
import redis.asyncio as aioredis

from bench._harness import SUMMARY_HEADERS, Row, parser, render_table, verdicts
from switchboard.channels.web.adapter import WebChannel, parse_post
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.queue.embedded import EmbeddedRedis
from switchboard.queue.ingest import Ingestor
from switchboard.settings import LimitsSettings, QueueSettings

_HIGH = 1_000_000_000
LIMITS_ON = LimitsSettings(
    messages_per_session_per_minute=_HIGH, messages_per_sender_per_minute=_HIGH, inbox_depth=_HIGH
)
LIMITS_OFF = LimitsSettings(messages_per_session_per_minute=0, messages_per_sender_per_minute=0, inbox_depth=0)
WEB_SESSIONS = 64
TARGET_BYTES = 2048
"""Issue #20's target for a web chat message of ~1.4 KB of text."""
TEXT = ("benchmark " + "lorem ipsum dolor sit amet " * 80)[:1400]


def _commands(client: redis.Redis) -> dict[str, int]:
    return {name: int(v["calls"]) for name, v in client.info("commandstats").items()}


def _telegram(n: int) -> InboundMessage:
    return InboundMessage(
        dedup_key=f"u{n}",
        conversation=ConversationRef(agent="assistant", channel="telegram", conversation=str(n % 1000)),
        sender=Sender(id=str(n % 1000), name="User"),
        text="hello there",
    )


def _web(n: int, conversations: list[str]) -> tuple[InboundMessage, dict[str, str]]:
    """A web chat draft and its echo, built as ``POST /api/chat/messages`` builds them."""
    body = json.dumps({"client_id": f"bench-{n}", "text": TEXT}).encode()
    conversation = ConversationRef(agent="assistant", channel="web", conversation=conversations[n % len(conversations)])
    draft = WebChannel(None).inbound(conversation, parse_post(body))
    shown = {"text": draft.text, "client_id": draft.dedup_key}
    return draft, {"type": "user", "data": json.JSONEncoder(ensure_ascii=False).encode(shown)}


async def _measure(url: str, n: int) -> dict[str, float]:
    sync = redis.Redis.from_url(url)
    client = aioredis.Redis.from_url(url)
    queue = QueueSettings(name="bench")
    out: dict[str, float] = {}
    conversations = [uuid.uuid4().hex for _ in range(WEB_SESSIONS)]
    try:
        cases = (
            ("telegram, limits off", LIMITS_OFF, False),
            ("telegram, limits on", LIMITS_ON, False),
            ("web chat, limits on", LIMITS_ON, True),
        )
        for label, limits, web in cases:
            sync.flushall()
            ingestor = Ingestor(client, queue, limits)
            # warm-up: load the script and create the sessions (their first message pays for their keys)
            for i in range(WEB_SESSIONS):
                if web:
                    draft, echo = _web(10_000_000 + i, conversations)
                    await ingestor.ingest(draft, echo=echo, idempotent=True)
                else:
                    await ingestor.ingest(_telegram(10_000_000 + i))
            sync.config_resetstat()
            before = sync.info("memory")["used_memory"]
            for i in range(n):
                if web:
                    draft, echo = _web(i, conversations)
                    result = await ingestor.ingest(draft, echo=echo, idempotent=True)
                else:
                    result = await ingestor.ingest(_telegram(i))
                assert not (result.duplicate or result.limited or result.reused)
            after = sync.info("memory")["used_memory"]
            calls = _commands(sync)
            calls.pop("cmdstat_config", None)
            calls.pop("cmdstat_info", None)
            total = sum(calls.values()) / n
            print(f"{label}: {total:.1f} commands per message")
            for name, count in sorted(calls.items(), key=lambda kv: -kv[1]):
                print(f"    {name.removeprefix('cmdstat_'):<10} {count / n:6.2f}")
            out[label] = total
            if web:
                out["web chat bytes per message"] = (after - before) / n
                print(f"web chat: {(after - before) / n:.0f} bytes of used_memory per message ({len(TEXT)} chars)")
    finally:
        await client.aclose()
        sync.close()
    return out


def run(argv: list[str] | None = None) -> list[Row]:
    """Measure, print the figures, return the summary rows."""
    p = parser(__doc__.splitlines()[0] if __doc__ else "ingest cost")
    p.add_argument("--n", type=int, default=None, help="messages per case (default 2000, quick 100)")
    ns = p.parse_args(argv)
    n = ns.n or (100 if ns.quick else 2000)
    with tempfile.TemporaryDirectory(prefix="sb-cost-") as tmp, EmbeddedRedis(Path(tmp) / "redis") as server:
        figures = asyncio.run(_measure(server.url, n))
    rows = [Row("ingest_cost", f"Redis commands per message, {label}", f"{figures[label]:.1f}", "(report)", None)
            for label in ("telegram, limits off", "telegram, limits on", "web chat, limits on")]  # fmt: skip
    size = figures["web chat bytes per message"]
    rows.append(
        Row("ingest_cost", f"Redis bytes per web chat message ({len(TEXT)} chars)", f"{size:.0f}", f"≤ {TARGET_BYTES}",
            size <= TARGET_BYTES)
    )  # fmt: skip
    return verdicts(rows, ns.quick)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.ingest_cost``."""
    print(render_table("Summary", SUMMARY_HEADERS, [r.cells() for r in run(argv)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
