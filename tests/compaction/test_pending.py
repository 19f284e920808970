"""Compaction and pending actions: an approval waiting, a write in doubt, a call without its result.

The histories are made by running real turns (a gated write asks for approval; a write times out ambiguously) on the
session store the worker uses (Redis, under a lease), then padded with chat until the context budget forces the older
turns out: the pending action must reach the model word for word (call id, approval id, arguments), or the turn must
stop for review without asking the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict

from switchboard.control.transcript import build_transcript
from switchboard.control.views import TimelineEntry
from switchboard.core.agent.compaction import compact
from switchboard.core.agent.config import Agent, AgentLimits, AgentProfile
from switchboard.core.agent.pending import lost_actions, pending_actions
from switchboard.core.agent.prompt import build_prompt
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.agent.slots import Slots
from switchboard.core.approvals.policy import PolicyConfig
from switchboard.core.model import ChatMessage, ModelRequest
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.turn import HistoryEntry, TurnResult
from switchboard.errors import ToolError
from switchboard.queue.lease import Lease
from switchboard.queue.ledger import Attempt, AttemptStore
from switchboard.queue.store import RedisSessionStore
from switchboard.settings import QueueSettings
from tests.core.turns import MemorySink, answer_step, calls_step, message, request, runtime

CONTRACT = {"path": "contract.md", "content": "Summary: 12 months, EUR 400/month, notice 90 days."}


@pytest.fixture
async def session(async_redis: aioredis.Redis) -> RedisSessionStore:
    """The session's store as a worker's drain gives it to a turn: bound to the lease it holds, keeping approvals."""
    lease = await Lease(async_redis, worker_id="w1", lease_ms=60_000).acquire(message("x").session_key)
    assert lease is not None
    attempt = Attempt(attempt=1, dead=False, last_error="", ids=[], bodies=[])  # nothing read ahead: Redis answers
    return AttemptStore(async_redis, lease, QueueSettings(name="sbtest"), attempt)


async def _history(session: RedisSessionStore) -> list[HistoryEntry]:
    return await session.load_history(1000)


class _Order(BaseModel):
    model_config = ConfigDict(extra="allow")


def _ambiguous_tool() -> Tool:
    async def place(args: _Order, ctx: ToolContext) -> Any:
        raise ToolError("the supplier did not answer in time", error_class="ambiguous_timeout")

    return Tool(name="place_order", description="Order stock.", input=_Order, fn=place, side_effect="write",
                retry_on=frozenset())  # fmt: skip


def _agent(max_input_tokens: int = 32_000, tools: tuple[str, ...] = ("write_file",)) -> Agent:
    return Agent(
        name="a",
        profile=AgentProfile(name="a"),
        instructions="Be brief.",
        tools=list(tools),
        policy=PolicyConfig.model_validate({"version": "t1", "rules": [{"tool": "write_file", "decide": "approve"}]}),
        limits=AgentLimits(max_input_tokens=max_input_tokens),
    )


async def _record(session: RedisSessionStore, text: str, result: TurnResult, n: int) -> None:
    """What the queue layer appends after a turn: the user's message, the turn's calls and results, the answer."""
    await session.append_history(
        [
            HistoryEntry(role="user", text=text, message_id=f"m{n}"),
            *result.history,
            HistoryEntry(role="assistant", text=result.text, message_id=f"m{n}"),
        ]
    )


async def _chat(session: RedisSessionStore, turns: int) -> None:
    for i in range(turns):
        await session.append_history(
            [
                HistoryEntry(role="user", text=f"question {i}: " + "tell me more about the weather " * 12),
                HistoryEntry(role="assistant", text=f"answer {i}: " + "it is mild and dry today " * 14),
            ]
        )


async def _waiting_approval(tmp_path: Path, session: RedisSessionStore, content: str = CONTRACT["content"]) -> str:
    """A session whose first turn asked a person to approve a write (the run waits), then 30 turns of chat."""
    model = ReplayModel([calls_step(("write_file", {**CONTRACT, "content": content}))], strict=False)
    text = "Save the contract summary"
    result = await runtime(tmp_path, model=model).run_turn(request(text, agent_=_agent()), MemorySink(), session)
    assert len(result.waiting_for) == 1
    await _record(session, text, result, 0)
    await _chat(session, 30)
    return result.waiting_for[0]


async def _write_in_doubt(tmp_path: Path, session: RedisSessionStore, note: str = "") -> None:
    """A session whose first turn's write timed out after it was sent (it may have happened), then 30 turns of chat."""
    registry = default_registry()
    registry.register(_ambiguous_tool())
    model = ReplayModel(
        [
            calls_step(("place_order", {"sku": "A-77", "qty": 40, **({"note": note} if note else {})})),
            answer_step("I could not confirm it.", step=2),
        ],
        strict=False,
    )
    text = "Order 40 of A-77"
    ag = _agent(tools=("place_order",))
    result = await runtime(tmp_path, model=model, registry=registry).run_turn(request(text, agent_=ag), MemorySink(),
                                                                            session)  # fmt: skip
    await _record(session, text, result, 0)
    await _chat(session, 30)


def _sent(requests: list[ModelRequest]) -> str:
    return "\n".join(m.content for m in requests[0].messages)


async def test_an_approval_waiting_reaches_the_model_word_for_word_after_compaction(
    tmp_path: Path, session: RedisSessionStore
) -> None:
    approval_id = await _waiting_approval(tmp_path, session)
    (found,) = pending_actions(await _history(session))
    assert (found.kind, found.approval_id, found.arguments) == ("approval_waiting", approval_id, CONTRACT)
    ag = _agent(max_input_tokens=1500)
    prompt = build_prompt(ag, Slots(), await _history(session), [message("and tomorrow?")], [], [], show_slots=False)
    sent = "\n".join(m.content for m in prompt.messages)
    assert prompt.compacted and "question 0:" not in sent  # the first turns were folded ...
    assert approval_id in sent and found.line in sent  # ... but the approval is there word for word
    assert lost_actions([found], prompt.messages) == []


async def test_a_new_message_settles_the_approval_and_nothing_is_held(
    tmp_path: Path, session: RedisSessionStore
) -> None:
    approval_id = await _waiting_approval(tmp_path, session)
    model = ReplayModel([answer_step("noted")], strict=False)
    sink = MemorySink()
    result = await runtime(tmp_path, model=model).run_turn(
        request("and what about tomorrow?", agent_=_agent(max_input_tokens=1500), run_id="run-2"), sink, session
    )
    assert result.stopped_by is None and result.text == "noted" and sink.of("compaction_held") == []
    sent = _sent(model.requests)
    assert "approval_superseded" in sent and approval_id in sent  # the model learns it did not happen


async def test_a_write_in_doubt_reaches_the_model_word_for_word_after_compaction(
    tmp_path: Path, session: RedisSessionStore
) -> None:
    await _write_in_doubt(tmp_path, session)
    (found,) = pending_actions(await _history(session))
    assert (found.kind, found.tool, found.arguments) == ("write_in_doubt", "place_order", {"sku": "A-77", "qty": 40})
    assert found.error_class == "ambiguous_timeout"
    model = ReplayModel([answer_step("noted")], strict=False)
    await runtime(tmp_path, model=model).run_turn(
        request("anything else?", agent_=_agent(max_input_tokens=1500), run_id="run-2"), MemorySink(), session
    )
    sent = _sent(model.requests)
    assert "question 0:" not in sent and found.line in sent and "ambiguous_timeout" in sent


async def test_a_pending_action_too_large_to_keep_stops_the_turn_for_review(
    tmp_path: Path, session: RedisSessionStore
) -> None:
    await _write_in_doubt(tmp_path, session, note="deliver to the loading dock " * 400)
    (found,) = pending_actions(await _history(session))
    model = ReplayModel([answer_step("I would have continued on a summary")], strict=False)
    sink = MemorySink()
    result = await runtime(tmp_path, model=model).run_turn(
        request("go on", agent_=_agent(max_input_tokens=1500), run_id="run-2"), sink, session
    )
    assert model.requests == []  # the model never saw a summary standing in for the order
    assert result.stopped_by == "compaction" and result.steps == 0
    (held,) = sink.of("compaction_held")
    assert held.actions == [found.fact()] and held.actions[0]["tool"] == "place_order"
    assert "place_order" in result.text and "review" in result.text
    assert sink.of("usage_metered")[0].stopped_by == "compaction"


async def test_a_decided_approval_is_no_longer_pending(tmp_path: Path, session: RedisSessionStore) -> None:
    approval_id = await _waiting_approval(tmp_path, session)
    call = {"id": f"approval_{approval_id}", "name": "write_file", "arguments": CONTRACT}
    await session.append_history(
        [
            HistoryEntry(role="assistant", text="", meta={"tool_calls": [call]}),
            HistoryEntry(role="tool", text='{"ok":true}', meta={"call_id": call["id"], "tool": "write_file"}),
        ]
    )
    assert pending_actions(await _history(session)) == []


def test_a_call_without_its_result_is_pending() -> None:
    messages = [
        ChatMessage(role="user", content="send it"),
        ChatMessage(
            role="assistant", content="", tool_calls=[{"id": "c9", "name": "send_mail", "arguments": {"to": "x"}}]
        ),
    ]
    (found,) = pending_actions(messages)
    assert (found.kind, found.call_id, found.tool) == ("unanswered_call", "c9", "send_mail")


@pytest.mark.parametrize("kind", ["write_in_doubt", "approval_waiting"])
async def test_the_compacted_record_says_a_write_is_in_doubt_and_an_approval_waits(
    tmp_path: Path, session: RedisSessionStore, kind: str
) -> None:
    if kind == "write_in_doubt":
        await _write_in_doubt(tmp_path, session)
    else:
        await _waiting_approval(tmp_path, session)
    record = compact(await _history(session), budget_chars=6000).record
    assert record is not None
    status = {"write_in_doubt": "in_doubt_ambiguous_timeout", "approval_waiting": "waiting_for_approval"}[kind]
    assert [effect["status"] for effect in record["tool_effects"]] == [status]  # never a plain "error"


async def test_an_approval_the_store_closed_is_not_held(tmp_path: Path, session: RedisSessionStore) -> None:
    approval_id = await _waiting_approval(tmp_path, session, content="clause " * 1500)
    decided = await session.approval_decide(approval_id, "deny", "console:ops", "console", action_prefix=None)
    assert decided.result == "applied"  # closed in the store, no outcome in the history yet
    model = ReplayModel([answer_step("fine")], strict=False)
    sink = MemorySink()
    result = await runtime(tmp_path, model=model).run_turn(
        request("go on", agent_=_agent(max_input_tokens=1500), run_id="run-2"), sink, session
    )
    assert result.stopped_by is None and result.text == "fine" and sink.of("compaction_held") == []


async def test_an_approval_still_waiting_too_large_to_keep_is_held(tmp_path: Path, session: RedisSessionStore) -> None:
    approval_id = await _waiting_approval(tmp_path, session, content="clause " * 1500)
    model = ReplayModel([answer_step("fine")], strict=False)
    sink = MemorySink()
    result = await runtime(tmp_path, model=model).run_turn(  # the asking run again: its own approval stands
        request("Save the contract summary", agent_=_agent(max_input_tokens=1500), run_id="run-1"), sink, session
    )
    assert model.requests == [] and result.stopped_by == "compaction"
    assert [a["approval_id"] for a in sink.of("compaction_held")[0].actions] == [approval_id]


async def test_the_console_transcript_shows_the_hold_as_a_notice(tmp_path: Path, session: RedisSessionStore) -> None:
    await _write_in_doubt(tmp_path, session, note="deliver to the loading dock " * 400)
    sink = MemorySink()
    await runtime(tmp_path).run_turn(request("go on", agent_=_agent(max_input_tokens=1500), run_id="run-2"), sink,
                                     session)  # fmt: skip
    (held,) = sink.of("compaction_held")
    data = held.model_dump(mode="json")
    entry = TimelineEntry(id="1-0", at=data.pop("at"), kind=data.pop("kind"), trace_id=None, data=data)
    (item,) = build_transcript([], [entry])
    assert (item.kind, item.action) == ("notice", "compaction_held")
    assert "place_order (write_in_doubt)" in item.text and "review" in item.text


def test_a_call_id_used_again_later_does_not_hide_a_write_in_doubt() -> None:
    def turn(name: str, args: dict[str, Any], result: str, **meta: Any) -> list[HistoryEntry]:
        call = {"id": "c1_0", "name": name, "arguments": args}  # servers may number every turn's calls from 0
        return [
            HistoryEntry(role="user", text="next"),
            HistoryEntry(role="assistant", text="", meta={"tool_calls": [call]}),
            HistoryEntry(role="tool", text=result, meta={"call_id": "c1_0", "tool": name, **meta}),
        ]

    history = [
        *turn("place_order", {"sku": "A-77"}, '{"error":"late","error_class":"ambiguous_timeout"}', ok=False,
              error_class="ambiguous_timeout", side_effect="write"),
        *turn("current_time", {}, '{"time":"12:00"}', ok=True, error_class=None, side_effect="read"),
    ]  # fmt: skip
    (found,) = pending_actions(history)
    assert (found.kind, found.tool, found.arguments) == ("write_in_doubt", "place_order", {"sku": "A-77"})
