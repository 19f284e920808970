"""Memory sealed at rest: no plain text in the files, searchable by blind terms, rotation, erasure and retention."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.core.memory.chunks import passages_for
from switchboard.core.memory.embeddings import LocalEmbedder, digest
from switchboard.core.memory.facts import Fact, FactChange, Source
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.sealing import Keyring, SealError, new_key

NOW = 1_800_000_000.0
EMBEDDER = LocalEmbedder()
OLD = new_key("k1")
NEW = new_key("k2")
CANARIES = ("quokkacanary", "0698765432", "xylophonist")


def _fact(fact_id: str, text: str, *, kind: str = "fact", actor: str = "web:ann", created: float = NOW) -> Fact:
    return Fact.model_validate(
        {
            "id": fact_id,
            "tenant": "acme",
            "project": "shop",
            "text": text,
            "kind": kind,
            "actor": actor,
            "created_at": created,
            "source": Source(kind="message", quote=text[:100]),
            "run_id": "r",
        }
    )


async def _add(store: SQLiteMemoryStore, fact: Fact, reason: str = "") -> None:
    vectors = await EMBEDDER.embed([p.text for p in passages_for(fact.kind, fact.text)])
    change = FactChange(fact_id=fact.id, project="shop", op="remembered", actor=fact.actor, reason=reason)
    await store.add(fact, change, vectors)


def _bytes(root: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(root.iterdir()) if path.is_file())


async def _fill(store: SQLiteMemoryStore) -> None:
    await _add(store, _fact("f_01", f"Ann's pet is a {CANARIES[0]} named Bob"), reason=f"said {CANARIES[0]}")
    await _add(store, _fact("f_02", f"Ann's phone is {CANARIES[1]}", actor="web:bob"))
    document = "\n\n".join(f"Paragraph {n} of the handbook says little." * 5 for n in range(30))
    await _add(store, _fact("f_03", document + f" The {CANARIES[2]} plays at noon.", kind="document"))


async def test_sealed_memory_leaves_no_plain_text_in_its_files_and_stays_searchable(tmp_path: Path) -> None:
    plain = SQLiteMemoryStore(tmp_path / "plain")
    await _fill(plain)
    plain.close()
    assert all(canary.encode() in _bytes(tmp_path / "plain") for canary in CANARIES)  # the check can fail

    store = SQLiteMemoryStore(tmp_path / "sealed", Keyring.parse(OLD))
    await _fill(store)
    for canary in CANARIES:
        (hit,) = await store.search("acme", ["shop"], canary, 5, NOW)
        assert canary in hit.fact.text
        nearest = await store.nearest("acme", ["shop"], EMBEDDER.vector(canary), 1, NOW)
        assert nearest[0].fact.id == hit.fact.id
    (document,) = await store.search("acme", ["shop"], CANARIES[2], 5, NOW)
    assert CANARIES[2] in document.passage
    (change,) = await store.changes("acme", "f_01")
    assert change.reason == f"said {CANARIES[0]}"
    store.close()
    left = _bytes(tmp_path / "sealed")
    assert not [canary for canary in CANARIES if canary.encode() in left]
    assert b"Paragraph" not in left and b"handbook" not in left

    with pytest.raises(SealError, match="SWITCHBOARD_DATA_KEYS"):
        await SQLiteMemoryStore(tmp_path / "sealed").get("acme", "f_01", ["shop"])


async def test_rotation_reseals_under_the_new_key_so_the_old_one_can_go(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    first = SQLiteMemoryStore(root, Keyring.parse(OLD))
    await _fill(first)
    first.close()
    with pytest.raises(SealError, match="no longer lists"):  # without rotation, dropping the old key loses memory
        await SQLiteMemoryStore(root, Keyring.parse(NEW)).get("acme", "f_01", ["shop"])

    both = SQLiteMemoryStore(root, Keyring.parse(f"{NEW},{OLD}"))
    (found,) = await both.search("acme", ["shop"], CANARIES[0], 5, NOW)  # old blind terms still found
    assert found.fact.id == "f_01"
    assert await both.rotate("acme") == 3
    assert await both.rotate("acme") == 0
    both.close()

    after = SQLiteMemoryStore(root, Keyring.parse(NEW))
    for canary, fact_id in zip(CANARIES, ("f_01", "f_02", "f_03"), strict=True):
        (hit,) = await after.search("acme", ["shop"], canary, 5, NOW)  # indexed again under the new key
        assert hit.fact.id == fact_id and canary in hit.fact.text
    assert (await after.changes("acme", "f_01"))[0].reason == f"said {CANARIES[0]}"
    after.close()
    assert not [canary for canary in CANARIES if canary.encode() in _bytes(root)]


async def test_unsealed_memory_is_sealed_by_rotation_once_a_key_is_set(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    plain = SQLiteMemoryStore(root)
    await _fill(plain)
    plain.close()
    keyed = SQLiteMemoryStore(root, Keyring.parse(NEW))
    (hit,) = await keyed.search("acme", ["shop"], CANARIES[0], 5, NOW)  # plain rows open as themselves
    assert hit.fact.id == "f_01"
    assert await keyed.rotate("acme") == 3
    (hit,) = await keyed.search("acme", ["shop"], CANARIES[0], 5, NOW)
    assert hit.fact.id == "f_01"
    keyed.close()
    assert not [canary for canary in CANARIES if canary.encode() in _bytes(root)]


async def test_erasing_a_person_removes_their_facts_traces_and_cached_vectors(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "memory")
    await _fill(store)
    phone = f"Ann's phone is {CANARIES[1]}"
    await store.cache_embeddings("acme", "m", {digest("m", phone): [0.5, 0.5], digest("m", "other"): [1.0, 0.0]})
    assert await store.erase("acme", actor="web:bob") == 1
    assert await store.get("acme", "f_02", ["shop"]) is None
    assert await store.changes("acme", "f_02") == []
    assert await store.cached_embeddings("acme", "m", [digest("m", phone), digest("m", "other")]) == {
        digest("m", "other"): [1.0, 0.0]
    }
    assert [fact.id for fact in await store.facts("acme", ["shop"])] == ["f_01", "f_03"]
    store.close()
    assert CANARIES[1].encode() not in _bytes(tmp_path / "memory")

    store = SQLiteMemoryStore(tmp_path / "memory")
    assert store.tenants() == ["acme"]
    assert await store.erase("acme") == 2
    assert store.tenants() == []
    assert not list((tmp_path / "memory").iterdir())
    assert await store.facts("acme", ["shop"]) == []
    store.close()


async def test_purge_removes_what_was_created_before_a_time_by_kind(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "memory")
    await _add(store, _fact("f_01", "old fact", created=NOW - 100))
    await _add(store, _fact("f_02", "old document text", kind="document", created=NOW - 100))
    await _add(store, _fact("f_03", "new fact", created=NOW))
    assert await store.purge("acme", NOW - 50, kind="document") == 1
    assert [fact.id for fact in await store.facts("acme", ["shop"])] == ["f_01", "f_03"]
    assert await store.purge("acme", NOW - 50) == 1
    assert [fact.id for fact in await store.facts("acme", ["shop"])] == ["f_03"]
    assert await store.search("acme", ["shop"], "old", 5, NOW + 1) == []
    assert await store.purge("globex", NOW) == 0  # a tenant without memory has no file made for it
    assert not (tmp_path / "memory" / "globex.sqlite").exists()
    store.close()
