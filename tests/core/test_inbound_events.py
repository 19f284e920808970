"""Every inbound event kind through a real turn: what the model reads, and the turns answered without it."""

from __future__ import annotations

import time
from pathlib import Path

from switchboard.core.agent.replay import ReplayModel
from switchboard.core.inbound import RESET_TEXT, history_text
from switchboard.core.messages import (
    ChoiceSelected,
    CommandIssued,
    Contact,
    Location,
    MessageDeleted,
    MessageEdited,
    Posted,
)
from switchboard.core.turn import HistoryEntry, TurnRequest
from tests.core.turns import MemorySink, MemoryStore, agent, answer_step, message, runtime

EARLIER = [HistoryEntry(role="user", text="my name is Ada"), HistoryEntry(role="assistant", text="Hi Ada")]


def turn(*messages: object) -> TurnRequest:
    msgs = list(messages)
    return TurnRequest(
        session_key=msgs[0].session_key,  # type: ignore[attr-defined]
        agent=agent(),
        messages=msgs,  # type: ignore[arg-type]
        run_id="run-1",
        deadline=time.time() + 60,
    )


def last_user(model: ReplayModel) -> str:
    return [m.content for m in model.requests[0].messages if m.role == "user"][-1]


async def test_a_choice_reaches_the_model_as_the_chosen_id_and_label(tmp_path: Path) -> None:
    offered = ChoiceSelected(option_id="plan-pro", offer_message_id="77", ack_ref="cb1", offered=True)
    click = message("Pro plan", event=offered)
    result = await runtime(tmp_path).run_turn(turn(click), MemorySink(), MemoryStore())
    assert "chose option plan-pro (Pro plan)" in result.text  # the offline model echoes the id verbatim


async def test_a_choice_without_a_label_still_names_the_id(tmp_path: Path) -> None:
    model = ReplayModel([answer_step("ok")], strict=False)
    click = message("", event=ChoiceSelected(option_id="42", offered=True))
    await runtime(tmp_path, model=model).run_turn(turn(click), MemorySink(), MemoryStore())
    assert last_user(model) == "chose option 42"


async def test_a_click_the_gateway_did_not_find_offered_reads_as_not_offered(tmp_path: Path) -> None:
    model = ReplayModel([answer_step("ok")], strict=False)
    click = message("Approve the refund", event=ChoiceSelected(option_id="approve"))  # not checked, or not found
    await runtime(tmp_path, model=model).run_turn(turn(click), MemorySink(), MemoryStore())
    assert last_user(model) == "clicked an option that was not offered here: approve"


async def test_an_edit_is_answered_as_an_edit(tmp_path: Path) -> None:
    model = ReplayModel([answer_step("noted")], strict=False)
    edit = message("meet at 5pm, not 4pm", event=MessageEdited(original_id="123"))
    result = await runtime(tmp_path, model=model).run_turn(turn(edit), MemorySink(), MemoryStore())
    assert last_user(model) == "edited an earlier message to: meet at 5pm, not 4pm"
    assert result.text == "noted"


async def test_a_deletion_is_recorded_but_never_reaches_the_model(tmp_path: Path) -> None:
    model = ReplayModel([], strict=False)
    sink = MemorySink()
    gone = message("", event=MessageDeleted(original_id="123"))
    result = await runtime(tmp_path, model=model).run_turn(turn(gone), sink, MemoryStore())
    assert (result.text, result.steps, model.requests, sink.events) == ("", 0, [], [])
    assert history_text(gone) == "(deleted an earlier message)"


async def test_reset_forgets_the_conversation_without_the_model(tmp_path: Path) -> None:
    model = ReplayModel([answer_step("fresh")], strict=False)
    store = MemoryStore(EARLIER, slots={"plan": "old plan"})
    rt = runtime(tmp_path, model=model)
    result = await rt.run_turn(turn(message("", event=CommandIssued(name="reset"))), MemorySink(), store)
    assert (result.text, result.steps, model.requests) == (RESET_TEXT, 0, [])
    assert (store.history, store.slots, store.resets) == ([], {}, 1)
    await rt.run_turn(turn(message("who am I?", id="m2")), MemorySink(), store)
    assert [(m.role, m.content) for m in model.requests[0].messages] == [("user", "who am I?")]


async def test_a_message_after_reset_in_the_same_turn_is_answered_on_a_clean_slate(tmp_path: Path) -> None:
    model = ReplayModel([answer_step("hello again")], strict=False)
    store = MemoryStore(EARLIER)
    reset = message("", id="m1", event=CommandIssued(name="reset"))
    hello = message("hello", id="m2")
    result = await runtime(tmp_path, model=model).run_turn(turn(reset, hello), MemorySink(), store)
    assert result.text == "hello again" and store.resets == 1
    assert [(m.role, m.content) for m in model.requests[0].messages] == [("user", "hello")]


async def test_start_and_help_are_greeted_without_the_model(tmp_path: Path) -> None:
    model = ReplayModel([], strict=False)
    for name in ("start", "help"):
        result = await runtime(tmp_path, model=model).run_turn(
            turn(message("", event=CommandIssued(name=name))), MemorySink(), MemoryStore()
        )
        assert result.steps == 0 and result.text.startswith("Hi, I'm a.") and "/reset" in result.text
    assert model.requests == []


async def test_ask_is_a_message_with_its_arguments(tmp_path: Path) -> None:
    model = ReplayModel([answer_step("Paris")], strict=False)
    ask = message("capital of France?", event=CommandIssued(name="ask"))
    await runtime(tmp_path, model=model).run_turn(turn(ask), MemorySink(), MemoryStore())
    assert last_user(model) == "capital of France?"


async def test_an_unknown_command_reaches_the_model_as_typed(tmp_path: Path) -> None:
    model = ReplayModel([answer_step("ok")], strict=False)
    cmd = message("fr en", event=CommandIssued(name="translate"))
    await runtime(tmp_path, model=model).run_turn(turn(cmd), MemorySink(), MemoryStore())
    assert last_user(model) == "/translate fr en"


async def test_a_shared_place_and_contact_reach_the_model_as_lines_after_the_text(tmp_path: Path) -> None:
    model = ReplayModel([answer_step("near you")], strict=False)
    place = Location(latitude=52.520008, longitude=13.4, name="Alexanderplatz", address="10178 Berlin")
    card = Contact(name="Grace Hopper", phones=("+4915112345678",), emails=("grace@example.com",))
    shared = message("meet here?", event=Posted(shared=(place, card)))
    await runtime(tmp_path, model=model).run_turn(turn(shared), MemorySink(), MemoryStore())
    assert last_user(model) == (
        "meet here?\n[location: 52.520008, 13.4 — Alexanderplatz, 10178 Berlin]\n"
        "[contact: Grace Hopper, +4915112345678, grace@example.com]"
    )
    assert history_text(shared) == last_user(model)  # a later turn reads what this one read


async def test_a_bare_pin_without_text_is_answered(tmp_path: Path) -> None:
    model = ReplayModel([answer_step("got it")], strict=False)
    pin = message("", event=Posted(shared=(Location(latitude=-23.5505, longitude=-46.6333),)))
    result = await runtime(tmp_path, model=model).run_turn(turn(pin), MemorySink(), MemoryStore())
    assert last_user(model) == "[location: -23.5505, -46.6333]" and result.text == "got it"
