"""The MemoryStore contract, case by case, against every store (``memory_store``: SQLite, then PostgreSQL).

Above all: every read filters by tenant, project and expiry **before** it ranks, so rows a caller may not see change
neither which facts it gets nor their scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from switchboard.core.memory.chunks import passages
from switchboard.core.memory.embeddings import digest
from switchboard.core.memory.facts import Fact, Source
from switchboard.core.memory.store import MemoryStore
from switchboard.core.sealing import Keyring, SealError, new_key
from tests.memory.stores import NOW, change, fact

DOCUMENT = "\n\n".join(
    [
        "Shipping policy. " + "Parcels leave the warehouse on weekdays before noon. " * 12,
        "Returns. " + "A customer may send an item back within thirty days for a refund. " * 12,
        "Warranty. " + "Kettles carry a two year warranty against limescale damage. " * 12,
    ]
)


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


async def _add(store: MemoryStore, item: Fact, embeddings: list[list[float]] | None = None) -> Fact:
    await store.add(item, change(item), embeddings)
    return item


def _ranked(hits: list) -> list[tuple[str, float]]:  # type: ignore[type-arg]
    return [(hit.fact.id, hit.score) for hit in hits]


# ---------------------------------------------------------------- writes and reads


async def test_a_fact_reads_back_whole_and_a_rerun_keeps_the_first(memory_store: MemoryStore) -> None:
    first = await _add(memory_store, fact("Ann prefers email over phone", fact_id="f1", actor="web:ann"))
    await memory_store.add(fact("something else entirely", fact_id="f1"), change("f1"))

    got = await memory_store.get("acme", "f1", ["shop"])
    assert got == first
    assert (got.kind, got.actor, got.source.quote) == ("fact", "web:ann", "the user said so")
    assert await memory_store.get("acme", "f1", ["hr"]) is None
    assert await memory_store.get("globex", "f1", ["shop"]) is None
    assert [c.op for c in await memory_store.changes("acme", "f1")] == ["remembered"]


async def test_facts_lists_the_projects_oldest_first_expired_included(memory_store: MemoryStore) -> None:
    old = await _add(memory_store, fact("old", created_at=NOW - 500, expires_at=NOW - 1))
    new = await _add(memory_store, fact("new", created_at=NOW - 100))
    await _add(memory_store, fact("hr only", project="hr"))
    await _add(memory_store, fact("other tenant", tenant="globex"))

    assert [f.id for f in await memory_store.facts("acme", ["shop"])] == [old.id, new.id]
    assert await memory_store.facts("acme", []) == []


async def test_correct_replaces_text_source_and_confidence_and_reindexes(memory_store: MemoryStore) -> None:
    item = await _add(memory_store, fact("the courier is DHL", fact_id="c1"), [[1.0, 0.0, 0.0]])
    source = Source(kind="message", ref="m9", quote="we moved to UPS")
    await memory_store.correct("acme", "c1", "the courier is UPS", source, 0.5, change(item, "corrected"), [[0, 1, 0]])

    got = await memory_store.get("acme", "c1", ["shop"])
    assert got is not None
    assert (got.text, got.source, got.confidence, got.updated_at) == ("the courier is UPS", source, 0.5, NOW)
    assert await memory_store.search("acme", ["shop"], "DHL", 5, NOW) == []
    assert [h.fact.id for h in await memory_store.search("acme", ["shop"], "UPS", 5, NOW)] == ["c1"]
    near = await memory_store.nearest("acme", ["shop"], [0.0, 1.0, 0.0], 5, NOW)
    assert [(h.fact.id, h.score) for h in near] == [("c1", 1.0)]
    assert [c.op for c in await memory_store.changes("acme", "c1")] == ["remembered", "corrected"]
    with pytest.raises(KeyError):
        await memory_store.correct("acme", "nope", "x", source, 0.5, change("nope", "corrected"))
    with pytest.raises(KeyError):
        await memory_store.correct("globex", "c1", "x", source, 0.5, change("c1", "corrected"))


async def test_forget_removes_the_fact_its_index_and_its_links(memory_store: MemoryStore) -> None:
    a = await _add(memory_store, fact("alpha kettle", fact_id="a"), [[1.0, 0.0]])
    await _add(memory_store, fact("beta kettle", fact_id="b"), [[1.0, 0.1]])
    await memory_store.link("acme", "a", "b", change(a, "linked"))
    await memory_store.forget("acme", "a", change(a, "forgotten"))

    assert await memory_store.get("acme", "a", ["shop"]) is None
    assert [h.fact.id for h in await memory_store.search("acme", ["shop"], "kettle alpha", 5, NOW)] == ["b"]
    assert [h.fact.id for h in await memory_store.nearest("acme", ["shop"], [1.0, 0.0], 5, NOW)] == ["b"]
    b = await memory_store.get("acme", "b", ["shop"])
    assert b is not None and b.links == ()
    assert [c.op for c in await memory_store.changes("acme", "a")] == ["remembered", "linked", "forgotten"]
    with pytest.raises(KeyError):
        await memory_store.forget("acme", "a", change(a, "forgotten"))


async def test_embeddings_must_be_one_per_passage_or_nothing_is_stored(memory_store: MemoryStore) -> None:
    doc = fact(DOCUMENT, kind="document", fact_id="d1")
    count = len(passages(DOCUMENT))
    assert count >= 3
    with pytest.raises(ValueError, match="passage"):
        await memory_store.add(doc, change(doc), [[1.0, 0.0]] * (count - 1))
    assert await memory_store.get("acme", "d1", ["shop"]) is None
    assert await memory_store.changes("acme") == []


# ---------------------------------------------------------------- isolation before ranking


async def _noise(store: MemoryStore, words: str, vector: list[float]) -> None:
    """Rows with the query's words and vectors that the caller may not see: another tenant, project, or expired."""
    for n in range(6):
        for item in (
            fact(f"{words} {n}", tenant="globex"),
            fact(f"{words} {words} extra {n}", project="hr"),
            fact(f"{words} {n}", expires_at=NOW - 1),
        ):
            await _add(store, item, [vector])


async def test_invisible_rows_change_neither_membership_nor_lexical_scores(memory_store: MemoryStore) -> None:
    await _add(memory_store, fact("refund policy for kettles", fact_id="k1"), [[1.0, 0.0, 0.0]])
    await _add(memory_store, fact("the refund arrives in five days", fact_id="k2"), [[0.8, 0.6, 0.0]])
    await _add(memory_store, fact("kettles ship on monday", fact_id="k3"), [[0.0, 1.0, 0.0]])
    await _add(memory_store, fact("nothing relevant here", fact_id="k4", expires_at=NOW + 50), [[0.0, 0.0, 1.0]])
    before = _ranked(await memory_store.search("acme", ["shop"], "refund kettles", 10, NOW))
    assert {fact_id for fact_id, _ in before} == {"k1", "k2", "k3"}
    assert before[0][0] == "k1" and all(score > 0 for _, score in before)

    await _noise(memory_store, "refund kettles refund", [1.0, 0.0, 0.0])
    after = _ranked(await memory_store.search("acme", ["shop"], "refund kettles", 10, NOW))
    assert after == before
    assert _ranked(await memory_store.search("acme", ["shop", "hr"], "refund kettles", 10, NOW)) != before


async def test_invisible_rows_change_neither_membership_nor_vector_scores(memory_store: MemoryStore) -> None:
    vectors = {"v1": [1.0, 0.0, 0.0], "v2": [0.8, 0.6, 0.0], "v3": [0.0, 1.0, 0.0]}
    for fact_id, vector in vectors.items():
        await _add(memory_store, fact(f"text of {fact_id}", fact_id=fact_id), [vector])
    await _add(memory_store, fact("expired", fact_id="v4", expires_at=NOW), [[1.0, 0.0, 0.0]])
    query = [0.9, 0.1, 0.0]
    before = _ranked(await memory_store.nearest("acme", ["shop"], query, 10, NOW))
    assert [fact_id for fact_id, _ in before] == ["v1", "v2", "v3"]
    for fact_id, score in before:
        assert score == pytest.approx(_cosine(query, vectors[fact_id]), abs=1e-5)

    await _noise(memory_store, "anything", [0.9, 0.1, 0.0])
    assert _ranked(await memory_store.nearest("acme", ["shop"], query, 10, NOW)) == before
    assert _ranked(await memory_store.nearest("acme", ["shop"], query, 2, NOW)) == before[:2]


async def test_a_caller_without_projects_or_words_gets_nothing(memory_store: MemoryStore) -> None:
    await _add(memory_store, fact("refund policy"), [[1.0, 0.0]])
    assert await memory_store.search("acme", [], "refund", 5, NOW) == []
    assert await memory_store.search("acme", ["shop"], "  ... ", 5, NOW) == []
    assert await memory_store.search("acme", ["shop"], "refund", 0, NOW) == []
    assert await memory_store.nearest("acme", [], [1.0, 0.0], 5, NOW) == []
    assert await memory_store.search("globex", ["shop"], "refund", 5, NOW) == []
    assert await memory_store.nearest("globex", ["shop"], [1.0, 0.0], 5, NOW) == []


# ---------------------------------------------------------------- documents


async def test_a_document_is_found_by_its_passage_and_shows_that_passage(memory_store: MemoryStore) -> None:
    doc = fact(DOCUMENT, kind="document", fact_id="d1")
    pieces = passages(DOCUMENT)
    vectors = [[1.0 if i == n else 0.0 for i in range(len(pieces))] for n in range(len(pieces))]
    await _add(memory_store, doc, vectors)
    await _add(memory_store, fact("limescale is bad for kettles", fact_id="f1"), [[0.5] * len(pieces)])

    hits = await memory_store.search("acme", ["shop"], "warranty limescale", 5, NOW)
    assert hits[0].fact.id == "d1" and hits[0].fact.text == DOCUMENT
    assert "Kettles carry a two year warranty" in hits[0].passage and hits[0].passage in DOCUMENT
    assert len(hits[0].passage) < len(DOCUMENT)
    assert {h.fact.id for h in hits} == {"d1", "f1"} and hits[-1].passage == ""

    middle = len(pieces) // 2
    near = await memory_store.nearest("acme", ["shop"], vectors[middle], 5, NOW)
    assert near[0].fact.id == "d1" and near[0].score == pytest.approx(1.0)
    assert near[0].passage == pieces[middle].text


# ---------------------------------------------------------------- graph


async def test_neighbours_are_the_visible_live_links(memory_store: MemoryStore) -> None:
    for fact_id, project, expires in (("a", "shop", None), ("b", "shop", None), ("c", "hr", None), ("d", "shop", NOW)):
        await _add(memory_store, fact(f"fact {fact_id}", fact_id=fact_id, project=project, expires_at=expires))
    for dst in ("b", "c", "d"):
        await memory_store.link("acme", "a", dst, change("a", "linked"))

    assert await memory_store.neighbours("acme", ["shop"], ["a", "b"], NOW) == {"a": ["b"], "b": ["a"]}
    assert (await memory_store.neighbours("acme", ["shop", "hr"], ["a"], NOW))["a"] == ["b", "c"]
    assert (await memory_store.neighbours("acme", ["shop", "hr"], ["a"], NOW - 10))["a"] == ["b", "c", "d"]
    got = await memory_store.get("acme", "a", ["shop"])
    assert got is not None and got.links == ("b", "d")  # expired or not, never another project's id
    assert (await memory_store.neighbours("globex", ["shop"], ["a"], NOW)).get("a", []) == []


# ---------------------------------------------------------------- cache, erasure, retention


async def test_the_embedding_cache_is_per_tenant_and_model(memory_store: MemoryStore) -> None:
    await memory_store.cache_embeddings("acme", "m1", {"d1": [0.1, 0.2, 0.3], "d2": [1.0, 0.0, 0.5]})
    await memory_store.cache_embeddings("acme", "m1", {"d1": [0.4, 0.5, 0.6]})
    cached = await memory_store.cached_embeddings("acme", "m1", ["d1", "d2", "d3"])
    assert sorted(cached) == ["d1", "d2"]  # vectors at least to float32 precision
    assert cached["d1"] == pytest.approx([0.4, 0.5, 0.6], rel=1e-6)
    assert cached["d2"] == pytest.approx([1.0, 0.0, 0.5], rel=1e-6)
    assert await memory_store.cached_embeddings("acme", "m2", ["d1"]) == {}
    assert await memory_store.cached_embeddings("globex", "m1", ["d1"]) == {}


async def test_erase_a_tenant_leaves_nothing_of_it_and_everything_else(memory_store: MemoryStore) -> None:
    a = await _add(memory_store, fact("canary-7 acme", fact_id="a"), [[1.0, 0.0]])
    await _add(memory_store, fact("canary-7 acme too", fact_id="b", project="hr"), [[1.0, 0.0]])
    await memory_store.link("acme", "a", "b", change(a, "linked"))
    await memory_store.cache_embeddings("acme", "m1", {"x": [1.0]})
    other = await _add(memory_store, fact("canary-7 globex", tenant="globex", fact_id="a"), [[1.0, 0.0]])
    await memory_store.cache_embeddings("globex", "m1", {"x": [1.0]})

    assert await memory_store.erase("acme") == 2
    assert await memory_store.facts("acme", ["shop", "hr"]) == []
    assert await memory_store.changes("acme") == []
    assert await memory_store.cached_embeddings("acme", "m1", ["x"]) == {}
    assert await memory_store.search("acme", ["shop", "hr"], "canary", 5, NOW) == []
    assert await memory_store.nearest("acme", ["shop", "hr"], [1.0, 0.0], 5, NOW) == []
    assert await memory_store.facts("globex", ["shop"]) == [other]
    assert await memory_store.cached_embeddings("globex", "m1", ["x"]) == {"x": [1.0]}
    assert await memory_store.erase("acme") == 0


async def test_erase_an_actor_removes_their_facts_links_and_cached_vectors(memory_store: MemoryStore) -> None:
    from switchboard.core.memory.embeddings import digest

    theirs = await _add(memory_store, fact("Bob lives at 1 Elm Street", fact_id="bob1", actor="web:bob"), [[1.0, 0]])
    kept = await _add(memory_store, fact("Ann likes tea", fact_id="ann1", actor="web:ann"), [[0.0, 1.0]])
    await memory_store.link("acme", "bob1", "ann1", change(theirs, "linked"))
    await memory_store.cache_embeddings(
        "acme", "m1", {digest("m1", theirs.text): [1.0, 0.0], digest("m1", kept.text): [0.0, 1.0]}
    )

    assert await memory_store.erase("acme", actor="web:bob") == 1
    assert [f.id for f in await memory_store.facts("acme", ["shop"])] == ["ann1"]
    assert (await memory_store.get("acme", "ann1", ["shop"])).links == ()  # type: ignore[union-attr]
    assert await memory_store.search("acme", ["shop"], "Elm Street", 5, NOW) == []
    cached = await memory_store.cached_embeddings("acme", "m1", [digest("m1", theirs.text), digest("m1", kept.text)])
    assert list(cached) == [digest("m1", kept.text)]
    assert await memory_store.changes("acme", "bob1") == []
    assert await memory_store.erase("acme", actor="web:nobody") == 0


async def test_purge_removes_what_was_created_before_by_kind(memory_store: MemoryStore) -> None:
    await _add(memory_store, fact("old fact", fact_id="of", created_at=NOW - 900))
    await _add(memory_store, fact("old document", kind="document", fact_id="od", created_at=NOW - 900))
    await _add(memory_store, fact("new fact", fact_id="nf", created_at=NOW - 10))
    await _add(memory_store, fact("old other tenant", tenant="globex", fact_id="og", created_at=NOW - 900))

    assert await memory_store.purge("acme", NOW - 100, kind="document") == 1
    assert [f.id for f in await memory_store.facts("acme", ["shop"])] == ["of", "nf"]
    assert await memory_store.purge("acme", NOW - 100) == 1
    assert [f.id for f in await memory_store.facts("acme", ["shop"])] == ["nf"]
    assert await memory_store.search("acme", ["shop"], "old", 5, NOW) == []
    assert [f.id for f in await memory_store.facts("globex", ["shop"])] == ["og"]


# ---------------------------------------------------------------- sealing and what deleted text leaves behind


async def test_plain_text_that_looks_sealed_reads_back_as_written(store_maker: Callable[..., MemoryStore]) -> None:
    keyring = Keyring.parse(new_key("k1"))
    typed = "sb1:k1:AAAA is what the user typed"
    item = await _add(store_maker(None), fact(typed, fact_id="x1"))  # kept in plain, before sealing was on
    await _add(store_maker(keyring), fact(typed, fact_id="x2"))
    for reader in (store_maker(None), store_maker(keyring)):
        got = await reader.get("acme", item.id, ["shop"])
        assert got is not None and got.text == typed  # never taken for a sealed value
    hits = await store_maker(keyring).search("acme", ["shop"], "typed", 5, NOW)
    assert sorted(h.fact.id for h in hits) == ["x1", "x2"]
    assert [h.fact.text for h in hits] == [typed, typed]


async def test_sealed_memory_without_its_keys_is_a_clear_error(store_maker: Callable[..., MemoryStore]) -> None:
    sealed = store_maker(Keyring.parse(new_key("k1")))
    item = await _add(sealed, fact("Ann's card ends in 4242", fact_id="s1"))
    for other in (store_maker(None), store_maker(Keyring.parse(new_key("k2")))):
        with pytest.raises(SealError, match="SWITCHBOARD_DATA_KEYS"):
            await other.search("acme", ["shop"], "card", 5, NOW)  # never a silent "nothing found"
        with pytest.raises(SealError):
            await other.get("acme", item.id, ["shop"])


@pytest.mark.parametrize("how", ["forget", "purge", "correct"])
async def test_deleted_text_leaves_no_cached_vector_behind(memory_store: MemoryStore, how: str) -> None:
    text = "Ann's door code is 4711"
    item = await _add(memory_store, fact(text, fact_id="d1", created_at=NOW - 10_000), [[1.0, 0.0, 0.0]])
    kept = await _add(memory_store, fact("the shop opens at nine", fact_id="d2"), [[0.0, 1.0, 0.0]])
    keys = {digest("m", text): [1.0, 0.0, 0.0], digest("m", kept.text): [0.0, 1.0, 0.0]}
    await memory_store.cache_embeddings("acme", "m", keys)
    if how == "forget":
        await memory_store.forget("acme", item.id, change(item, "forgotten"))
    elif how == "purge":
        assert await memory_store.purge("acme", NOW - 5_000) == 1
    else:
        source = Source(kind="message", ref="m2", quote="the code changed")
        await memory_store.correct("acme", item.id, "Ann's door code changed", source, 1.0, change(item, "corrected"))
    # a cached vector keyed by the text's hash would confirm a guess of the deleted text
    assert set(await memory_store.cached_embeddings("acme", "m", list(keys))) == {digest("m", kept.text)}
