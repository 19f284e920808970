"""Facts of connected projects: correction, deletion, links, expiry, and isolation by tenant and project."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlean
from pydantic import ValidationError

from switchboard.core.agent.config import Agent
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.tools.builtin import default_registry
from switchboard.settings import FileConfig
from tests.memory.conftest import CONFIG, Memory, Turn, inbound

FACTS = [
    "Ann prefers delivery on Friday mornings",
    "The Paris warehouse closes early on Friday",
    "Order 1234 ships by express courier",
]


def _said(*texts: str, tenant: str = "acme") -> Turn:
    return Turn(inbound=[inbound(text, f"m{index}", tenant) for index, text in enumerate(texts)])


async def _remember(memory: Memory, turn: Turn, text: str, **more: Any) -> str:
    where = _where(more)
    source = {"kind": "message", "quote": text[:200]}
    outcome = await memory.call("remember", {"text": text, "source": source, **more}, turn, **where)
    assert outcome.ok, outcome
    return str(outcome.value["remembered"])


def _where(more: dict[str, Any]) -> dict[str, Any]:
    return {key: more.pop(key) for key in ("tenant", "agent", "run_id") if key in more}


async def _recall(memory: Memory, query: str, **where: Any) -> list[dict[str, Any]]:
    outcome = await memory.call("recall", {"query": query, "limit": 10}, None, **where)
    assert outcome.ok, outcome
    return list(outcome.value["facts"])


async def test_recall_finds_facts_with_their_ids_dates_and_sources(memory: Memory) -> None:
    turn = _said(*FACTS)
    ids = [await _remember(memory, turn, text, project="shop", run_id=f"run-{i}") for i, text in enumerate(FACTS)]
    found = await _recall(memory, "friday delivery")
    assert [fact["id"] for fact in found] == [ids[0], ids[1]]  # both words beat one word
    assert found[0]["text"] == FACTS[0] and found[0]["source"] == {"kind": "message", "ref": ""}
    assert found[0]["created_at"] == datetime.fromtimestamp(memory.now[0], UTC).isoformat(timespec="seconds")
    assert await _recall(memory, "submarine") == []
    shown = await memory.call("recall", {"query": "friday", "limit": 10}, None)  # outside data, shown inline
    assert shown.ok and shown.tier == "inline"
    assert memory.gateway.registry.get("recall").output_trust == "data"  # type: ignore[union-attr]


async def test_long_facts_are_shown_capped(memory: Memory) -> None:
    text = "Friday " + "word " * 390
    await _remember(memory, _said(text), text, project="shop")
    (found,) = await _recall(memory, "friday")
    assert len(found["text"]) == 400 and found["text"].endswith("…")


async def test_a_correction_replaces_the_text_and_says_who_and_why(memory: Memory) -> None:
    turn = _said("Ann's address is 5 Rue Lepic", "Sorry, Ann moved to 12 Rue Cler")
    fact_id = await _remember(memory, turn, "Ann's address is 5 Rue Lepic", project="shop")
    source = {"kind": "message", "ref": "m1", "quote": "moved to 12 Rue Cler"}
    args = {"fact_id": fact_id, "text": "Ann's address is 12 Rue Cler", "source": source, "reason": "Ann moved"}
    outcome = await memory.call("correct", args, turn, run_id="run-2")
    assert outcome.ok, outcome
    assert await _recall(memory, "lepic") == []
    (found,) = await _recall(memory, "cler")
    assert found["id"] == fact_id and found["corrected_at"] is not None and found["source"]["ref"] == "m1"
    changes = await memory.store.changes("acme", fact_id)
    assert [(c.op, c.actor, c.agent, c.run_id) for c in changes] == [
        ("remembered", "web:ann", "support", "run-1"),
        ("corrected", "web:ann", "support", "run-2"),
    ]
    assert changes[1].reason == "Ann moved"
    assert [event.op for event in turn.events] == ["remembered", "corrected"]  # type: ignore[union-attr]


async def test_forget_deletes_the_fact_its_words_and_its_links(memory: Memory, tmp_path: Path) -> None:
    turn = _said("Ann's phone is 0612345678", "Ann prefers email")
    phone = await _remember(memory, turn, "Ann's phone is 0612345678", project="shop")
    email = await _remember(memory, turn, "Ann prefers email", project="shop")
    linked = await memory.call("link", {"fact_id": phone, "to": email, "reason": "both contact"}, turn)
    assert linked.ok, linked
    assert {fact["id"]: fact["links"] for fact in await _recall(memory, "ann")} == {phone: [email], email: [phone]}

    outcome = await memory.call("forget", {"fact_id": phone, "reason": "Ann asked us to"}, turn)
    assert outcome.ok, outcome
    assert [(fact["id"], fact["links"]) for fact in await _recall(memory, "ann")] == [(email, [])]
    again = await memory.call("forget", {"fact_id": phone, "reason": "Ann asked us to"}, turn, run_id="run-2")
    assert not again.ok and "no fact" in str(again.error)
    (change,) = [c for c in await memory.store.changes("acme", phone) if c.op == "forgotten"]
    assert change.reason == "Ann asked us to" and change.actor == "web:ann"
    memory.store.close()
    db = sqlean.connect(str(memory.store.path("acme")))
    try:  # the number is gone from the rows and the index, not only hidden
        assert db.execute("SELECT count(*) FROM facts WHERE text LIKE '%0612345678%'").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM passages WHERE text LIKE '%0612345678%'").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM passages_fts WHERE passages_fts MATCH '0612345678'").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM changes WHERE reason LIKE '%0612345678%'").fetchone() == (0,)
    finally:
        db.close()
    left = b"".join(path.read_bytes() for path in memory.store.root.iterdir())
    assert b"0612345678" not in left


async def test_expired_facts_are_not_recalled(memory: Memory) -> None:
    turn = _said("The Friday sale ends tonight", "Friday opening hours are 9 to 17")
    hour = 3600.0
    until = datetime.fromtimestamp(memory.now[0] + hour, UTC).isoformat()
    sale = await _remember(memory, turn, "The Friday sale ends tonight", project="shop", expires_at=until)
    hours = await _remember(memory, turn, "Friday opening hours are 9 to 17", project="shop")
    assert {fact["id"] for fact in await _recall(memory, "friday")} == {sale, hours}
    memory.now[0] += 2 * hour
    assert [fact["id"] for fact in await _recall(memory, "friday")] == [hours]
    past = datetime.fromtimestamp(memory.now[0] - hour, UTC).isoformat()
    source = {"kind": "message", "quote": "sale ends"}
    late = await memory.call("remember", {"text": "Sale", "source": source, "expires_at": past}, turn)
    assert not late.ok and "in the past" in str(late.error)
    assert len(await memory.store.facts("acme", ["shop"])) == 2


async def test_other_tenants_and_unconnected_projects_never_appear_nor_change_the_ranking(memory: Memory) -> None:
    turn = _said(*FACTS)
    for text in FACTS:
        await _remember(memory, turn, text, project="shop")
    before = await _recall(memory, "friday delivery courier")
    scores = [hit.score for hit in await memory.store.search("acme", ["shop"], "friday delivery courier", 20, 2e9)]

    noise = [f"Friday delivery note {n}" for n in range(30)] + ["courier courier courier"]
    hr_turn = _said(*noise)
    for text in noise:  # the same words, in a project support is not connected to, and in another tenant
        await _remember(memory, hr_turn, text, agent="people")
    globex = _said(*noise, tenant="globex")
    for text in noise:
        await _remember(memory, globex, text, tenant="globex")

    after = await _recall(memory, "friday delivery courier")
    assert after == before
    assert [hit.score for hit in await memory.store.search("acme", ["shop"], "friday delivery courier", 20, 2e9)] == (
        scores
    )
    assert {fact["project"] for fact in after} == {"shop"}
    assert {fact["project"] for fact in await _recall(memory, "friday", tenant="globex")} == {"rival"}
    assert {fact["project"] for fact in await _recall(memory, "friday", agent="people")} == {"hr"}
    assert memory.store.path("acme") != memory.store.path("globex")


async def test_another_tenants_or_projects_fact_cannot_be_changed_or_linked(memory: Memory) -> None:
    mine = await _remember(memory, _said("Ann likes tea"), "Ann likes tea", project="shop")
    theirs = await _remember(memory, _said("Bob likes coffee", tenant="globex"), "Bob likes coffee", tenant="globex")
    hr = await _remember(memory, _said("Carl is on leave"), "Carl is on leave", agent="people")
    turn = _said("Bob likes tea now")
    source = {"kind": "message", "quote": "likes tea now"}
    for fact_id in (theirs, hr):
        calls = [
            ("correct", {"fact_id": fact_id, "text": "x", "source": source, "reason": "why not"}),
            ("forget", {"fact_id": fact_id, "reason": "why not"}),
            ("link", {"fact_id": mine, "to": fact_id, "reason": "why not"}),
        ]
        for name, args in calls:
            outcome = await memory.call(name, args, turn)
            assert not outcome.ok and "no fact" in str(outcome.error), (name, outcome)
    assert [c.op for c in await memory.store.changes("acme")] == ["remembered", "remembered"]
    assert [c.op for c in await memory.store.changes("globex")] == ["remembered"]
    unknown = await memory.call("recall", {"query": "tea", "project": "hr"}, None)
    assert not unknown.ok and "no connected project 'hr'" in str(unknown.error)


def test_a_tenant_name_cannot_leave_the_memory_folder(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path)
    for name in ("../acme", "a/b", ".hidden", ""):
        with pytest.raises(ValueError, match="not a valid name"):
            store.path(name)


def test_agents_connect_projects_of_the_file(tmp_path: Path) -> None:
    config = FileConfig.model_validate(CONFIG)
    assert config.connected_projects("support", "acme") == ["shop"]
    assert config.connected_projects("support", "globex") == ["rival"]
    assert config.connected_projects("nobody", "acme") == []
    broken = {**CONFIG, "agents": {"x": {"name": "x", "projects": ["nope"]}}}
    with pytest.raises(ValidationError, match=r"agents\.x\.projects names 'nope'"):
        FileConfig.model_validate(broken)
    with pytest.raises(ValidationError, match="not a valid name"):
        FileConfig.model_validate({"projects": {"../up": {}}})
    store = SQLiteMemoryStore(tmp_path)
    registry = default_registry(sandbox=None, memory=(store, config.connected_projects))
    agent = Agent.model_validate(CONFIG["agents"]["support"])
    names = [tool.name for tool in registry.for_agent(agent)]
    assert names == ["current_time", "remember", "recall", "read_memory", "link", "correct", "forget"]
    assert [tool.name for tool in registry.for_agent(agent.model_copy(update={"projects": []}))] == ["current_time"]


async def test_a_rerun_of_the_same_call_stores_the_fact_once(memory: Memory) -> None:
    turn = _said("Ann prefers delivery on Friday mornings")
    first = await _remember(memory, turn, FACTS[0], project="shop")
    again = await _remember(memory, turn, FACTS[0], project="shop")  # the same run, call and arguments
    other = await _remember(memory, turn, FACTS[0], project="shop", run_id="run-2")
    assert first == again != other
    assert len(await memory.store.facts("acme", ["shop"])) == 2
    assert [c.op for c in await memory.store.changes("acme")] == ["remembered", "remembered"]


async def test_an_expiry_without_a_time_zone_is_refused(memory: Memory) -> None:
    turn = _said("The sale ends at midnight")
    source = {"kind": "message", "quote": "sale ends"}
    outcome = await memory.call(
        "remember", {"text": "Sale ends", "source": source, "expires_at": "2030-01-01T00:00:00"}, turn
    )
    assert not outcome.ok and "time zone" in str(outcome.error)
    assert await memory.store.facts("acme", ["shop"]) == []
