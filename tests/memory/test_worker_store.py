"""The worker and the PostgreSQL memory store: no pgvector stops it at start-up; its pool closes when it stops."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import asyncpg
import pytest

from switchboard.cli.worker import run_worker
from switchboard.errors import ConfigError
from switchboard.settings import load_settings
from tests.tables.postgres import postgres_dsn  # noqa: F401  (Debian's server, which has no pgvector)

CONFIG = """
default_agent: shop
projects:
  orders: {tenant: default}
memory:
  store: postgres
  dsn_env: MEMORY_DSN
agents:
  shop:
    profile: {name: Shop}
    instructions: test
    projects: [orders]
"""


async def test_a_worker_on_a_server_without_pgvector_refuses_to_start_naming_it(
    base_env: dict[str, str],
    postgres_dsn: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Path(base_env["SWITCHBOARD_CONFIG"]).write_text(CONFIG)
    monkeypatch.setenv("MEMORY_DSN", postgres_dsn)
    settings = load_settings(base_env | {"SWITCHBOARD_MODEL": "offline"})
    with pytest.raises(ConfigError, match=r"(?s)PostgreSQL .*pgvector.*install pgvector on the server"):
        await asyncio.wait_for(run_worker(settings, asyncio.Event()), 30)


async def _connections(dsn: str, application: str) -> int:
    con = await asyncpg.connect(dsn)
    try:
        return int(await con.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", application))
    finally:
        await con.close()


async def test_the_worker_opens_the_memory_store_at_start_and_closes_it_on_stop(
    base_env: dict[str, str], pgvector_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    application = f"sb-memory-{uuid.uuid4().hex[:8]}"
    Path(base_env["SWITCHBOARD_CONFIG"]).write_text(CONFIG)
    monkeypatch.setenv("MEMORY_DSN", f"{pgvector_dsn}&application_name={application}")
    settings = load_settings(base_env | {"SWITCHBOARD_MODEL": "offline"})
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(settings, stop))
    try:
        for _ in range(600):  # opened before the worker takes a message: no turn needed
            if await _connections(pgvector_dsn, application) or worker.done():
                break
            await asyncio.sleep(0.05)
        assert await _connections(pgvector_dsn, application) >= 1
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
    assert await _connections(pgvector_dsn, application) == 0
