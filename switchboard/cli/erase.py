"""``switchboard erase``: remove a person's, a session's or a whole tenant's data from every store.

Prints what it removed per store (counts, never content), the memory store included, and records one audit fact
(``docs/operations/retention.md``).
"""

from __future__ import annotations

import getpass
import sys
from typing import TYPE_CHECKING

from switchboard.cli.sessions import redis_url_for, with_redis
from switchboard.errors import ConfigError
from switchboard.settings import Settings
from switchboard.types import SessionKey

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["erase_command"]


def erase_command(
    settings: Settings, tenant: str, *, user: str | None, session: str | None, dry_run: bool, by: str | None
) -> int:
    """Erase one scope of ``tenant``; returns the exit code (2: bad input, nothing changed)."""
    from switchboard.control.memory import close_store, memory_store
    from switchboard.core.workspaces.s3 import build_workspace_store
    from switchboard.queue.erasure import Eraser

    if user is not None and session is not None:
        print("switchboard: give --user or --session, not both", file=sys.stderr)
        return 2
    if not tenant or "/" in tenant:
        print("switchboard: --tenant needs a tenant id (no '/')", file=sys.stderr)
        return 2
    try:
        url = redis_url_for(settings)
        store = build_workspace_store(settings.workspace_path, settings.workspaces)
        memory = memory_store(settings)
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2
    who = by or f"cli:{getpass.getuser()}"

    async def go(redis: aioredis.Redis) -> int:
        try:
            eraser = Eraser(redis, store, memory=memory, dry_run=dry_run)
            try:
                report = await eraser.erase(tenant, user=user, session=SessionKey(session) if session else None, by=who)
            except (ValueError, ConfigError) as err:
                print(f"switchboard: {err}; nothing erased", file=sys.stderr)
                return 2
            print("\n".join(report.lines()))
            return 0
        finally:
            await store.aclose()
            await close_store(memory)

    return with_redis(url, go)
