"""Erasure with the S3 workspace store: the session's objects go from the bucket even when the host running the
erasure has no working copy of them; other sessions' and tenants' objects stay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from switchboard.core.messages import session_key
from switchboard.core.workspaces.disk import workspace_for
from switchboard.core.workspaces.s3 import S3Workspaces
from switchboard.queue.erasure import Eraser
from switchboard.queue.keys import SessionKeys
from tests.workspaces.conftest import StoreFactory, bucket, keys, make_store, s3, s3_url

__all__ = ["bucket", "make_store", "s3", "s3_url"]

U = session_key("acme", "assistant", "telegram", "default", "4242")
V = session_key("acme", "assistant", "telegram", "default", "7777")
W = session_key("globex", "assistant", "telegram", "default", "4242")


def put(store: S3Workspaces, session: str, name: str, data: bytes) -> None:
    home = workspace_for(store.root, session)
    store.workspaces.store(home, home / name, data, shown=name)


async def test_a_session_erased_from_another_host_leaves_no_object_of_it_in_the_bucket(
    client: aioredis.Redis, make_store: StoreFactory, s3: Any, bucket: str, tmp_path: Path
) -> None:
    worker = make_store(tmp_path / "worker")
    for session in (U, V, W):
        put(worker, session, "notes.txt", f"notes of {session}".encode())
        await worker.persist(session)
        await client.hset(SessionKeys(session).meta, "channel", "telegram")
    before = await keys(s3, bucket)
    mine = [k for k in before if k.startswith(worker._session_prefix(U))]
    assert len(mine) == 1 and len(before) == 3

    elsewhere = make_store(tmp_path / "operator")  # the erasure runs on a host with no working copy
    dry = await Eraser(client, elsewhere, dry_run=True).erase("acme", session=U, by="test")
    assert dry.counts["workspaces (remote store, asked)"] == 1
    assert await keys(s3, bucket) == before

    await Eraser(client, elsewhere).erase("acme", session=U, by="test")
    assert await keys(s3, bucket) == [k for k in before if k not in mine]
    assert not await client.exists(SessionKeys(U).meta)
    assert await client.exists(SessionKeys(V).meta) and await client.exists(SessionKeys(W).meta)


async def test_erasing_a_tenant_empties_its_whole_prefix_even_of_sessions_redis_forgot(
    client: aioredis.Redis, make_store: StoreFactory, s3: Any, bucket: str, tmp_path: Path
) -> None:
    worker = make_store(tmp_path / "worker")
    for session in (U, V, W):
        put(worker, session, "notes.txt", f"notes of {session}".encode())
        await worker.persist(session)
    await client.hset(SessionKeys(U).meta, "channel", "telegram")  # V's keys expired: only the bucket has it
    before = await keys(s3, bucket)
    assert len(before) == 3

    elsewhere = make_store(tmp_path / "operator")
    dry = await Eraser(client, elsewhere, dry_run=True).erase("acme", by="test")
    assert "workspace objects (remote store)" in dry.not_counted and await keys(s3, bucket) == before
    done = await Eraser(client, elsewhere).erase("acme", by="test")
    assert done.counts["workspaces (remote store, asked)"] == 1  # U's, by its session
    assert done.counts["workspace objects (remote store)"] == 1  # V's, by the tenant's prefix
    assert await keys(s3, bucket) == [k for k in before if k.startswith(worker._tenant_prefix(W))]
