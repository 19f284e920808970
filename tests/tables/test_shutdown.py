"""A worker that stops closes its PostgreSQL pools: no connection of it is left open on the server."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from switchboard.cli.worker import run_worker
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.settings import QueueSettings, load_settings
from tests.tables.postgres import postgres_dsn
from tests.waiting import wait_until

__all__ = ["postgres_dsn"]

CONFIG = """
default_agent: shop
agents:
  shop:
    profile: {name: Shop}
    instructions: test
    postgres:
      crm: {dsn_env: CRM_DATABASE_URL}
    tables:
      orders: {database: crm, table: TABLE, permission: read}
"""


async def _open(dsn: str, application: str) -> int:
    con = await asyncpg.connect(dsn)
    try:
        found = await con.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", application)
        return int(found)
    finally:
        await con.close()


async def test_the_worker_closes_its_postgres_pool_when_it_stops(
    base_env: dict[str, str], postgres_dsn: str, async_redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, application = f"orders_{uuid.uuid4().hex[:8]}", f"sb-worker-{uuid.uuid4().hex[:8]}"
    con = await asyncpg.connect(postgres_dsn)
    try:
        await con.execute(f"CREATE TABLE {table} (id INTEGER, status TEXT)")
        await con.execute(f"INSERT INTO {table} VALUES (1, 'open')")
    finally:
        await con.close()
    Path(base_env["SWITCHBOARD_CONFIG"]).write_text(CONFIG.replace("TABLE", table))
    monkeypatch.setenv("CRM_DATABASE_URL", f"{postgres_dsn}&application_name={application}")
    settings = load_settings(base_env | {"SWITCHBOARD_MODEL": "offline"})
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(settings, stop))
    message = InboundMessage(
        dedup_key="pool-1",
        conversation=ConversationRef(agent="shop", channel="web", conversation="pool"),
        sender=Sender(id="u1", name="User"),
        text='/tool table_query {"table": "orders"}',
    )
    try:
        await Ingestor(async_redis, QueueSettings()).ingest(message)

        async def queried() -> bool:
            events = await read_events(async_redis, message.session_key)
            return any(e["kind"] == "tool_called" and e["ok"] for e in events)

        await wait_until(queried, "the table query", timeout=60)
        assert await _open(postgres_dsn, application) >= 1  # the pool's connection, while the worker runs
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
    assert await _open(postgres_dsn, application) == 0
