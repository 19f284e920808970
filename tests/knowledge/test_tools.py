"""``search_knowledge`` and ``read_source`` through the tool gateway: results as data with ids, titles, summaries,
keywords and a capped passage; ranged reads; only the agent's own knowledge, only in its tenant; graph expansion
for deep agents."""

from __future__ import annotations

import pytest

from switchboard.core.agent.config import Agent
from switchboard.core.knowledge.tools import MAX_PASSAGE_CHARS, knowledge_tools
from switchboard.core.memory.embeddings import LocalEmbedder
from switchboard.core.tools.builtin import ToolRegistry
from tests.knowledge.conftest import World

YAML = """
default_agent: helper
agents:
  helper:
    name: helper
    knowledge: [{path: docs}]
  deep:
    name: deep
    knowledge: {deep: true, sources: [{path: docs}]}
  other:
    name: other
    knowledge: {tenant: acme, sources: [{path: docs}]}
  plain:
    name: plain
"""

LONG = "\n\n".join(
    f"Section {n}. The descaling routine of the kettle takes {n} minutes when the water is hard." for n in range(200)
)


def _sources(world: World) -> None:
    docs = world.root / "docs"
    docs.mkdir()
    (docs / "manual.md").write_text("# Kettle manual\n\n" + LONG + "\n\nThe zircon element glows when ready.\n")
    # shares the keyword "kettle" with the manual, none of the query's words
    (docs / "recall.md").write_text("Kettle recall notice. Kettle models from 2019 are recalled for a loose lid.\n")
    (docs / "menu.md").write_text("Lunch menu: soup, bread and salad every weekday.\n")


async def test_search_gives_ids_titles_summaries_keywords_and_a_capped_passage_as_data(world: World) -> None:
    _sources(world)
    world.reload(YAML)
    await world.index("helper")
    outcome = await world.call("search_knowledge", {"query": "zircon element"}, agent="helper")
    assert outcome.ok, outcome
    assert world.gateway is not None and world.gateway.registry.get("search_knowledge").output_trust == "data"
    [found] = outcome.value["sources"]
    assert found["title"] == "docs/manual.md" and found["kind"] == "file" and found["id"].startswith("f_")
    assert found["summary"].startswith("Kettle manual Section 0.") and "kettle" in found["keywords"]
    assert "zircon" in found["passage"] and len(found["passage"]) <= MAX_PASSAGE_CHARS
    assert found["length"] > 10_000 and outcome.value["mode"] == "lexical"
    assert "linked_from" not in found
    none = await world.call("search_knowledge", {"query": "spaceship"}, agent="helper")
    assert none.ok and none.value["count"] == 0


async def test_read_source_reads_by_range_and_says_where_to_go_next(world: World) -> None:
    _sources(world)
    world.reload(YAML)
    await world.index("helper")
    [found] = (await world.call("search_knowledge", {"query": "zircon"}, agent="helper")).value["sources"]
    first = await world.call("read_source", {"id": found["id"], "length": 500}, agent="helper")
    assert first.ok, first
    body = first.value
    assert body["title"] == "docs/manual.md" and body["offset"] == 0 and body["text"].startswith("# Kettle manual")
    assert len(body["text"]) == 500 and body["next_offset"] == 500 and body["total_chars"] == found["length"]
    second = await world.call("read_source", {"id": found["id"], "offset": 500, "length": 500}, agent="helper")
    assert second.value["text"][:20] != body["text"][:20]
    assert (body["text"] + second.value["text"]) in ("# Kettle manual\n\n" + LONG)
    total = body["total_chars"]
    last = await world.call("read_source", {"id": found["id"], "offset": total - 100, "length": 8000}, agent="helper")
    assert last.value["next_offset"] is None and last.value["text"].endswith("glows when ready.")
    past = await world.call("read_source", {"id": found["id"], "offset": total + 5}, agent="helper")
    assert not past.ok and past.error_class == "validation" and f"has {total} characters" in str(past.error)
    too_long = await world.call("read_source", {"id": found["id"], "length": 9000}, agent="helper")
    assert not too_long.ok and too_long.error_class == "validation"


async def test_each_agent_sees_only_its_own_knowledge_and_only_in_its_tenant(world: World) -> None:
    _sources(world)
    world.reload(YAML)
    await world.index("helper")
    await world.index("other")  # the same files, for tenant acme
    [mine] = (await world.call("search_knowledge", {"query": "zircon"}, agent="helper")).value["sources"]
    [theirs] = (await world.call("search_knowledge", {"query": "zircon"}, agent="other", tenant="acme")).value[
        "sources"
    ]
    assert mine["id"] != theirs["id"]
    wrong_tenant = await world.call("search_knowledge", {"query": "zircon"}, agent="helper", tenant="acme")
    assert not wrong_tenant.ok and "no knowledge" in str(wrong_tenant.error)
    foreign = await world.call("read_source", {"id": theirs["id"]}, agent="helper")
    assert not foreign.ok and "no source" in str(foreign.error)
    plain = await world.call("search_knowledge", {"query": "zircon"}, agent="plain")
    assert not plain.ok and "no knowledge" in str(plain.error)
    registry = ToolRegistry(knowledge_tools(world.store, lambda: world.settings.file.agents))
    agents = world.settings.file.agents
    assert [t.name for t in registry.for_agent(agents["helper"])] == ["search_knowledge", "read_source"]
    assert registry.for_agent(Agent(name="plain", tools=[])) == []


@pytest.mark.parametrize("vectors", [False, True], ids=["words", "embeddings"])
async def test_a_deep_agent_reaches_a_source_linked_by_a_shared_keyword(world: World, vectors: bool) -> None:
    world.embedder = LocalEmbedder() if vectors else None
    _sources(world)
    world.reload(YAML)
    await world.index("helper")
    await world.index("deep")
    flat = (await world.call("search_knowledge", {"query": "zircon", "limit": 1}, agent="helper")).value
    assert [s["title"] for s in flat["sources"]] == ["docs/manual.md"]
    assert flat["mode"] == ("hybrid" if vectors else "lexical")
    assert all(
        "linked_from" not in s
        for s in (await world.call("search_knowledge", {"query": "zircon"}, agent="helper")).value["sources"]
    )
    deep = (await world.call("search_knowledge", {"query": "zircon", "limit": 2}, agent="deep")).value
    titles = [s["title"] for s in deep["sources"]]
    assert deep["mode"] == "graph" and titles[0] == "docs/manual.md" and "docs/recall.md" in titles
    assert titles == ["docs/manual.md", "docs/recall.md"]  # the menu shares no keyword with the manual
    [linked] = [s for s in deep["sources"] if s["title"] == "docs/recall.md"]
    assert linked["linked_from"] == deep["sources"][0]["id"]
    docs = {doc.ref: doc for doc in await world.indexer().documents("default", "deep")}
    assert docs["docs/recall.md"].fact.id in docs["docs/manual.md"].fact.links
    assert not docs["docs/menu.md"].fact.links
