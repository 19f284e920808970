"""``switchboard sessions list|show|stop``: what the sessions are doing and what was said, from any terminal.

Next to ``switchboard run`` (``make run``) no URL needs copying: ``run`` writes its embedded server's URL to
``$SWITCHBOARD_DATA_DIR/redis.url`` while it serves, and these commands read it when ``SWITCHBOARD_REDIS_URL``
is not set.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, assert_never

from switchboard.cli.checks import REDIS_URL_FILE, embedded_url, redacted_url
from switchboard.errors import ConfigError
from switchboard.settings import Settings

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from switchboard.control import SessionView, TranscriptItem

__all__ = ["REDIS_URL_FILE", "SessionsQuery", "redis_url_for", "sessions_command", "with_redis"]


def redis_url_for(settings: Settings) -> str:
    """``SWITCHBOARD_REDIS_URL``, else the embedded server of a ``switchboard run`` using this data directory.

    Raises:
        ConfigError: neither is there.
    """
    if settings.redis_url:
        return settings.redis_url
    url = embedded_url(settings)
    if not url:
        raise ConfigError(
            f"no Redis to read sessions from: SWITCHBOARD_REDIS_URL is not set and no `switchboard run` is serving "
            f"an embedded server from {settings.data_path} (start it, or run this where it runs, or set "
            "SWITCHBOARD_DATA_DIR to its data directory)",
            field="redis_url",
        )
    return url


def with_redis(url: str, body: Callable[[aioredis.Redis], Awaitable[int]]) -> int:
    """Run ``body`` with a client of ``url``; returns its exit code (1, said on stderr, when Redis is unreachable)."""
    from redis.exceptions import RedisError

    from switchboard.queue.connection import as_redis, async_client

    async def go() -> int:
        redis = as_redis(async_client(url))
        try:
            return await body(redis)
        except (RedisError, OSError) as err:
            print(f"switchboard: cannot reach Redis at {redacted_url(url)}: {err}", file=sys.stderr)
            return 1
        finally:
            await redis.aclose()

    return asyncio.run(go())


@dataclass(frozen=True, slots=True)
class SessionsQuery:
    """What ``sessions list|show`` print: how many, which sessions (list), the transcript or the raw log (show)."""

    limit: int = 50
    channel: str | None = None
    agent: str | None = None
    tenant: str | None = None
    state: str | None = None
    events: bool = False


def sessions_command(settings: Settings, action: str, key: str | None, query: SessionsQuery) -> int:
    """Run one ``sessions`` subcommand (``list``, ``show KEY``, ``stop KEY``); returns the exit code.

    ``list`` and ``show`` read through the control service the console uses (every tenant): the same states, the
    same transcript.
    """
    from switchboard.control import ControlError, ControlService, OperatorScope
    from switchboard.core.sealing import SealError
    from switchboard.queue.cancellation import request_stop
    from switchboard.queue.ingest import Ingestor
    from switchboard.queue.keys import SessionKeys
    from switchboard.queue.sessions import timeline
    from switchboard.types import SessionKey

    scope = OperatorScope.everything("cli")

    async def go(redis: aioredis.Redis) -> int:
        service = ControlService(redis, settings, Ingestor(redis, settings.queue))
        if action == "list":
            try:
                rows = await service.sessions(
                    scope,
                    limit=query.limit,
                    channel=query.channel,
                    agent=query.agent,
                    tenant=query.tenant,
                    state=query.state,
                )
            except ControlError as err:
                print(f"switchboard: {err}", file=sys.stderr)
                return 2
            if not rows:
                print("no sessions yet" if not _filtered(query) else "no session matches")
            for row in rows:
                print(_format_row(row))
            return 0
        assert key is not None
        if action == "stop":
            if await redis.zscore(SessionKeys(SessionKey(key)).shard.sessions, key) is None:
                print(f"switchboard: no such session: {key} (see `switchboard sessions list`)", file=sys.stderr)
                return 1
            heard = await request_stop(redis, SessionKey(key), reason="stopped by an operator")
            print(f"stop sent to {heard} worker(s); the running turn of {key} (if any) stops now")
            return 0 if heard else 1
        if query.events:
            events = await timeline(redis, SessionKey(key), count=query.limit)
            if not events:
                print(f"switchboard: no such session: {key} (see `switchboard sessions list`)", file=sys.stderr)
                return 1
            for event in events:
                print(_format_event(event))
            return 0
        try:
            view = await service.session(scope, key)
            lines = await service.transcript(scope, key, limit=query.limit)
        except ControlError:
            print(f"switchboard: no such session: {key} (see `switchboard sessions list`)", file=sys.stderr)
            return 1
        except SealError as err:
            print(f"switchboard: {err}", file=sys.stderr)
            return 2
        controlled = f" by {view.controlled_by}" if view.controlled_by else ""
        print(f"{view.key}  channel={view.channel}  state={view.state}{controlled}")
        for line in lines:
            print(_format_line(line))
        if not lines:
            print("(nothing said yet)")
        return 0

    return with_redis(redis_url_for(settings), go)


def _filtered(query: SessionsQuery) -> bool:
    return any(v is not None for v in (query.channel, query.agent, query.tenant, query.state))


def _format_row(row: SessionView) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.last_activity)) if row.last_activity else "-"
    return (
        f"{row.key}  {when}  channel={row.channel}  state={row.state}  waiting={row.inbox_depth}  "
        f"received={row.received}  dead_letters={row.dead_letters}"
    )


_CONTROL = dict.fromkeys([*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)], "\ufffd")
"""Terminal control characters (not newline, not tab): outside text must not drive the operator's terminal."""


def _printable(text: str) -> str:
    return text.translate(_CONTROL)


def _indented(text: str) -> str:
    return _printable(text).replace("\n", "\n" + " " * 14)


def _format_line(line: TranscriptItem) -> str:
    """One transcript line for a terminal: time, who, what (outside text with its control characters replaced)."""
    when = time.strftime("%H:%M:%S", time.localtime(line.at)) if line.at else "-"
    match line.kind:
        case "user":
            what = f"user {line.actor}: {_indented(line.text)}"
        case "agent":
            what = f"agent: {_indented(line.text)}"
        case "tool_call":
            arguments = json.dumps(line.arguments, ensure_ascii=False) if line.arguments is not None else ""
            status = {True: "ok", False: "failed", None: "?"}[line.ok]
            what = f"tool {line.tool}({_printable(arguments)}) {status}"
            if line.result is not None:
                untrusted = " (untrusted)" if line.untrusted else ""
                what += f"\n{'':14}result{untrusted}: {_indented(line.result)}"
        case "approval":
            what = f"approval {line.tool or 'reply'}: {_printable(line.text)}"
        case "operator":
            what = f"operator {line.actor} {line.action}" + (f": {_indented(line.text)}" if line.text else "")
        case "notice":
            what = f"notice: {_printable(line.text)}"
        case _:
            assert_never(line.kind)
    if line.redacted:
        what += " [withheld]"
    kinds = ", ".join(e.kind for e in line.events)
    return f"{when}  {what}" + (f"\n{'':14}events: {kinds}" if kinds else "")


def _format_event(event: dict[str, Any]) -> str:
    at = event.get("at")
    when = time.strftime("%H:%M:%S", time.localtime(float(at))) + f".{int(float(at) * 1000) % 1000:03d}" if at else "-"
    kind = event.get("kind", "?")
    rest = {k: v for k, v in event.items() if k not in {"at", "kind", "id", "ts"}}
    return f"{when}  {kind:<18} " + " ".join(f"{k}={v}" for k, v in rest.items())
