"""The ``memory_store`` fixture: the same contract cases against the embedded store and PostgreSQL with pgvector.

Each PostgreSQL case gets its own schema of one session server (``tests/memory/pgvector.py``), dropped after it.
Also builders of facts and changes the cases share.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.memory.facts import Fact, FactChange, FactKind, Source
from switchboard.core.memory.postgres import PostgresMemoryStore
from switchboard.core.memory.store import MemoryStore, SQLiteMemoryStore
from switchboard.core.sealing import Keyring
from tests.memory.pgvector import pgvector_dsn

__all__ = [
    "STORES",
    "change",
    "fact",
    "memory_store",
    "pgvector_dsn",
    "postgres_store",
    "postgres_stores",
    "store_maker",
]

STORES = ("sqlite", "postgres")
NOW = 1_800_000_000.0
_n = itertools.count(1)


def fact(
    text: str,
    *,
    tenant: str = "acme",
    project: str = "shop",
    kind: FactKind = "fact",
    actor: str = "web:ann",
    fact_id: str | None = None,
    created_at: float = NOW - 1000,
    expires_at: float | None = None,
    confidence: float = 0.9,
) -> Fact:
    """A fact with its provenance, as the ``remember`` tool builds it."""
    return Fact(
        id=fact_id or f"f{next(_n):05d}",
        tenant=tenant,
        project=project,
        kind=kind,
        text=text,
        source=Source(kind="message", ref="m1", quote="the user said so"),
        run_id="run-1",
        actor=actor,
        created_at=created_at,
        expires_at=expires_at,
        confidence=confidence,
    )


def change(subject: Fact | str, op: str = "remembered", project: str = "shop", at: float = NOW) -> FactChange:
    """The change record of ``op`` on ``subject``."""
    if isinstance(subject, Fact):
        return FactChange(fact_id=subject.id, project=subject.project, op=op, actor=subject.actor or "op", at=at)  # type: ignore[arg-type]
    return FactChange(fact_id=subject, project=project, op=op, actor="operator", at=at)  # type: ignore[arg-type]


async def _drop(dsn: str, schema: str) -> None:
    import asyncpg

    con = await asyncpg.connect(dsn)
    try:
        await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await con.close()


@pytest.fixture
async def postgres_stores(pgvector_dsn: str) -> AsyncIterator[Callable[..., PostgresMemoryStore]]:
    """Make PostgreSQL stores on a fresh schema of the session server (a keyring each, if given); all closed after."""
    schema = f"t{uuid.uuid4().hex[:12]}"
    made: list[PostgresMemoryStore] = []

    def make(keyring: Keyring | None = None, **options: Any) -> PostgresMemoryStore:
        store = PostgresMemoryStore(pgvector_dsn, schema=options.pop("schema", schema), keyring=keyring, **options)
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()
    await _drop(pgvector_dsn, schema)


@pytest.fixture
async def postgres_store(postgres_stores: Callable[..., PostgresMemoryStore]) -> PostgresMemoryStore:
    """One PostgreSQL store on a fresh schema."""
    return postgres_stores()


@pytest.fixture(params=STORES)
async def memory_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryStore]:
    """The embedded store, then PostgreSQL with pgvector (skipped with the reason when the wheel is missing)."""
    if request.param == "sqlite":
        embedded = SQLiteMemoryStore(tmp_path / "memory")
        yield embedded
        embedded.close()
        return
    dsn: str = request.getfixturevalue("pgvector_dsn")
    schema = f"t{uuid.uuid4().hex[:12]}"
    store = PostgresMemoryStore(dsn, schema=schema)
    yield store
    await store.close()
    await _drop(dsn, schema)


@pytest.fixture(params=STORES)
async def store_maker(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Callable[..., MemoryStore]]:
    """Make stores of one kind over the same storage, each with the keyring given (``None``: sealing off)."""
    made: list[MemoryStore] = []
    if request.param == "sqlite":

        def embedded(keyring: Keyring | None = None) -> MemoryStore:
            store = SQLiteMemoryStore(tmp_path / "memory", keyring)
            made.append(store)
            return store

        yield embedded
        for store in made:
            assert isinstance(store, SQLiteMemoryStore)
            store.close()
        return
    dsn: str = request.getfixturevalue("pgvector_dsn")
    schema = f"t{uuid.uuid4().hex[:12]}"

    def postgres(keyring: Keyring | None = None) -> MemoryStore:
        store = PostgresMemoryStore(dsn, schema=schema, keyring=keyring)
        made.append(store)
        return store

    yield postgres
    for store in made:
        assert isinstance(store, PostgresMemoryStore)
        await store.close()
    await _drop(dsn, schema)
