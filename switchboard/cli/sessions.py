"""``switchboard sessions list|show|stop``: what the sessions are doing, from any terminal.

Next to ``switchboard run`` (``make run``) no URL needs copying: ``run`` writes its embedded server's URL to
``$SWITCHBOARD_DATA_DIR/redis.url`` while it serves, and these commands read it when ``SWITCHBOARD_REDIS_URL``
is not set.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from switchboard.cli.checks import REDIS_URL_FILE, embedded_url, redacted_url
from switchboard.errors import ConfigError
from switchboard.settings import Settings

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from switchboard.queue.sessions import SessionSummary

__all__ = ["REDIS_URL_FILE", "redis_url_for", "sessions_command", "with_redis"]


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

    from switchboard.queue.connection import async_client

    async def go() -> int:
        redis = async_client(url)
        try:
            return await body(redis)
        except (RedisError, OSError) as err:
            print(f"switchboard: cannot reach Redis at {redacted_url(url)}: {err}", file=sys.stderr)
            return 1
        finally:
            await redis.aclose()

    return asyncio.run(go())


def sessions_command(settings: Settings, action: str, key: str | None, limit: int) -> int:
    """Run one ``sessions`` subcommand (``list``, ``show KEY``, ``stop KEY``); returns the exit code."""
    from switchboard.queue.cancellation import request_stop
    from switchboard.queue.keys import GlobalKeys
    from switchboard.queue.sessions import list_sessions, timeline
    from switchboard.types import SessionKey

    async def go(redis: aioredis.Redis) -> int:
        if action == "list":
            rows = await list_sessions(redis, limit=limit)
            if not rows:
                print("no sessions yet")
            for row in rows:
                print(_format_row(row))
            return 0
        assert key is not None
        if action == "stop":
            if await redis.zscore(GlobalKeys().sessions, key) is None:
                print(f"switchboard: no such session: {key} (see `switchboard sessions list`)", file=sys.stderr)
                return 1
            heard = await request_stop(redis, SessionKey(key), reason="stopped by an operator")
            print(f"stop sent to {heard} worker(s); the running turn of {key} (if any) stops now")
            return 0 if heard else 1
        events = await timeline(redis, SessionKey(key), count=limit)
        if not events:
            print(f"switchboard: no such session: {key} (see `switchboard sessions list`)", file=sys.stderr)
            return 1
        for event in events:
            print(_format_event(event))
        return 0

    return with_redis(redis_url_for(settings), go)


def _format_row(row: SessionSummary) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.last_activity)) if row.last_activity else "-"
    return (
        f"{row.key}  {when}  channel={row.channel}  status={row.status}  waiting={row.inbox_depth}  "
        f"received={row.received}  dead_letters={row.dead_letters}"
    )


def _format_event(event: dict[str, Any]) -> str:
    at = event.get("at")
    when = time.strftime("%H:%M:%S", time.localtime(float(at))) + f".{int(float(at) * 1000) % 1000:03d}" if at else "-"
    kind = event.get("kind", "?")
    rest = {k: v for k, v in event.items() if k not in {"at", "kind", "id", "ts"}}
    return f"{when}  {kind:<18} " + " ".join(f"{k}={v}" for k, v in rest.items())
