"""Sealed memory opened without its keys, or with the wrong ones: a clear error naming the variable, never a silent
partial answer; and erasing a person still works when the keys are gone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.core.memory.embeddings import digest
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.sealing import DATA_KEYS_ENV, Keyring, SealError, new_key
from tests.memory.test_sealing import NOW, _add, _fact

KEY = new_key("k1")


async def _mixed(root: Path) -> None:
    """A plain fact written before sealing was switched on, then a sealed one."""
    plain = SQLiteMemoryStore(root)
    await _add(plain, _fact("f_01", "Ann keeps quokkas at home"))
    plain.close()
    sealed = SQLiteMemoryStore(root, Keyring.parse(KEY))
    await _add(sealed, _fact("f_02", "Bob keeps quokkas too", actor="web:bob"))
    await sealed.cache_embeddings("acme", "m", {digest("m", "Bob keeps quokkas too"): [1.0, 0.0]})
    assert {hit.fact.id for hit in await sealed.search("acme", ["shop"], "quokkas", 5, NOW)} == {"f_01", "f_02"}
    sealed.close()


@pytest.mark.parametrize("keys", [None, new_key("k1"), new_key("k9")], ids=["no-keys", "same-id-other-key", "other-id"])
async def test_a_search_of_sealed_memory_without_its_key_says_so(tmp_path: Path, keys: str | None) -> None:
    await _mixed(tmp_path)
    store = SQLiteMemoryStore(tmp_path, None if keys is None else Keyring.parse(keys))
    try:
        with pytest.raises(SealError, match=DATA_KEYS_ENV):
            await store.search("acme", ["shop"], "quokkas", 5, NOW)
    finally:
        store.close()


async def test_a_search_of_plain_memory_needs_no_key(tmp_path: Path) -> None:
    plain = SQLiteMemoryStore(tmp_path)
    await _add(plain, _fact("f_01", "Ann keeps quokkas at home"))
    assert [hit.fact.id for hit in await plain.search("acme", ["shop"], "quokkas", 5, NOW)] == ["f_01"]
    plain.close()


async def test_erasing_a_person_works_when_the_keys_are_gone(tmp_path: Path) -> None:
    await _mixed(tmp_path)
    store = SQLiteMemoryStore(tmp_path)
    try:
        assert await store.erase("acme", actor="web:bob") == 1
        db = store._db("acme")
        assert db.execute("SELECT id FROM facts").fetchall() == [("f_01",)]
        assert db.execute("SELECT count(*) FROM embedding_cache").fetchone()[0] == 0
    finally:
        store.close()


async def test_a_tampered_sealed_row_is_a_clear_error_not_garbage(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path, Keyring.parse(KEY))
    await _add(store, _fact("f_01", "Ann keeps quokkas at home"))
    await _add(store, _fact("f_02", "Bob keeps quokkas too"))
    db = store._db("acme")
    sealed = db.execute("SELECT text FROM facts WHERE id = 'f_01'").fetchone()[0]
    flipped = sealed[:-3] + ("A" if sealed[-3] != "A" else "B") + sealed[-2:]
    db.execute("UPDATE facts SET text = ? WHERE id = 'f_01'", (flipped,))
    other = db.execute("SELECT text FROM facts WHERE id = 'f_02'").fetchone()[0]
    try:
        with pytest.raises(SealError, match="does not open"):
            await store.get("acme", "f_01", ["shop"])
        with pytest.raises(SealError, match="does not open"):
            await store.search("acme", ["shop"], "quokkas", 5, NOW)
    finally:
        store.close()
    other_tenant = SQLiteMemoryStore(tmp_path, Keyring.parse(KEY))
    try:
        db = other_tenant._db("globex")  # a value copied into another tenant's file does not open there
        await _add(other_tenant, _fact("f_09", "Globex fact").model_copy(update={"tenant": "globex"}))
        db.execute("UPDATE facts SET text = ? WHERE id = 'f_09'", (other,))
        with pytest.raises(SealError, match="does not open"):
            await other_tenant.get("globex", "f_09", ["shop"])
    finally:
        other_tenant.close()


async def test_rotation_of_a_store_with_plain_and_sealed_rows_seals_them_all(tmp_path: Path) -> None:
    await _mixed(tmp_path)
    newer = new_key("k2")
    store = SQLiteMemoryStore(tmp_path, Keyring.parse(f"{newer},{KEY}"))
    assert await store.rotate("acme") == 2
    assert await store.rotate("acme") == 0
    store.close()
    store = SQLiteMemoryStore(tmp_path, Keyring.parse(newer))  # the old key can go
    try:
        assert {hit.fact.id for hit in await store.search("acme", ["shop"], "quokkas", 5, NOW)} == {"f_01", "f_02"}
        db = store._db("acme")
        texts = [row[0] for row in db.execute("SELECT text FROM facts UNION ALL SELECT text FROM passages")]
        assert texts and all(text.startswith("sb1:k2:") for text in texts)
    finally:
        store.close()
