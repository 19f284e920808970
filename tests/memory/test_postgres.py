"""What only the PostgreSQL store does: its schema at startup, pgvector missing, vector lengths, sealed rows and key
rotation on the server, and BM25 equal to the embedded store's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import asyncpg
import pytest

from switchboard.core.memory.chunks import passages
from switchboard.core.memory.facts import Fact, FactChange, Source
from switchboard.core.memory.postgres import PostgresMemoryStore
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.sealing import Keyring
from switchboard.errors import ConfigError
from tests.memory.stores import NOW, change, fact
from tests.tables.postgres import postgres_dsn  # noqa: F401  (Debian's server, which has no pgvector)

OLD = Keyring([("k1", b"\x01" * 32)])
BOTH = Keyring([("k2", b"\x02" * 32), ("k1", b"\x01" * 32)])
NEW = Keyring([("k2", b"\x02" * 32)])
CANARY = "zebracanary"


async def _raw(store: PostgresMemoryStore, sql: str) -> list[asyncpg.Record]:
    con = await asyncpg.connect(store.dsn)
    try:
        return list(await con.fetch(sql.replace("{s}", f'"{store.schema}"')))
    finally:
        await con.close()


async def test_the_schema_is_created_at_startup_by_many_at_once_and_again(
    postgres_stores: Callable[..., PostgresMemoryStore],
) -> None:
    stores = [postgres_stores() for _ in range(4)]
    await asyncio.gather(*(store.create() for store in stores))
    await stores[0].close()
    await stores[0].create()
    item = fact("created once")
    await stores[1].add(item, change(item))
    assert await stores[2].get("acme", item.id, ["shop"]) == item


async def test_a_server_without_pgvector_is_a_config_error_saying_what_to_install(postgres_dsn: str) -> None:  # noqa: F811
    store = PostgresMemoryStore(postgres_dsn, schema="nopgvector")
    with pytest.raises(ConfigError, match="install pgvector"):
        await store.create()
    await store.close()


async def test_a_role_that_may_not_create_the_extension_is_a_config_error(pgvector_dsn: str) -> None:
    admin = await asyncpg.connect(pgvector_dsn)
    try:
        await admin.execute("DROP DATABASE IF EXISTS plain WITH (FORCE)")
        await admin.execute("CREATE DATABASE plain")
        await admin.execute("DROP ROLE IF EXISTS app")
        await admin.execute("CREATE ROLE app LOGIN NOSUPERUSER")
        await admin.execute("ALTER DATABASE plain OWNER TO app")
        user_dsn = "postgresql://app@/plain?" + pgvector_dsn.split("?", 1)[1]
        store = PostgresMemoryStore(user_dsn)
        with pytest.raises(ConfigError, match="CREATE EXTENSION vector"):
            await store.create()
        await store.close()
    finally:
        await admin.execute("DROP DATABASE IF EXISTS plain WITH (FORCE)")
        await admin.execute("DROP ROLE IF EXISTS app")
        await admin.close()


def test_a_schema_name_that_is_not_an_identifier_is_refused() -> None:
    with pytest.raises(ConfigError, match="schema"):
        PostgresMemoryStore("postgresql:///x", schema='memory"; DROP TABLE x; --')


async def test_vectors_of_another_length_are_not_compared(postgres_store: PostgresMemoryStore) -> None:
    small = fact("three dims", fact_id="s")
    large = fact("four dims", fact_id="l")
    await postgres_store.add(small, change(small), [[1.0, 0.0, 0.0]])
    await postgres_store.add(large, change(large), [[1.0, 0.0, 0.0, 0.0]])

    assert [h.fact.id for h in await postgres_store.nearest("acme", ["shop"], [1.0, 0.0, 0.0], 5, NOW)] == ["s"]
    assert [h.fact.id for h in await postgres_store.nearest("acme", ["shop"], [1, 0, 0, 0], 5, NOW)] == ["l"]
    doc = fact("one. " * 400, kind="document", fact_id="d")
    vectors = [[1.0, 0.0] for _ in passages(doc.text)]
    vectors[1] = [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="same"):
        await postgres_store.add(doc, change(doc), vectors)
    assert await postgres_store.get("acme", "d", ["shop"]) is None


async def test_a_correction_too_long_for_a_fact_changes_nothing(postgres_store: PostgresMemoryStore) -> None:
    item = fact("short fact", fact_id="c")
    await postgres_store.add(item, change(item))
    source = Source(kind="message", ref="m2", quote="a long story")
    with pytest.raises(ValueError, match="2000"):
        await postgres_store.correct("acme", "c", "word " * 1000, source, 0.4, change(item, "corrected"))
    assert await postgres_store.get("acme", "c", ["shop"]) == item
    assert [c.op for c in await postgres_store.changes("acme", "c")] == ["remembered"]


async def test_bm25_equals_the_embedded_stores(postgres_store: PostgresMemoryStore, tmp_path: Path) -> None:
    embedded = SQLiteMemoryStore(tmp_path / "memory")
    texts = [
        "refund policy for kettles and toasters",
        "the refund arrives in five working days",
        "kettles ship on monday, toasters on tuesday",
        "a refund, a refund, always a refund",
        "nothing to see here",
        "Kettles: descale monthly; kettle warranty is two years",
    ]
    try:
        for n, text in enumerate(texts):
            for project in ("shop", "hr"):
                item = fact(text, fact_id=f"{project}{n}", project=project, created_at=NOW - 100 + n)
                await postgres_store.add(item, change(item))
                await embedded.add(item, change(item))
        for query in ("refund kettles", "kettle warranty", "toasters monday refund", "five"):
            for projects in (["shop"], ["shop", "hr"]):
                expected = await embedded.search("acme", projects, query, 10, NOW)
                got = await postgres_store.search("acme", projects, query, 10, NOW)
                assert [(h.fact.id, h.score) for h in got] == [(h.fact.id, h.score) for h in expected], query
                assert got
    finally:
        embedded.close()


# ---------------------------------------------------------------- sealing and rotation


async def test_sealed_rows_hold_no_word_and_still_answer(postgres_stores: Callable[..., PostgresMemoryStore]) -> None:
    store = postgres_stores(OLD)
    item = fact(f"the {CANARY} lives in Lisbon", fact_id="s1")
    await store.add(item, change(item), [[0.0, 1.0]])
    forgotten = fact("gone soon", fact_id="s2")
    await store.add(forgotten, change(forgotten))
    reason = FactChange(fact_id="s2", project="shop", op="forgotten", actor="op", reason=f"{CANARY} asked us to")
    await store.forget("acme", "s2", reason)

    for row in await _raw(store, "SELECT text, source FROM {s}.facts"):
        assert row["text"].startswith("sb1:k1:") and row["source"].startswith("sb1:k1:")
    dump = " ".join(str(tuple(row)) for row in await _raw(store, "SELECT * FROM {s}.facts NATURAL JOIN {s}.passages"))
    assert CANARY not in dump and "Lisbon" not in dump and "the user said so" not in dump
    assert CANARY not in str([tuple(row) for row in await _raw(store, "SELECT * FROM {s}.changes")])
    assert (await store.changes("acme", "s2"))[-1] == reason
    assert await store.tenants() == ["acme"]
    assert await store.get("acme", "s1", ["shop"]) == item
    assert [h.fact.id for h in await store.search("acme", ["shop"], f"{CANARY} Paris", 5, NOW)] == ["s1"]
    assert [h.fact.id for h in await store.nearest("acme", ["shop"], [0.0, 1.0], 5, NOW)] == ["s1"]
    assert await store.search("acme", ["shop"], "Paris", 5, NOW) == []


async def test_rotation_reseals_and_reindexes_under_the_current_key(
    postgres_stores: Callable[..., PostgresMemoryStore],
) -> None:
    plain = postgres_stores()
    before = fact(f"written before sealing, {CANARY} one", fact_id="p1")
    await plain.add(before, change(before))
    old = postgres_stores(OLD)
    sealed = fact(f"sealed with the old key, {CANARY} two", fact_id="o1")
    await old.add(sealed, change(sealed))
    await old.link("acme", "o1", "o1", FactChange(fact_id="o1", project="shop", op="linked", actor="op", reason="why"))
    other = fact(f"another tenant's {CANARY}", tenant="globex", fact_id="g1")
    await old.add(other, change(other))

    both = postgres_stores(BOTH)
    assert {h.fact.id for h in await both.search("acme", ["shop"], CANARY, 5, NOW)} == {"p1", "o1"}
    assert await both.rotate("acme") == 2
    assert await both.rotate("acme") == 0
    keys = {row["text"].split(":")[1] for row in await _raw(both, "SELECT text FROM {s}.facts WHERE tenant = 'acme'")}
    assert keys == {"k2"}
    reasons = await _raw(both, "SELECT reason FROM {s}.changes WHERE tenant = 'acme' AND reason <> ''")
    assert [row["reason"].split(":")[1] for row in reasons] == ["k2"]

    new = postgres_stores(NEW)
    assert [h.fact.id for h in await new.search("acme", ["shop"], f"{CANARY} two", 5, NOW)] == ["o1", "p1"]
    assert await new.get("acme", "p1", ["shop"]) == before
    assert (await new.get("acme", "o1", ["shop"])) == sealed.model_copy(update={"links": ("o1",)})
    assert [c.reason for c in await new.changes("acme", "o1")] == ["", "why"]
    assert (await _raw(new, "SELECT text FROM {s}.facts WHERE tenant = 'globex'"))[0]["text"].startswith("sb1:k1:")
    assert await postgres_stores().rotate("acme") == 0


def test_one_store_serves_one_event_loop_after_another(pgvector_dsn: str) -> None:
    store = PostgresMemoryStore(pgvector_dsn, schema="loops")
    item = fact("kept across loops", fact_id="l1")

    async def first() -> None:
        await store.add(item, change(item))

    async def second() -> Fact | None:
        try:
            return await store.get("acme", "l1", ["shop"])
        finally:
            await store.close()

    asyncio.run(first())
    assert asyncio.run(second()) == item


async def test_a_nul_character_is_a_clear_error_and_nothing_is_written(postgres_store: PostgresMemoryStore) -> None:
    item = fact("before\x00after", fact_id="n1")
    with pytest.raises(ValueError, match="NUL"):
        await postgres_store.add(item, change(item))
    assert await postgres_store.facts("acme", ["shop"]) == []
    kept = fact("clean", fact_id="n2")
    await postgres_store.add(kept, change(kept))
    source = Source(kind="message", ref="m3", quote="a quote")
    with pytest.raises(ValueError, match="NUL"):
        await postgres_store.correct("acme", "n2", "dirty\x00", source, 0.5, change(kept, "corrected"))
    assert await postgres_store.get("acme", "n2", ["shop"]) == kept
