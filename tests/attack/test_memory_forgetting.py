"""What ``forget``, a retention purge and erasure leave behind in the tenant's files.

The cached vector of a removed text stayed, keyed by the sha256 of the text, so anyone with the file could confirm a
guess ("was 'Ann is pregnant' ever remembered?") and approximate the words from the vector, long after the fact was
forgotten or its retention ran out. Erasing a person leaves none of their words in the database, its write-ahead log
or its shared memory file.
"""

from __future__ import annotations

from pathlib import Path

from switchboard.core.memory.embeddings import digest
from switchboard.core.memory.facts import FactChange, Source
from switchboard.core.memory.store import SQLiteMemoryStore
from tests.memory.test_sealing import NOW, _add, _fact

SECRET = "Ann is pregnant with twins"
DOCUMENT = "Clinic letter.\n\n" + "Nothing of note here. " * 60 + "\n\nAnn expects twins in May."
KEEP = "Bob likes trains"


async def _cached(store: SQLiteMemoryStore, *texts: str) -> set[str]:
    found = await store.cached_embeddings("acme", "m", [digest("m", text) for text in texts])
    return {text for text in texts if digest("m", text) in found}


async def _fill(store: SQLiteMemoryStore) -> list[str]:
    await _add(store, _fact("f_01", SECRET, created=NOW - 100))
    await _add(store, _fact("f_02", DOCUMENT, kind="document", created=NOW - 100))
    await _add(store, _fact("f_03", KEEP, created=NOW))
    pieces = [row[0] for row in store._db("acme").execute("SELECT text FROM passages WHERE fact = 2 ORDER BY idx")]
    texts = [SECRET, *pieces, KEEP]
    await store.cache_embeddings("acme", "m", {digest("m", text): [1.0, 0.0] for text in texts})
    assert await _cached(store, *texts) == set(texts)
    return texts


async def test_forget_removes_the_cached_vectors_of_the_forgotten_text(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path)
    texts = await _fill(store)
    for fact_id in ("f_01", "f_02"):
        change = FactChange(fact_id=fact_id, project="shop", op="forgotten", actor="web:ann", reason="asked to")
        await store.forget("acme", fact_id, change)
    assert await _cached(store, *texts) == {KEEP}
    store.close()


async def test_a_retention_purge_removes_the_cached_vectors_of_what_it_purges(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path)
    texts = await _fill(store)
    assert await store.purge("acme", NOW - 50) == 2
    assert await _cached(store, *texts) == {KEEP}
    store.close()


async def test_erasing_a_person_leaves_no_canary_in_the_database_files(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path)
    for number in range(40):
        await _add(store, _fact(f"f_b{number:02d}", f"Bob's filler fact {number} about trains", actor="web:bob"))
    await _add(store, _fact("f_a1", "Ann's zebracanary lives at 5 Rue Lepic"), reason="said zebracanary")
    await _add(store, _fact("f_a2", DOCUMENT + " The okapicanary is hers.", kind="document"))
    source = Source(kind="message", quote="moved to Rue Cler")
    change = FactChange(fact_id="f_a1", project="shop", op="corrected", actor="web:ann", reason="said lemurcanary")
    await store.correct("acme", "f_a1", "Ann's gnucanary moved to Rue Cler", source, 1.0, change)
    for number in range(40, 60):
        await _add(store, _fact(f"f_b{number:02d}", f"Bob's filler fact {number} about trains", actor="web:bob"))
    raw = b"".join(path.read_bytes() for path in tmp_path.iterdir() if path.is_file())
    canaries = [b"zebracanary", b"okapicanary", b"lemurcanary", b"gnucanary", b"Lepic"]
    assert all(canary in raw for canary in canaries)  # the check can fail
    assert await store.erase("acme", actor="web:ann") == 2
    assert {path.name for path in tmp_path.iterdir()} <= {"acme.sqlite", "acme.sqlite-wal", "acme.sqlite-shm"}
    raw = b"".join(path.read_bytes() for path in tmp_path.iterdir() if path.is_file())
    assert [canary for canary in canaries if canary in raw] == []
    assert len(await store.facts("acme", ["shop"])) == 60
    store.close()


async def test_a_correction_removes_the_cached_vector_of_the_wrong_text(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path)
    await _add(store, _fact("f_01", SECRET))
    corrected = "Bob is expecting twins, not Ann"
    await store.cache_embeddings("acme", "m", {digest("m", SECRET): [1.0, 0.0], digest("m", corrected): [0.0, 1.0]})
    change = FactChange(fact_id="f_01", project="shop", op="corrected", actor="web:ann", reason="wrong person")
    await store.correct("acme", "f_01", corrected, Source(kind="message", quote="not Ann"), 1.0, change)
    assert await _cached(store, SECRET, corrected) == {corrected}
    store.close()


async def test_a_corrected_document_keeps_the_cached_vectors_of_its_unchanged_passages(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path)
    await _add(store, _fact("f_02", DOCUMENT, kind="document"))
    old = [row[0] for row in store._db("acme").execute("SELECT text FROM passages ORDER BY idx")]
    await store.cache_embeddings("acme", "m", {digest("m", text): [1.0, 0.0] for text in old})
    fixed = DOCUMENT.replace("Ann expects twins in May.", "Bob expects twins in May.")
    change = FactChange(fact_id="f_02", project="shop", op="corrected", actor="web:ann", reason="wrong person")
    await store.correct("acme", "f_02", fixed, Source(kind="message", quote="Bob expects"), 1.0, change)
    new = [row[0] for row in store._db("acme").execute("SELECT text FROM passages ORDER BY idx")]
    assert len(set(old) & set(new)) >= 1 and set(old) - set(new)  # some passages stay, one changed
    assert await _cached(store, *old) == set(old) & set(new)
    store.close()
