"""Retrieval modes over the SQLite store: vector, hybrid and graph ranking, isolation per mode, documents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlean

from switchboard.core.memory.chunks import passages, passages_for
from switchboard.core.memory.embeddings import LocalEmbedder
from switchboard.core.memory.facts import MAX_FACT_CHARS, Fact, FactChange, Hit, Source
from switchboard.core.memory.retrieval import GRAPH_DECAY, SEARCH_MODES, VECTOR_WEIGHT, SearchMode, fuse, retrieve
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.memory.tools import MAX_READ_CHARS, MAX_SNIPPET_CHARS, memory_tools
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.gateway import ToolGateway
from switchboard.settings import FileConfig
from tests.memory.conftest import Memory, Turn, inbound

NOW = 1_800_000_000.0
EMBEDDER = LocalEmbedder()
SOURCE = Source(kind="message", quote="as said")


def _fact(fact_id: str, text: str, *, tenant: str = "acme", project: str = "shop", **more: Any) -> Fact:
    return Fact(id=fact_id, tenant=tenant, project=project, text=text, source=SOURCE, run_id="r", **more)


def _change(fact: Fact, op: str = "remembered") -> FactChange:
    return FactChange.model_validate({"fact_id": fact.id, "project": fact.project, "op": op, "actor": "web:ann"})


async def _add(store: SQLiteMemoryStore, fact: Fact, *, vectors: bool = True) -> None:
    embeddings = await EMBEDDER.embed([p.text for p in passages_for(fact.kind, fact.text)]) if vectors else None
    await store.add(fact, _change(fact), embeddings)


async def _link(store: SQLiteMemoryStore, tenant: str, src: str, dst: str) -> None:
    change = FactChange(fact_id=src, project="shop", op="linked", actor="web:ann")
    await store.link(tenant, src, dst, change)


def _ranked(hits: list[Hit]) -> list[tuple[str, float, str, str]]:
    return [(hit.fact.id, hit.score, hit.passage, hit.via) for hit in hits]


SHOP = {
    "f_01": "Invoices are sent by email at the end of each month",
    "f_02": "The customer pays invoices by bank transfer",
    "f_03": "Deliveries to Lyon leave the warehouse on Tuesday",
    "f_04": "Refunds take five working days to reach the card",
    "f_05": "Ann prefers invoicing in euros",
}


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    found = SQLiteMemoryStore(tmp_path / "memory")
    for fact_id, text in SHOP.items():
        await _add(found, _fact(fact_id, text))
    yield found
    found.close()


async def test_vector_search_finds_other_forms_of_a_word_that_lexical_search_misses(store: SQLiteMemoryStore) -> None:
    lexical = await retrieve(store, EMBEDDER, "acme", ["shop"], "invoiced", mode="lexical", limit=5, now=NOW)
    assert lexical == []  # no stemming: the word itself is in no fact
    vector = await retrieve(store, EMBEDDER, "acme", ["shop"], "invoiced", mode="vector", limit=3, now=NOW)
    assert vector[0].fact.id in {"f_01", "f_02", "f_05"}
    assert {hit.fact.id for hit in vector} == {"f_01", "f_02", "f_05"}
    assert all(-1.0 <= hit.score <= 1.0 for hit in vector)
    assert [hit.score for hit in vector] == sorted((hit.score for hit in vector), reverse=True)
    wanted = EMBEDDER.vector("invoiced")
    best = EMBEDDER.vector(vector[0].fact.text)
    assert vector[0].score == pytest.approx(sum(a * b for a, b in zip(wanted, best, strict=True)), abs=1e-5)


def _share(hits: list[Hit], fact_id: str) -> float:
    scores = [hit.score for hit in hits]
    found = [hit.score for hit in hits if hit.fact.id == fact_id]
    if not found:
        return 0.0
    return 1.0 if max(scores) == min(scores) else (found[0] - min(scores)) / (max(scores) - min(scores))


async def test_hybrid_search_fuses_both_lists_by_their_scaled_scores(store: SQLiteMemoryStore) -> None:
    query = "invoices by email"
    lexical = await store.search("acme", ["shop"], query, 20, NOW)
    vector = await store.nearest("acme", ["shop"], EMBEDDER.vector(query), 20, NOW)
    hybrid = await retrieve(store, EMBEDDER, "acme", ["shop"], query, mode="hybrid", limit=5, now=NOW)
    assert hybrid[0].fact.id == "f_01"  # first in both lists
    for hit in hybrid:
        expected = (1 - VECTOR_WEIGHT) * _share(lexical, hit.fact.id) + VECTOR_WEIGHT * _share(vector, hit.fact.id)
        assert hit.score == pytest.approx(expected, abs=1e-6)
    assert {hit.fact.id for hit in hybrid} <= {hit.fact.id for hit in lexical} | {hit.fact.id for hit in vector}
    assert [hit.score for hit in hybrid] == sorted((hit.score for hit in hybrid), reverse=True)


def test_fusion_prefers_what_both_lists_found_and_a_weak_word_match_adds_little() -> None:
    a, b, c, d = (_fact(f"f_0{n}", f"text {n}") for n in (1, 2, 3, 4))
    lexical = [Hit(fact=a, score=9.0), Hit(fact=b, score=5.0), Hit(fact=d, score=0.5)]
    vector = [Hit(fact=c, score=0.9), Hit(fact=b, score=0.8), Hit(fact=d, score=0.1)]
    fused = fuse(lexical, vector, limit=4)
    assert [hit.fact.id for hit in fused] == ["f_02", "f_01", "f_03", "f_04"]
    assert fused[0].score == pytest.approx(0.5 * (4.5 / 8.5) + 0.5 * (0.7 / 0.8), abs=1e-6)
    assert fused[-1].score == 0.0  # last in both lists: nothing to lift it
    assert fuse([], [], limit=3) == []


async def test_graph_search_follows_links_two_deep_with_decayed_scores(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "memory")
    await _add(store, _fact("f_0a", "Ann ordered the walnut bookcase"))
    for fact_id, text in {
        "f_0b": "shipped from Lille",
        "f_0c": "Lille depot has a forklift",
        "f_0d": "bought 2020",
    }.items():
        await _add(store, _fact(fact_id, text), vectors=False)  # only reachable over links
    await _add(store, _fact("f_0e", "linked but unconnected", project="hr"), vectors=False)
    await _add(store, _fact("f_0f", "linked but expired", expires_at=NOW - 1), vectors=False)
    for src, dst in [("f_0a", "f_0b"), ("f_0b", "f_0c"), ("f_0c", "f_0d"), ("f_0a", "f_0e"), ("f_0b", "f_0f")]:
        await _link(store, "acme", src, dst)
    hits = await retrieve(store, EMBEDDER, "acme", ["shop"], "walnut bookcase", mode="graph", limit=6, now=NOW)
    assert [(hit.fact.id, hit.via) for hit in hits] == [("f_0a", ""), ("f_0b", "f_0a"), ("f_0c", "f_0b")]
    assert hits[1].score == pytest.approx(hits[0].score * GRAPH_DECAY, abs=1e-6)
    assert hits[2].score == pytest.approx(hits[0].score * GRAPH_DECAY**2, abs=1e-6)
    hybrid = await retrieve(store, EMBEDDER, "acme", ["shop"], "walnut bookcase", mode="hybrid", limit=6, now=NOW)
    assert [hit.fact.id for hit in hybrid] == ["f_0a"]
    neighbours = await store.neighbours("acme", ["shop"], ["f_0a", "f_0b", "f_0z"], NOW)
    assert neighbours == {"f_0a": ["f_0b"], "f_0b": ["f_0a", "f_0c"], "f_0z": []}
    store.close()


async def _foreign(store: SQLiteMemoryStore) -> None:
    """Rows the caller may not see, made to rank well: same words and vectors, in another project, expired, or of
    another tenant, some linked to visible facts."""
    for fact_id, text in SHOP.items():
        await _add(store, _fact(fact_id.replace("f_0", "f_1"), text + " invoices", project="hr"))
        await _add(store, _fact(fact_id.replace("f_0", "f_2"), text, expires_at=NOW - 1))
        await _add(store, _fact(fact_id.replace("f_0", "f_3"), text + " email", tenant="globex", project="rival"))
    await _link(store, "acme", "f_01", "f_11")
    await _link(store, "acme", "f_01", "f_21")
    await _link(store, "globex", "f_31", "f_01")


@pytest.mark.parametrize("mode", SEARCH_MODES)
async def test_rows_the_caller_may_not_see_change_nothing_in_any_mode(tmp_path: Path, mode: SearchMode) -> None:
    clean = SQLiteMemoryStore(tmp_path / "clean")
    mixed = SQLiteMemoryStore(tmp_path / "mixed")
    for store in (clean, mixed):
        for fact_id, text in SHOP.items():
            await _add(store, _fact(fact_id, text))
        await _link(store, "acme", "f_01", "f_03")
    await _foreign(mixed)
    for query in ("invoices email", "invoicing", "warehouse Tuesday", "card refunds"):
        alone = await retrieve(clean, EMBEDDER, "acme", ["shop"], query, mode=mode, limit=5, now=NOW)
        among = await retrieve(mixed, EMBEDDER, "acme", ["shop"], query, mode=mode, limit=5, now=NOW)
        assert alone, (mode, query)
        assert _ranked(among) == _ranked(alone), (mode, query)
        assert {hit.fact.project for hit in among} == {"shop"}
        assert not [link for hit in among for link in hit.fact.links if link.startswith(("f_1", "f_3"))]
    # the foreign rows are there, and found by those who may see them
    theirs = await retrieve(mixed, EMBEDDER, "globex", ["rival"], "invoices email", mode=mode, limit=5, now=NOW)
    assert theirs and {hit.fact.tenant for hit in theirs} == {"globex"}
    assert await retrieve(mixed, EMBEDDER, "globex", ["shop"], "invoices", mode=mode, limit=5, now=NOW) == []
    clean.close()
    mixed.close()


async def test_modes_other_than_lexical_need_an_embedder(store: SQLiteMemoryStore) -> None:
    for mode in ("vector", "hybrid", "graph"):
        with pytest.raises(ValueError, match="needs embeddings"):
            await retrieve(store, None, "acme", ["shop"], "invoices", mode=mode, limit=5, now=NOW)  # type: ignore[arg-type]
    assert await retrieve(store, None, "acme", ["shop"], "invoices", mode="lexical", limit=5, now=NOW)


async def test_vectors_of_another_length_or_of_nothing_are_left_out(store: SQLiteMemoryStore) -> None:
    assert await store.nearest("acme", ["shop"], [0.0] * EMBEDDER.dims, 5, NOW) == []
    assert await store.nearest("acme", ["shop"], LocalEmbedder(64).vector("invoices"), 5, NOW) == []
    fact = _fact("f_09", "a fact with one vector too many")
    with pytest.raises(ValueError, match="2 embeddings for 1 passages"):
        await store.add(fact, _change(fact), [EMBEDDER.vector("a"), EMBEDDER.vector("b")])
    assert await store.get("acme", "f_09", ["shop"]) is None  # nothing written


# -------------------------------------------------------------------- documents


def _document(marker: str) -> str:
    paragraphs = [
        f"Section {n}. " + " ".join(f"The shipping policy clause {n}.{k} applies to parcels." for k in range(12))
        for n in range(20)
    ]
    paragraphs[13] = paragraphs[13].replace("clause 13.5 applies", f"clause 13.5 names the {marker} surcharge")
    return "\n\n".join(paragraphs)


def test_a_document_is_cut_into_passages_on_bounds_that_cover_it() -> None:
    text = _document("zanzibar")
    pieces = passages(text)
    assert len(pieces) > 10 and all(0 < len(piece.text) <= 800 for piece in pieces)
    for piece in pieces:
        assert text[piece.start : piece.start + len(piece.text)] == piece.text
        assert piece.text.endswith(".")  # cut after a sentence, never inside a word
    assert "".join(text[p.start : p.start + len(p.text)] for p in pieces).replace(" ", "") == text.replace(
        "\n", ""
    ).replace(" ", "")
    assert [p.text for p in passages_for("fact", "short. text.")] == ["short. text."]


async def test_a_remembered_document_is_recalled_by_its_passage_and_read_by_ranges(embedded: Memory) -> None:
    text = _document("zanzibar")
    turn = Turn(inbound=[inbound("please keep our shipping policy", "m1")])
    turn.saw("call-1", "read_document", {"path": "policy.txt"}, text)
    source = {"kind": "file", "ref": "policy.txt", "call_id": "call-1", "quote": "names the zanzibar surcharge"}
    outcome = await embedded.call(
        "remember", {"text": text, "kind": "document", "source": source, "project": "shop"}, turn
    )
    assert outcome.ok, outcome
    doc_id = outcome.value["remembered"]
    fact = await embedded.store.get("acme", doc_id, ["shop"])
    assert fact is not None and fact.kind == "document" and fact.actor == "web:ann" and fact.text == text

    for mode in ("lexical", "vector", "hybrid"):
        recalled = await embedded.call("recall", {"query": "zanzibar surcharge", "mode": mode}, None)
        assert recalled.ok, recalled
        (shown,) = [f for f in recalled.value["facts"] if f["id"] == doc_id]
        assert "zanzibar" in shown["text"], mode  # the passage that matched, not the document's beginning
        assert len(shown["text"]) <= MAX_SNIPPET_CHARS and shown["chars"] == len(text) and shown["kind"] == "document"

    read, offset = "", 0
    while True:
        part = await embedded.call("read_memory", {"id": doc_id, "offset": offset}, None)
        assert part.ok, part
        assert len(part.value["text"]) <= MAX_READ_CHARS and part.value["total_chars"] == len(text)
        read += part.value["text"]
        if part.value["next_offset"] is None:
            break
        offset = part.value["next_offset"]
    assert read == text
    assert embedded.gateway.registry.get("read_memory").output_trust == "data"  # type: ignore[union-attr]
    middle = await embedded.call("read_memory", {"id": doc_id, "offset": 100, "length": 50}, None)
    assert middle.value["text"] == text[100:150] and middle.value["next_offset"] == 150
    past = await embedded.call("read_memory", {"id": doc_id, "offset": len(text) + 1}, None)
    assert not past.ok and "past the end" in str(past.error)
    hidden = await embedded.call("read_memory", {"id": doc_id}, None, agent="people")  # not connected to shop
    assert not hidden.ok and "no fact" in str(hidden.error)


async def test_a_long_text_is_a_document_not_a_fact(embedded: Memory) -> None:
    text = "Friday " * (MAX_FACT_CHARS // 7 + 1)
    turn = Turn(inbound=[inbound(text, "m1")])
    args = {"text": text, "source": {"kind": "message", "quote": "Friday Friday"}, "project": "shop"}
    refused = await embedded.call("remember", args, turn)
    assert not refused.ok and "kind document" in str(refused.error)
    assert await embedded.store.facts("acme", ["shop"]) == []
    kept = await embedded.call("remember", {**args, "kind": "document"}, turn)
    assert kept.ok, kept


async def test_recall_defaults_to_hybrid_with_an_embedder_and_finds_what_words_miss(embedded: Memory) -> None:
    turn = Turn(inbound=[inbound("Ann prefers invoicing in euros", "m1")])
    source = {"kind": "message", "quote": "invoicing in euros"}
    remembered = await embedded.call(
        "remember", {"text": "Ann prefers invoicing in euros", "source": source, "project": "shop"}, turn
    )
    assert remembered.ok, remembered
    found = await embedded.call("recall", {"query": "invoices"}, None)
    assert found.ok and found.value["mode"] == "hybrid"
    assert [f["id"] for f in found.value["facts"]] == [remembered.value["remembered"]]
    lexical = await embedded.call("recall", {"query": "invoices", "mode": "lexical"}, None)
    assert lexical.ok and lexical.value["facts"] == []


async def test_without_an_embedder_recall_is_lexical_and_says_why_other_modes_fail(memory: Memory) -> None:
    plain = await memory.call("recall", {"query": "invoices"}, None)
    assert plain.ok and plain.value["mode"] == "lexical"
    refused = await memory.call("recall", {"query": "invoices", "mode": "vector"}, None)
    assert not refused.ok and "needs embeddings" in str(refused.error)


def test_local_embeddings_are_deterministic_unit_vectors_near_for_shared_word_parts() -> None:
    one = EMBEDDER.vector("Invoices are paid monthly")
    assert one == LocalEmbedder().vector("Invoices are paid monthly")
    assert sum(v * v for v in one) == pytest.approx(1.0)
    assert EMBEDDER.vector("...") == [0.0] * EMBEDDER.dims

    def cosine(a: str, b: str) -> float:
        return sum(x * y for x, y in zip(EMBEDDER.vector(a), EMBEDDER.vector(b), strict=True))

    assert cosine("invoice paid late", "invoices paying lateness") > cosine("invoice paid late", "the cat sat on a mat")


_FIRST_LAYOUT = """
CREATE TABLE facts (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, project TEXT NOT NULL, text TEXT NOT NULL,
    source TEXT NOT NULL, run_id TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL, confidence REAL NOT NULL,
    expires_at REAL, length INTEGER NOT NULL);
CREATE INDEX facts_scope ON facts (tenant, project);
CREATE VIRTUAL TABLE facts_fts USING fts5(text, content='facts', content_rowid='rowid',
    tokenize='unicode61 remove_diacritics 0');
CREATE TABLE links (tenant TEXT NOT NULL, src TEXT NOT NULL, dst TEXT NOT NULL, PRIMARY KEY (tenant, src, dst));
CREATE TABLE changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, fact_id TEXT NOT NULL,
    project TEXT NOT NULL, op TEXT NOT NULL, actor TEXT NOT NULL, agent TEXT NOT NULL, run_id TEXT NOT NULL,
    reason TEXT NOT NULL, at REAL NOT NULL);
"""


async def test_a_database_of_the_first_layout_is_brought_up_to_date(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    root.mkdir()
    db = sqlean.connect(str(root / "acme.sqlite"))
    db.executescript(_FIRST_LAYOUT)
    for rowid, (fact_id, text) in enumerate(list(SHOP.items())[:2], start=1):
        db.execute(
            "INSERT INTO facts (rowid, id, tenant, project, text, source, run_id, created_at, confidence, length)"
            " VALUES (?, ?, 'acme', 'shop', ?, ?, 'r', ?, 1.0, ?)",
            (rowid, fact_id, text, SOURCE.model_dump_json(), NOW, len(text.split())),
        )
        db.execute("INSERT INTO facts_fts (rowid, text) VALUES (?, ?)", (rowid, text))
    db.commit()
    db.close()
    store = SQLiteMemoryStore(root)
    hits = await store.search("acme", ["shop"], "invoices", 5, NOW)
    assert {hit.fact.id for hit in hits} == {"f_01", "f_02"}
    assert {(hit.fact.kind, hit.fact.actor) for hit in hits} == {("fact", "")}
    await _add(store, _fact("f_03", "A new fact about invoices"))
    assert len(await store.search("acme", ["shop"], "invoices", 5, NOW)) == 3
    assert await store.nearest("acme", ["shop"], EMBEDDER.vector("invoices"), 5, NOW)  # the new fact has a vector
    store.close()


async def test_knowledge_projects_are_read_and_never_written_by_the_memory_tools(tmp_path: Path) -> None:
    config = FileConfig.model_validate(
        {
            "projects": {"shop": {"tenant": "acme"}, "knowledge.support": {"tenant": "acme"}},
            "agents": {"support": {"name": "support", "projects": ["shop", "knowledge.support"]}},
        }
    )
    store = SQLiteMemoryStore(tmp_path / "memory")
    registry = ToolRegistry(memory_tools(store, config.connected_projects, lambda: NOW, EMBEDDER))
    memory = Memory(store, ToolGateway(registry, workspace_root=tmp_path), tmp_path, [NOW])
    handbook = _fact("f_0ab", "The returns handbook: parcels go back within 30 days.", project="knowledge.support")
    await _add(store, handbook.model_copy(update={"kind": "document"}))
    found = await memory.call("recall", {"query": "returns handbook"}, None)
    assert found.ok and [fact["id"] for fact in found.value["facts"]] == ["f_0ab"]
    assert (await memory.call("read_memory", {"id": "f_0ab"}, None)).ok

    turn = Turn(inbound=[inbound("Returns take 60 days now", "m1")])
    source = {"kind": "message", "quote": "Returns take 60 days"}
    refused = [
        await memory.call(
            "remember", {"text": "Returns take 60 days", "source": source, "project": "knowledge.support"}, turn
        ),
        await memory.call(
            "correct",
            {"fact_id": "f_0ab", "text": "Returns take 60 days", "source": source, "reason": "new policy"},
            turn,
        ),
        await memory.call("forget", {"fact_id": "f_0ab", "reason": "outdated now"}, turn),
    ]
    assert all(not outcome.ok and "knowledge" in str(outcome.error) for outcome in refused), refused
    (kept,) = await store.facts("acme", ["knowledge.support"])
    assert kept.text == handbook.text and [c.op for c in await store.changes("acme", "f_0ab")] == ["remembered"]
    # a write without a project goes to the only project the agent may write to
    written = await memory.call("remember", {"text": "Returns take 60 days", "source": source}, turn)
    assert written.ok and written.value["project"] == "shop"
    store.close()
