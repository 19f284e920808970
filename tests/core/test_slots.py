"""Session-state slots: typed, overwritten on update, capped, stored, and shown at the start of every turn."""

from __future__ import annotations

import json
from pathlib import Path

from switchboard.core.agent.replay import ReplayModel
from switchboard.core.agent.slots import SLOT_MAX_BYTES, Slots, slot_bytes
from switchboard.core.providers.offline import OfflineModel
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import CallScope, ToolGateway
from switchboard.types import SessionKey
from tests.core.turns import MemorySink, MemoryStore, agent, answer_step, calls_step, request, runtime

SLOT_TOOLS = ["update_plan", "update_context", "update_state"]


def ctx(tmp_path: Path, store: MemoryStore | None) -> ToolContext:
    return ToolContext(
        session_key=SessionKey("t/a/web/default/c"),
        tenant="t",
        run_id="r",
        actor="u",
        workspace=tmp_path,
        idempotency_key="",
        store=store,
    )


async def test_each_update_overwrites_the_whole_slot(tmp_path: Path) -> None:
    store = MemoryStore()
    gw = ToolGateway(default_registry(), workspace_root=tmp_path)
    await gw.call("update_plan", {"goal": "book a flight", "approach": "search first"}, ctx(tmp_path, store))
    await gw.call("update_plan", {"goal": "book a train"}, ctx(tmp_path, store))
    assert store.slots["plan"] == {"goal": "book a train", "approach": "", "progress": ""}
    await gw.call("update_context", {"paths": ["notes.md", " notes.md", "data/q3.csv", ""]}, ctx(tmp_path, store))
    assert store.slots["context"] == ["notes.md", "data/q3.csv"]
    await gw.call("update_state", {"values": {"order_id": "A1", "step": 2}}, ctx(tmp_path, store))
    await gw.call("update_state", {"values": {"step": 3}}, ctx(tmp_path, store))
    assert store.slots["state"] == {"step": 3}


async def test_size_cap_gives_a_clear_error_and_saves_nothing(tmp_path: Path) -> None:
    store = MemoryStore(slots={"state": {"keep": "me"}})
    gw = ToolGateway(default_registry(), workspace_root=tmp_path)
    huge = {"blob": "x" * SLOT_MAX_BYTES}
    out = await gw.call("update_state", {"values": huge}, ctx(tmp_path, store))
    assert (out.ok, out.error_class) == (False, "validation")
    assert f"at most {SLOT_MAX_BYTES} bytes" in (out.error or "") and "state slot" in (out.error or "")
    assert store.saved == [] and store.slots["state"] == {"keep": "me"}
    just_fits = {"blob": "x" * (SLOT_MAX_BYTES - 20)}
    assert slot_bytes(just_fits) <= SLOT_MAX_BYTES
    assert (await gw.call("update_state", {"values": just_fits}, ctx(tmp_path, store))).ok


async def test_invalid_slot_arguments_are_correctable(tmp_path: Path) -> None:
    gw = ToolGateway(default_registry(), workspace_root=tmp_path)
    out = await gw.call("update_context", {"paths": "notes.md"}, ctx(tmp_path, MemoryStore()))
    assert out.error_class == "validation" and "paths" in (out.error or "")
    missing = await gw.call("update_plan", {"approach": "no goal"}, ctx(tmp_path, MemoryStore()))
    assert missing.error_class == "validation" and "goal" in (missing.error or "")


async def test_without_a_store_the_error_is_permanent(tmp_path: Path) -> None:
    out = await ToolGateway(default_registry(), workspace_root=tmp_path).call(
        "update_plan", {"goal": "g"}, ctx(tmp_path, None), scope=CallScope()
    )
    assert out.error_class == "permanent" and "not available" in (out.error or "")


def test_stored_slots_are_read_leniently_and_rendered() -> None:
    slots = Slots.from_store({"plan": {"goal": "ship v2", "progress": "tests green"}, "context": "oops", "other": 1})
    assert slots.plan == {"goal": "ship v2", "progress": "tests green"} and slots.context is None
    text = slots.with_value("state", {"ticket": "T-9"}).render()
    assert "goal: ship v2" in text and "progress: tests green" in text
    assert "context: (none)" in text and 'state: {"ticket": "T-9"}' in text
    assert Slots().empty and Slots().as_inputs() == {"plan": {}, "context": [], "state": {}}


async def test_slots_are_shown_at_the_start_of_every_turn(tmp_path: Path) -> None:
    store = MemoryStore(slots={"plan": {"goal": "migrate the database"}, "context": ["docs/migration.md"]})
    model = ReplayModel([answer_step("ok"), answer_step("ok again")], strict=False)
    rt = runtime(tmp_path, model=model)
    ag = agent(tools=["current_time", *SLOT_TOOLS])
    await rt.run_turn(request("first", agent_=ag), MemorySink(), store)
    store.slots["state"] = {"table": "orders"}
    await rt.run_turn(request("second", agent_=ag), MemorySink(), store)
    for sent in model.requests:  # slots are session data, never system instructions
        assert "migrate the database" not in sent.system and sent.messages[-2].trust == "data"
    first, second = (r.messages[-2].content for r in model.requests)
    assert first.startswith('<data source="session" trust="untrusted">')
    assert "goal: migrate the database" in first and "docs/migration.md" in first and "state: (none)" in first
    assert 'state: {"table": "orders"}' in second


async def test_agents_without_slot_tools_see_no_empty_slot_section(tmp_path: Path) -> None:
    model = ReplayModel([answer_step("ok")], strict=False)
    await runtime(tmp_path, model=model).run_turn(request("hi"), MemorySink(), MemoryStore())
    sent = model.requests[0]
    assert "Session state" not in sent.system
    assert [m.trust_class for m in sent.messages] == ["user"]


async def test_a_turn_updates_slots_through_the_store_and_programs_see_them(tmp_path: Path) -> None:
    store = MemoryStore()
    plan = {"goal": "count to three", "progress": "started"}
    model = ReplayModel(
        [
            calls_step(("update_plan", plan), ("update_state", {"values": {"n": 3}}), step=1),
            calls_step(("run_program", {"code": "[plan['goal'], state['n'] + 1]"}), step=2),
            answer_step("done", step=3),
        ],
        strict=False,
    )
    ag = agent(tools=["current_time", *SLOT_TOOLS], codeact=True)
    sink = MemorySink()
    result = await runtime(tmp_path, model=model).run_turn(request("go", agent_=ag), sink, store)
    assert result.text == "done"
    assert store.slots["plan"] == {"goal": "count to three", "approach": "", "progress": "started"}
    assert store.slots["state"] == {"n": 3}
    program_result = json.loads(model.requests[2].messages[-1].content)
    assert program_result["value"] == ["count to three", 4]
    assert store.appended == []  # history is the queue layer's job


async def test_slot_demo_with_the_offline_model(tmp_path: Path) -> None:
    store = MemoryStore()
    ag = agent(tools=SLOT_TOOLS)
    sink = MemorySink()
    result = await runtime(tmp_path, model=OfflineModel()).run_turn(
        request('/tool update_plan {"goal": "write the report"}', agent_=ag), sink, store
    )
    assert store.slots["plan"]["goal"] == "write the report"
    assert "update_plan returned" in result.text
