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

    from switchboard.core.workspaces.store import WorkspaceStore
    from switchboard.queue.retention import RetentionPlan

__all__ = ["keys_new_command", "keys_rotate_command", "retention_plan", "retention_run_command"]


def retention_plan(settings: Settings, workspace_store: WorkspaceStore | None = None) -> RetentionPlan:
    """The YAML file's retention rules over this deployment's stores.

    The memory store is opened only for a memory or knowledge rule; the tenants of the projects are looked at even
    when Redis holds nothing of them.
    """
    from switchboard.cli.worker import memory_store
    from switchboard.core.workspaces.store import LocalWorkspaces
    from switchboard.queue.retention import RetentionPlan

    config = settings.file.retention
    kinds = {
        kind
        for rules in (config.defaults, *config.tenants.values())
        for kind in ("memory", "knowledge")
        if getattr(rules, kind) is not None
    }
    return RetentionPlan(
        config,
        workspaces=workspace_store or LocalWorkspaces(settings.workspace_path),
        memory=memory_store(settings) if kinds else None,
        tenants=tuple(memory_tenants(settings)),
    )


def retention_run_command(settings: Settings, *, dry_run: bool) -> int:
    """One retention sweep now; returns the exit code."""
    try:
        url = redis_url_for(settings)
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2
    if not settings.file.retention.active:
        print("no retention rule is set (retention: in the YAML file): nothing to remove")
        return 0
    try:
        plan = retention_plan(settings)
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2

    async def go(redis: aioredis.Redis) -> int:
        try:
            report = await plan.sweep(redis, dry_run=dry_run).run()
        except SealError as err:
            print(f"switchboard: {err}; nothing more removed", file=sys.stderr)
            return 2
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


def memory_tenants(settings: Settings) -> list[str]:
    """The tenants whose memory a command walks: those of the projects, of the agents (knowledge) and of the rules."""
    found = {project.tenant for project in settings.file.projects.values()}
    found |= {settings.file.agent_tenant(name) or "default" for name in settings.file.agents}
    return sorted(found | set(settings.file.retention.tenants))


def keys_rotate_command(settings: Settings, *, dry_run: bool) -> int:
    """Re-seal what Redis holds under older keys with the current one; prints counts per store."""
    from switchboard.cli.worker import memory_store
    from switchboard.core.memory.store import SQLiteMemoryStore
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
            if isinstance(memory, SQLiteMemoryStore):
                memory.close()
        verb = "would re-seal" if dry_run else "re-sealed"
        print(f"{verb} under key {keyring.current}:")
        for store in ("history", "approvals"):
            print(f"  {store}: {counts[store]}")
        print("  memory: not counted in a dry run" if dry_run else f"  memory: {counts['memory']}")
        return 0

    return with_redis(url, go)
