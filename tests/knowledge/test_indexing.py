"""Indexing an agent's knowledge: extraction of each format, URLs through egress, re-indexing on change only,
removed sources dropped, deterministic summaries and keywords, failures reported without stopping the others."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from switchboard.core.agent.config import Agent
from switchboard.core.knowledge.config import knowledge_project
from switchboard.core.knowledge.index import INDEXER, document_id
from switchboard.core.knowledge.keywords import keywords
from switchboard.core.knowledge.summaries import extractive_summary
from tests.core.test_documents import write_pdf
from tests.knowledge.conftest import PAGE, PAGE_HOST, World, write_docx

YAML = """
default_agent: helper
agents:
  helper:
    name: helper
    knowledge:
      sources:
        - path: docs
        - url: http://docs.example.test:{port}/shipping
    egress:
      allow: [docs.example.test]
"""


def _sources(world: World) -> None:
    docs = world.root / "docs"
    docs.mkdir()
    (docs / "refunds.txt").write_text(
        "Refunds are paid within fourteen days. A refund needs the receipt. Refund requests go to the desk.\n"
    )
    (docs / "guide.md").write_text("# Setup guide\n\nInstall the kettle firmware first. Then pair the kettle app.\n")
    write_pdf(docs / "warranty.pdf", ["Warranty covers the heater for two years", "Batteries are not covered"])
    write_docx(docs / "returns.docx", "Returns", ["Returned parcels are inspected by the returns team."])
    (docs / ".hidden.md").write_text("never indexed")
    (docs / "image.png").write_bytes(b"\x89PNG not text")
    world.pages["/shipping"] = ("text/html", PAGE.encode())


async def test_files_of_each_format_and_a_url_through_egress_are_indexed(world: World) -> None:
    _sources(world)
    world.reload(YAML)
    report = await world.index("helper")
    assert not report.failed(), report
    assert report.counts() == {"added": 5}
    docs = {doc.ref: doc for doc in await world.indexer().documents("default", "helper")}
    url = f"http://{PAGE_HOST}:{world.port}/shipping"
    assert set(docs) == {"docs/refunds.txt", "docs/guide.md", "docs/warranty.pdf", "docs/returns.docx", url}
    assert "fourteen days" in docs["docs/refunds.txt"].body
    assert "pair the kettle app" in docs["docs/guide.md"].body
    assert "heater for two years" in docs["docs/warranty.pdf"].body and "Batteries" in docs["docs/warranty.pdf"].body
    assert "# Returns" in docs["docs/returns.docx"].body and "returns team" in docs["docs/returns.docx"].body
    page = docs[url].body
    assert "International shipping takes ten days" in page and "hidden script" not in page and "<p>" not in page
    for ref, doc in docs.items():  # documents of the read-only project, with their source and its first words
        fact = doc.fact
        assert fact.kind == "document" and fact.project == knowledge_project("helper") == "knowledge.helper"
        assert fact.tenant == "default" and fact.actor == INDEXER and fact.id == document_id("default", "helper", ref)
        assert fact.source.kind == ("url" if ref == url else "file") and fact.source.ref == ref
        assert " ".join(doc.body.split()).startswith(fact.source.quote) and len(fact.source.quote) >= 3
    [fetch] = [e for e in world.sink.events if e.host == PAGE_HOST]  # the page came through egress, for this agent
    assert fetch.agent == "helper" and fetch.method == "GET" and fetch.status == 200


async def test_only_changed_sources_are_read_again_and_removed_ones_are_dropped(world: World) -> None:
    _sources(world)
    world.reload(YAML)
    await world.index("helper")
    assert world.models.asked == 5
    before = {doc.ref: doc for doc in await world.indexer().documents("default", "helper")}

    again = await world.index("helper")
    assert again.counts() == {"unchanged": 5} and world.models.asked == 5  # nothing summarised again

    (world.root / "docs" / "guide.md").write_text("# Setup guide\n\nPair the kettle with the new hub instead.\n")
    (world.root / "docs" / "refunds.txt").unlink()
    changed = await world.index("helper")
    states = {s.ref: s.state for s in changed.sources}
    assert states["docs/guide.md"] == "changed" and states["docs/refunds.txt"] == "removed"
    assert world.models.asked == 6  # the changed one alone
    after = {doc.ref: doc for doc in await world.indexer().documents("default", "helper")}
    assert "new hub" in after["docs/guide.md"].body and after["docs/guide.md"].digest != before["docs/guide.md"].digest
    assert "docs/refunds.txt" not in after
    gone = before["docs/refunds.txt"].fact.id
    assert await world.store.get("default", gone, ["knowledge.helper"]) is None
    assert after["docs/warranty.pdf"].fact.id == before["docs/warranty.pdf"].fact.id

    world.reload(YAML.replace("        - url: http://docs.example.test:{port}/shipping\n", ""))  # source unlisted
    dropped = await world.index("helper")
    assert [s.state for s in dropped.sources if s.state == "removed"] == ["removed"]
    assert len(await world.indexer().documents("default", "helper")) == 3


async def test_summaries_and_keywords_are_deterministic_with_the_offline_model(world: World) -> None:
    _sources(world)
    world.reload(YAML)
    await world.index("helper")
    first = {doc.ref: (doc.summary, doc.keywords) for doc in await world.indexer().documents("default", "helper")}
    refunds = first["docs/refunds.txt"]
    assert (
        refunds[0]
        == "Refunds are paid within fourteen days. A refund needs the receipt. Refund requests go to the desk."
    )
    assert first["docs/guide.md"][0] == "Setup guide Install the kettle firmware first. Then pair the kettle app."
    assert refunds[1][0] == "refund"  # its most frequent word, found in no other source
    assert "kettle" in first["docs/guide.md"][1]
    assert all(word not in ("the", "are", "within") for _, words in first.values() for word in words)

    for doc in await world.indexer().documents("default", "helper"):  # a fresh index gives the same again
        from switchboard.core.memory.facts import FactChange

        await world.store.forget(
            "default",
            doc.fact.id,
            FactChange(fact_id=doc.fact.id, project=doc.fact.project, op="forgotten", actor="test"),
        )
    await world.index("helper")
    second = {doc.ref: (doc.summary, doc.keywords) for doc in await world.indexer().documents("default", "helper")}
    assert second == first


def test_an_extractive_summary_is_the_first_whole_sentences() -> None:
    text = "## Intro\n\n" + " ".join(f"Sentence number {n} says something." for n in range(40))
    summary = extractive_summary(text)
    assert summary.startswith("Intro Sentence number 0 says something.") and summary.endswith("says something.")
    assert 240 <= len(summary) < 280 and "Sentence number 39" not in summary


def test_keywords_weigh_rarity_among_the_sources() -> None:
    found = keywords({"a": "kettle kettle water water", "b": "water water toaster toaster"})
    assert found["a"][0] == "kettle" and found["b"][0] == "toaster"  # a shared word ranks below a rare one
    assert keywords({"a": "kettle kettle water water", "b": "water water toaster toaster"}) == found


async def test_unreadable_oversized_missing_and_refused_sources_are_reported_and_the_rest_indexed(
    world: World,
) -> None:
    docs = world.root / "docs"
    docs.mkdir()
    (docs / "good.md").write_text("Opening hours are nine to five on weekdays.\n")
    (docs / "broken.pdf").write_text("not a pdf at all")
    (docs / "huge.txt").write_text("word " * 50_000)  # 250,000 bytes, over the 200,000-byte cap of the world
    (docs / "empty.txt").write_text("  \n")
    world.reload(
        """
default_agent: helper
agents:
  helper:
    name: helper
    knowledge:
      - path: docs
      - path: missing.md
      - path: notes.xlsx
      - url: http://elsewhere.example.test:{port}/page
"""
    )
    (world.root / "notes.xlsx").write_bytes(b"PK")
    report = await world.index("helper")
    states = {s.ref: (s.state, s.error) for s in report.sources}
    assert states["docs/good.md"][0] == "added"
    errors = {ref: error for ref, (state, error) in states.items() if state == "failed"}
    assert set(errors) == {
        "docs/broken.pdf",
        "docs/huge.txt",
        "docs/empty.txt",
        "missing.md",
        "notes.xlsx",
        f"http://elsewhere.example.test:{world.port}/page",
    }
    assert "not a readable PDF" in errors["docs/broken.pdf"] or "could not be read" in errors["docs/broken.pdf"]
    assert "250000 bytes, over the 200000-byte document cap" in errors["docs/huge.txt"]
    assert "no text" in errors["docs/empty.txt"]
    assert "no such file or folder" in errors["missing.md"]
    assert "cannot be indexed" in errors["notes.xlsx"]
    refused = errors[f"http://elsewhere.example.test:{world.port}/page"]
    assert "egress refused it (domain_not_allowed)" in refused and "agents.helper.egress.allow" in refused
    assert [doc.ref for doc in await world.indexer().documents("default", "helper")] == ["docs/good.md"]


async def test_a_source_that_fails_later_keeps_its_last_index(world: World) -> None:
    world.pages["/shipping"] = ("text/html", PAGE.encode())
    world.reload(YAML.replace("        - path: docs\n", ""))
    assert (await world.index("helper")).counts() == {"added": 1}
    del world.pages["/shipping"]  # the server now answers 404
    report = await world.index("helper")
    [failed] = report.failed()
    assert "answered 404" in failed.error
    assert len(await world.indexer().documents("default", "helper")) == 1


@pytest.mark.parametrize(
    ("knowledge", "message"),
    [
        ([{"path": "/etc/passwd"}], "must be relative"),
        ([{"path": "docs/../../secret"}], "remove '..'"),
        ([{"url": "ftp://example.com/a"}], "not an http(s) URL"),
        ([{"url": "https://user:pw@example.com/a"}], "carries credentials"),
        ([{"path": "a.md", "url": "https://example.com"}], "exactly one of them"),
        ([{"path": "a.md"}, {"path": "a.md"}], "listed twice"),
        ([{"url": "https://example.com/" + "a" * 1000}], "longer than 1000 characters"),
        ([], "at least 1 item"),
        ({"sources": [{"path": "a.md"}], "deep": True, "tenant": "no/slash"}, "not a valid name"),
        ({"sources": [{"path": "a.md"}], "depth": 2}, "Extra inputs are not permitted"),
    ],
)
def test_bad_knowledge_blocks_say_what_to_fix(knowledge: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Agent(name="helper", knowledge=knowledge)
    assert Agent(name="helper", knowledge=[{"path": "a.md"}]).knowledge is not None
