"""``switchboard retention run`` and ``switchboard keys``: retention sweeps and data-key rotation from the shell.

``retention run [--dry-run]`` applies the YAML file's ``retention:`` rules once and prints counts per tenant and kind.
``keys new [--id ID]`` prints a fresh data key; ``keys rotate [--dry-run]`` re-seals what is stored under older keys
(``docs/operations/retention.md``).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from switchboard.cli.sessions import redis_url_for, with_redis
from switchboard.core.sealing import DATA_KEYS_ENV, SealError, new_key
from switchboard.errors import ConfigError
from switchboard.settings import Settings

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["keys_new_command", "keys_rotate_command", "retention_run_command"]


def retention_run_command(settings: Settings, *, dry_run: bool) -> int:
    """One retention sweep now; returns the exit code."""
    from switchboard.cli.worker import retention_plan, retention_reaches_memory
    from switchboard.control.memory import close_store, memory_store

    try:
        url = redis_url_for(settings)
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2
    if not settings.file.retention.active:
        print("no retention rule is set (retention: in the YAML file): nothing to remove")
        return 0
    try:
        memory = memory_store(settings) if retention_reaches_memory(settings) else None
        plan = retention_plan(settings, memory=memory)
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2

    async def go(redis: aioredis.Redis) -> int:
        try:
            report = await plan.sweep(redis, dry_run=dry_run).run()
        except SealError as err:
            print(f"switchboard: {err}; nothing more removed", file=sys.stderr)
            return 2
        finally:
            if memory is not None:
                await close_store(memory)
        print("\n".join(report.lines()))
        return 0

    return with_redis(url, go)


def keys_new_command(key_id: str | None) -> int:
    """Print a fresh key entry for ``SWITCHBOARD_DATA_KEYS``."""
    try:
        print(new_key(key_id or time.strftime("k%Y%m%d", time.gmtime())))
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2
    return 0


def keys_rotate_command(settings: Settings, *, dry_run: bool) -> int:
    """Re-seal what is stored under older keys (Redis, memory) with the current one; prints counts per store."""
    from switchboard.cli.worker import memory_tenants
    from switchboard.control.memory import close_store, memory_store
    from switchboard.queue.rotation import rotate_redis
    from switchboard.queue.sealed import data_keyring

    try:
        keyring = data_keyring()
        url = redis_url_for(settings)
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2
    if keyring is None:
        print(f"switchboard: {DATA_KEYS_ENV} is not set: there is no key to rotate to", file=sys.stderr)
        return 2

    try:
        memory = memory_store(settings)
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2

    async def go(redis: aioredis.Redis) -> int:
        try:
            counts = await rotate_redis(redis, keyring, dry_run=dry_run)
            if not dry_run:
                for tenant in memory_tenants(settings):
                    counts["memory"] += await memory.rotate(tenant)
        except SealError as err:
            print(f"switchboard: {err}", file=sys.stderr)
            return 2
        finally:
            await close_store(memory)
        verb = "would re-seal" if dry_run else "re-sealed"
        print(f"{verb} under key {keyring.current}:")
        for store in ("history", "approvals"):
            print(f"  {store}: {counts[store]}")
        print("  memory: not counted in a dry run" if dry_run else f"  memory: {counts['memory']}")
        return 0

    return with_redis(url, go)
