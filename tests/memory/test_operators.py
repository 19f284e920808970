"""Operators and memory through the control service, on the real store and the suite's real Redis.

Listing projects and facts, correcting and deleting a fact (recorded with who and why, in the store and the audit
stream), within the operator's tenants only; bad input changes nothing; connections made by operators reach the
memory tools of the agent's next turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.control import InvalidRequestError, NotFoundError, OperatorScope, OutOfScopeError
from switchboard.control.memory import MemoryControl, memory_store
from switchboard.core.memory.embeddings import LocalEmbedder
from switchboard.core.memory.facts import Fact, FactChange, Source
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.turn import TurnRequest, TurnResult
from switchboard.queue.erasure import Eraser
from switchboard.queue.keys import GlobalKeys
from switchboard.settings import Settings, load_settings
from switchboard.worker.projects import LiveConnections
from tests.core.turns import MemorySink, MemoryStore, agent, message

CONFIG = """
default_agent: support
projects:
  shop: {tenant: acme, description: orders and deliveries}
  hr: {tenant: acme}
  rival: {tenant: globex}
agents:
  support:
    profile: {name: Support}
    instructions: Help.
    projects: [shop]
  people:
    profile: {name: People}
    instructions: Help.
"""

ACME = OperatorScope(operator="console:alice", tenants=frozenset({"acme"}))
GLOBEX = OperatorScope(operator="console:bob", tenants=frozenset({"globex"}))
SAID = Source(kind="message", ref="m1", quote="ships on Friday")


def _fact(fact_id: str, project: str, tenant: str, text: str, at: float) -> tuple[Fact, FactChange]:
    fact = Fact(id=fact_id, project=project, tenant=tenant, text=text, source=SAID, run_id="run-1", created_at=at)
    change = FactChange(fact_id=fact_id, project=project, op="remembered", actor="web:ann", agent="support", at=at)
    return fact, change


@pytest.fixture
def settings(base_env: dict[str, str], tmp_path: Path) -> Settings:
    config = tmp_path / "memory.yaml"
    config.write_text(CONFIG)
    return load_settings({**base_env, "SWITCHBOARD_CONFIG": str(config)})


@pytest.fixture
async def control(settings: Settings, async_redis: aioredis.Redis) -> AsyncIterator[MemoryControl]:
    store = memory_store(settings)
    for fact, change in (
        _fact("f_a1", "shop", "acme", "Ann's order ships on Friday", 1000.0),
        _fact("f_a2", "hr", "acme", "Bo works on Mondays", 1001.0),
        _fact("f_b1", "rival", "globex", "Globex ships on Friday too", 1002.0),
    ):
        await store.add(fact, change)
    yield MemoryControl(settings, store, async_redis)
    store.close()


async def test_an_operator_lists_the_projects_and_facts_of_their_tenants_only(control: MemoryControl) -> None:
    projects = await control.projects(ACME)
    assert [(p.name, p.tenant, p.agents, p.facts) for p in projects] == [
        ("hr", "acme", [], 1),
        ("shop", "acme", ["support"], 1),
    ]
    assert [f.id for f in await control.facts(ACME, "acme")] == ["f_a1", "f_a2"]
    (shop,) = await control.facts(ACME, "acme", "shop")
    assert (shop.text, shop.source["kind"], shop.source["quote"], shop.confidence) == (
        "Ann's order ships on Friday",
        "message",
        "ships on Friday",
        1.0,
    )
    assert [p.name for p in await control.projects(GLOBEX)] == ["rival"]
    with pytest.raises(OutOfScopeError):
        await control.facts(ACME, "globex")
    with pytest.raises(OutOfScopeError):
        await control.projects(ACME, "globex")
    with pytest.raises(NotFoundError):
        await control.facts(ACME, "acme", "rival")  # another tenant's project is no project of acme
    with pytest.raises(NotFoundError):
        await control.show(ACME, "acme", "f_b1")  # another tenant's id is unknown here
    with pytest.raises(InvalidRequestError):
        await control.facts(ACME, "../globex")


async def test_a_scope_that_reads_no_messages_sees_no_fact_text(control: MemoryControl) -> None:
    blind = OperatorScope(operator="console:carol", tenants=frozenset({"acme"}), reads_messages=False)
    (fact,) = await control.facts(blind, "acme", "shop")
    assert fact.redacted and fact.text == "" and fact.source["quote"] == "" and fact.id == "f_a1"


async def test_a_correction_keeps_the_source_and_records_who_and_why(
    control: MemoryControl, async_redis: aioredis.Redis
) -> None:
    detail = await control.correct(ACME, "acme", "f_a1", " Ann's order ships on Monday ", "the shop moved it", 0.8)
    assert (detail.fact.text, detail.fact.confidence, detail.fact.source["quote"]) == (
        "Ann's order ships on Monday",
        0.8,
        "ships on Friday",
    )
    assert detail.fact.updated_at is not None
    assert [(c.op, c.actor, c.reason) for c in detail.changes] == [
        ("remembered", "web:ann", ""),
        ("corrected", "console:alice", "the shop moved it"),
    ]
    audit = await async_redis.xrange(GlobalKeys().memory_audit)
    assert [(f[b"op"], f[b"actor"], f[b"tenant"], f[b"fact_id"]) for _, f in audit] == [
        (b"corrected", b"console:alice", b"acme", b"f_a1")
    ]
    assert b"Monday" not in b"".join(v for _, f in audit for v in f.values())  # ids, never the text
    assert [(e.op, e.fact_id) for e in await control.audit(ACME, "acme")] == [("corrected", "f_a1")]
    with pytest.raises(OutOfScopeError):
        await control.audit(GLOBEX, "acme")


async def test_a_deletion_removes_the_fact_and_keeps_its_record(control: MemoryControl) -> None:
    change = await control.forget(ACME, "acme", "f_a2", "Bo asked to be forgotten")
    assert (change.op, change.actor, change.reason) == ("forgotten", "console:alice", "Bo asked to be forgotten")
    assert [f.id for f in await control.facts(ACME, "acme")] == ["f_a1"]
    with pytest.raises(NotFoundError):
        await control.show(ACME, "acme", "f_a2")
    with pytest.raises(NotFoundError):
        await control.forget(ACME, "acme", "f_a2", "again")
    assert [(c.op, c.actor) for c in await control.store.changes("acme", "f_a2")] == [
        ("remembered", "web:ann"),
        ("forgotten", "console:alice"),
    ]


@pytest.mark.parametrize(
    ("tenant", "fact_id", "body", "error"),
    [
        ("acme", "f_a1", {"text": "", "reason": "why not"}, InvalidRequestError),
        ("acme", "f_a1", {"text": "   ", "reason": "why not"}, InvalidRequestError),
        ("acme", "f_a1", {"text": "x" * 2001, "reason": "why not"}, InvalidRequestError),
        ("acme", "f_a1", {"text": "\ud800 lone surrogate", "reason": "why not"}, InvalidRequestError),
        ("acme", "f_a1", {"text": 5, "reason": "why not"}, InvalidRequestError),
        ("acme", "f_a1", {"text": "fine", "reason": ""}, InvalidRequestError),
        ("acme", "f_a1", {"text": "fine", "reason": "no"}, InvalidRequestError),
        ("acme", "f_a1", {"text": "fine", "reason": "r" * 501}, InvalidRequestError),
        ("acme", "f_a1", {"text": "fine", "reason": "why not", "confidence": 1.5}, InvalidRequestError),
        ("acme", "f_a1", {"text": "fine", "reason": "why not", "confidence": True}, InvalidRequestError),
        ("acme", "f_a1", {"text": "fine", "reason": "why not", "confidence": "high"}, InvalidRequestError),
        ("acme", "f_*", {"text": "fine", "reason": "why not"}, InvalidRequestError),
        ("acme", "f_ffff", {"text": "fine", "reason": "why not"}, NotFoundError),
        ("acme", "f_b1", {"text": "fine", "reason": "why not"}, NotFoundError),
        ("globex", "f_b1", {"text": "fine", "reason": "why not"}, OutOfScopeError),
        ("a/b", "f_a1", {"text": "fine", "reason": "why not"}, InvalidRequestError),
    ],
)
async def test_a_bad_correction_changes_nothing(
    control: MemoryControl,
    async_redis: aioredis.Redis,
    tenant: str,
    fact_id: str,
    body: dict[str, Any],
    error: type[Exception],
) -> None:
    before = {t: (await control.store.facts(t, ["shop", "hr", "rival"])) for t in ("acme", "globex")}
    with pytest.raises(error):
        await control.correct(ACME, tenant, fact_id, **body)
    assert {t: (await control.store.facts(t, ["shop", "hr", "rival"])) for t in ("acme", "globex")} == before
    assert len(await control.store.changes("acme")) == 2 and len(await control.store.changes("globex")) == 1
    assert await async_redis.xlen(GlobalKeys().memory_audit) == 0


@pytest.mark.parametrize(
    ("tenant", "fact_id", "reason", "error"),
    [
        ("acme", "f_a1", "", InvalidRequestError),
        ("acme", "f_a1", None, InvalidRequestError),
        ("acme", "f_a1", "r" * 501, InvalidRequestError),
        ("acme", "nope", "why not", InvalidRequestError),
        ("acme", "f_b1", "why not", NotFoundError),
        ("globex", "f_b1", "why not", OutOfScopeError),
    ],
)
async def test_a_bad_deletion_deletes_nothing(
    control: MemoryControl,
    async_redis: aioredis.Redis,
    tenant: str,
    fact_id: str,
    reason: Any,
    error: type[Exception],
) -> None:
    with pytest.raises(error):
        await control.forget(ACME, tenant, fact_id, reason)
    assert [f.id for f in await control.store.facts("acme", ["shop", "hr"])] == ["f_a1", "f_a2"]
    assert [f.id for f in await control.store.facts("globex", ["rival"])] == ["f_b1"]
    assert await async_redis.xlen(GlobalKeys().memory_audit) == 0


async def _connected_in_a_turn(live: LiveConnections, tenant: str, name: str = "support") -> list[str]:
    """What the memory tools of a turn of agent ``name`` in ``tenant`` see, through the worker's wrapped runner."""
    seen: list[str] = []

    async def runner(request: TurnRequest, sink: Any, store: Any) -> TurnResult:
        seen.extend(live(request.agent.name, request.tenant))
        assert set(seen) <= set(request.agent.projects)  # the agent is offered the memory tools for them
        return TurnResult(text="", steps=0)

    msg = message("hi")
    msg = msg.model_copy(update={"conversation": msg.conversation.model_copy(update={"tenant": tenant})})
    support = agent().model_copy(update={"name": name, "projects": live.file.agents[name].projects})
    turn = TurnRequest(
        session_key=msg.session_key, agent=support, messages=[msg], run_id="r", deadline=0, tenant=tenant
    )
    await live.wrap(runner)(turn, MemorySink(), MemoryStore())
    return seen


async def test_an_operators_connection_reaches_the_agents_next_turn(
    control: MemoryControl, settings: Settings, async_redis: aioredis.Redis
) -> None:
    live = LiveConnections(settings.file, async_redis)
    assert await _connected_in_a_turn(live, "acme") == ["shop"]  # the YAML file's
    view = await control.connect(ACME, "support", "hr")
    assert (view.name, view.agents, view.connected) == ("hr", [], ["support"])
    assert await _connected_in_a_turn(live, "acme") == ["shop", "hr"]
    assert await _connected_in_a_turn(live, "globex") == []  # a connection is within its project's tenant

    with pytest.raises(InvalidRequestError):
        await control.connect(ACME, "support", "hr")  # already
    with pytest.raises(InvalidRequestError):
        await control.connect(ACME, "support", "shop")  # the file's
    with pytest.raises(InvalidRequestError):
        await control.disconnect(ACME, "support", "shop")  # the file's: change it there
    with pytest.raises(NotFoundError):
        await control.connect(ACME, "nobody", "hr")
    with pytest.raises(NotFoundError):
        await control.connect(ACME, "support", "rival")  # another tenant's project is not said to exist
    with pytest.raises(NotFoundError):
        await control.connect(ACME, "support", 7)

    assert await _connected_in_a_turn(live, "acme", "people") == []
    await control.connect(ACME, "people", "hr")  # an agent the file connects to no project
    assert await _connected_in_a_turn(live, "acme", "people") == ["hr"]
    await control.disconnect(ACME, "people", "hr")

    await control.disconnect(ACME, "support", "hr")
    assert await _connected_in_a_turn(live, "acme") == ["shop"]
    with pytest.raises(NotFoundError):
        await control.disconnect(ACME, "support", "hr")
    audit = [(e.op, e.actor, e.agent, e.project) for e in await control.audit(ACME, "acme")]
    assert audit == [
        ("disconnected", "console:alice", "support", "hr"),
        ("disconnected", "console:alice", "people", "hr"),
        ("connected", "console:alice", "people", "hr"),
        ("connected", "console:alice", "support", "hr"),
    ]


async def test_erasing_a_tenant_removes_its_connections(control: MemoryControl, async_redis: aioredis.Redis) -> None:
    await control.connect(ACME, "support", "hr")
    await control.connect(GLOBEX, "people", "rival")
    await Eraser(async_redis).erase("acme", by="cli:root")
    assert await control.connections.of("acme") == {}
    assert await control.connections.of("globex") == {"people": ["rival"]}


def test_the_operators_store_is_the_workers(settings: Settings) -> None:
    store = memory_store(settings)
    assert isinstance(store, SQLiteMemoryStore) and store.root == settings.data_path / "memory"


async def test_a_correction_is_embedded_again_for_vector_search(control: MemoryControl) -> None:
    embedder = LocalEmbedder()
    embedded = MemoryControl(control.settings, control.store, control.connections.redis, embedder)
    await embedded.correct(ACME, "acme", "f_a1", "Ann's parcel leaves the warehouse on Monday", "the shop moved it")
    (query,) = await embedder.embed(["parcel leaves the warehouse"])
    hits = await control.store.nearest("acme", ["shop", "hr"], query, 5, 2000.0)
    assert [hit.fact.id for hit in hits] == ["f_a1"] and hits[0].fact.text.endswith("on Monday")
    assert hits[0].score > 0.5
