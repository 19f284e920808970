"""``switchboard migrate [--dry-run] [--force]``: move the data of the release before to the sharded key layout.

Runs against ``SWITCHBOARD_REDIS_URL``; without one, against the embedded server of ``switchboard run``'s data
directory (started for the migration and stopped after). Refuses while a worker is alive (``--force`` overrides);
prints what it moved. docs/operations/production.md ("Upgrading to the sharded layout").
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import redis

from switchboard.errors import ConfigError, LayoutError
from switchboard.queue.connection import SyncClient, sync_client
from switchboard.queue.migrations import LAYOUT, UPGRADE_DOCS, live_workers, migrate, read_layout
from switchboard.settings import Settings

__all__ = ["migrate_command"]


def _lines(tally: collections.Counter[str]) -> list[str]:
    return [f"  {count:>9,}  {label}" for label, count in sorted(tally.items())]


def _run(client: redis.Redis, *, dry_run: bool, force: bool) -> int:
    alive = live_workers(client)
    if alive and not force:
        print(
            f"switchboard: {len(alive)} worker(s) still running ({', '.join(sorted(alive)[:5])}): stop every worker "
            "and web process first (or pass --force if they are gone and their liveness keys simply not expired)",
            file=sys.stderr,
        )
        return 1
    before = read_layout(client)
    try:
        tally = migrate(client, dry_run=dry_run)
    except LayoutError as err:
        if err.layout == str(LAYOUT):
            print(f"{err}; nothing changed")
            return 0
        print(f"switchboard: {err}", file=sys.stderr)
        return 1
    if dry_run:
        print(f"dry run: the data is in layout {before or 1}; nothing changed. Keys `switchboard migrate` would move:")
        print("\n".join(_lines(tally)) or "  none")
        return 0
    resumed = " (resumed a migration that had stopped half-way)" if before else ""
    print(f"migrated to key layout {LAYOUT}{resumed}:")
    print("\n".join(_lines(tally)) or "  nothing to move: no data of the release before")
    print("start the new release's web and worker processes now")
    return 0


def _run_on(client: SyncClient, *, dry_run: bool, force: bool) -> int:
    if isinstance(client, redis.RedisCluster):
        raise ConfigError(
            "switchboard migrate runs on the single server the release before wrote its data to, not on a Redis "
            f"Cluster: migrate there first, then move the data to the cluster; see {UPGRADE_DOCS}",
            field="redis_url",
        )
    return _run(client, dry_run=dry_run, force=force)


def migrate_command(settings: Settings, *, dry_run: bool, force: bool) -> int:
    """``switchboard migrate``; the exit status."""
    from switchboard.cli.checks import embedded_url

    url = settings.redis_url or embedded_url(settings)
    if url:
        client = sync_client(url)
        try:
            return _run_on(client, dry_run=dry_run, force=force)
        finally:
            client.close()
    data = settings.data_path / "redis"
    if not data.is_dir():
        raise ConfigError(
            f"no Redis to migrate: SWITCHBOARD_REDIS_URL is not set and {data} holds no embedded server's data "
            f"(set SWITCHBOARD_DATA_DIR to `switchboard run`'s data directory); see {UPGRADE_DOCS}",
            field="redis_url",
        )
    return _with_embedded(data, dry_run=dry_run, force=force)


def _with_embedded(data: Path, *, dry_run: bool, force: bool) -> int:
    from switchboard.queue.embedded import EmbeddedRedis

    with EmbeddedRedis(data) as server:
        client = sync_client(server.url)
        try:
            return _run_on(client, dry_run=dry_run, force=force)
        finally:
            client.close()
