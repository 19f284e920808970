"""The agent loop: steps, events, budgets, the final no-tools answer, guards, retries, cancellation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.agent.config import Agent, AgentLimits
from switchboard.core.agent.prompt import WORK_LOG_MARKER, request_tokens
from switchboard.core.agent.replay import RecordedStep, ReplayModel
from switchboard.core.model import ModelRequest, TextDelta
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.turn import HistoryEntry
from switchboard.errors import ModelError
from tests.core.turns import (
    RECORDINGS,
    Empty,
    MemorySink,
    MemoryStore,
    Payload,
    agent,
    answer_step,
    big_tool,
    calls_step,
    flaky_tool,
    make_tool,
    registry_with,
    request,
    runtime,
)


def error_step(code: str, *, retryable: bool, retry_after: float | None = None) -> RecordedStep:
    return RecordedStep(step=0, error={"message": f"provider said {code}", "retryable": retryable, "code": code,
                                       "retry_after": retry_after})  # fmt: skip


# ---------------------------------------------------------------- plain turns


async def test_a_plain_turn_streams_records_and_does_not_touch_history(tmp_path: Path) -> None:
    sink, store = MemorySink(), MemoryStore()
    result = await runtime(tmp_path).run_turn(request("hello there"), sink, store)
    assert '"hello there"' in result.text and result.text == "".join(sink.deltas) and len(sink.deltas) > 1
    assert sink.kinds() == ["step", "usage_metered"]
    step = sink.of("step")[0]
    assert (step.step, step.decision, step.message_id) == (1, "answer", "m1")
    assert (result.steps, result.stopped_by) == (1, None)
    assert result.input_tokens > 0 and result.output_tokens == len(result.text.split())
    assert store.appended == [] and store.saved == []


async def test_collected_messages_are_answered_together(tmp_path: Path) -> None:
    from tests.core.turns import message

    req = request("unused").model_copy(update={"messages": [message("first one", id="m1"), message("second", id="m2")]})
    sink = MemorySink()
    result = await runtime(tmp_path).run_turn(req, sink, MemoryStore())
    assert "first one" in result.text and "second" in result.text
    assert sink.of("step")[0].message_id == "m2"


async def test_history_window_is_sent_and_ends_with_the_new_message(tmp_path: Path) -> None:
    history = [HistoryEntry(role="user", text="my name is Ada"), HistoryEntry(role="assistant", text="Hi Ada")]
    model = ReplayModel([answer_step("ok")], strict=False)
    await runtime(tmp_path, model=model).run_turn(request("who am I?"), MemorySink(), MemoryStore(history))
    sent = model.requests[0].messages
    assert [(m.role, m.content) for m in sent] == [
        ("user", "my name is Ada"),
        ("assistant", "Hi Ada"),
        ("user", "who am I?"),
    ]


async def test_a_200_turn_conversation_never_exceeds_the_context_budget(tmp_path: Path) -> None:
    history = []
    for i in range(200):
        history.append(HistoryEntry(role="user", text=f"question {i}: " + "words " * 60))
        history.append(HistoryEntry(role="assistant", text=f"answer {i}: " + "more words " * 80))
    model = ReplayModel([calls_step(("current_time", {}), step=1), answer_step("fine", step=2)], strict=False)
    ag = agent(max_input_tokens=3000)
    await runtime(tmp_path, model=model).run_turn(
        request("latest question", agent_=ag), MemorySink(), MemoryStore(history)
    )
    assert len(model.requests) == 2
    for sent in model.requests:
        assert request_tokens(sent.system, sent.messages, sent.tools) <= 3000
    first = model.requests[0].messages
    assert first[-1].content.endswith("latest question") and first[0].role == "user"
    assert "answer 199" in first[-3].content  # the newest history is kept
    assert "compacted record" in first[-2].content  # older turns are folded, not just dropped ...
    assert first[-2].trust == "data" and "compacted record" not in model.requests[0].system  # ... as data


@pytest.mark.parametrize("filler", ["x", "語"])
async def test_an_oversized_message_is_capped_to_the_budget(tmp_path: Path, filler: str) -> None:
    model = ReplayModel([answer_step("ok")], strict=False)
    ag = agent(max_input_tokens=1000)
    huge = "start " + filler * 20_000 + " end"
    await runtime(tmp_path, model=model).run_turn(request(huge, agent_=ag), MemorySink(), MemoryStore())
    sent = model.requests[0]
    assert request_tokens(sent.system, sent.messages, sent.tools) <= 1000
    content = sent.messages[-1].content
    assert content.startswith("start ") and content.endswith(" end") and "chars omitted" in content


# ---------------------------------------------------------------- budgets


async def test_step_budget_ends_with_one_call_without_tools(tmp_path: Path) -> None:
    model = ReplayModel(RECORDINGS / "runaway.jsonl")
    sink = MemorySink()
    result = await runtime(tmp_path, model=model).run_turn(
        request("keep checking the clock", agent_=agent(max_steps=4)), sink, MemoryStore()
    )
    assert model.exhausted  # exactly the recorded steps: four tool steps, then the final answer
    assert result.stopped_by == "steps" and result.text == "I ran out of steps."
    final = model.requests[-1]
    assert final.tools == [] and "The step budget of this turn ran out" in final.system
    assert all(m.role in {"user", "assistant"} for m in final.messages)
    assert final.messages[-1].content.count("- called current_time") == 4
    assert [s.detail.get("final") for s in sink.of("step")] == [None] * 4 + ["steps"]
    assert result.steps == 5


async def test_a_run_asking_for_500_tool_calls_stops_at_its_budget_with_an_answer(tmp_path: Path) -> None:
    runs: list[int] = []

    async def count(args: Empty, ctx: ToolContext) -> Any:
        runs.append(1)
        return len(runs)

    registry = registry_with(make_tool("count", count))
    batch = calls_step(*[("count", {})] * 500, step=1)
    model = ReplayModel([batch, answer_step("Stopped after 20 calls.", step=2)])
    sink = MemorySink()
    result = await runtime(tmp_path, model=model, registry=registry).run_turn(
        request("call count 500 times", agent_=agent(tools=["count"], max_tool_calls=20)), sink, MemoryStore()
    )
    assert len(runs) == 20 and result.stopped_by == "tool_calls"
    assert result.text == "Stopped after 20 calls." and result.text == "".join(sink.deltas)
    assert len(sink.of("tool_called")) == 20
    assert model.requests[-1].tools == [] and "tool-call budget" in model.requests[-1].system


async def test_a_model_that_never_stops_calling_tools_is_stopped_by_steps(tmp_path: Path) -> None:
    class Forever:
        provider = "offline"

        def __init__(self) -> None:
            self.calls = 0

        async def stream(self, req: ModelRequest) -> Any:
            self.calls += 1
            if not req.tools:
                yield TextDelta(text="I kept calling the clock; here is where I stopped.")
                return
            for event in calls_step(("current_time", {}), step=self.calls).events:
                yield event

        async def aclose(self) -> None:
            pass

    model = Forever()
    result = await runtime(tmp_path, model=model).run_turn(
        request("loop", agent_=agent(max_steps=6)), MemorySink(), MemoryStore()
    )
    assert model.calls == 7 and result.stopped_by == "steps" and result.text.startswith("I kept calling")


async def test_the_offline_model_answers_sensibly_at_a_budget(tmp_path: Path) -> None:
    sink = MemorySink()
    result = await runtime(tmp_path).run_turn(
        request("what time is it", agent_=agent(max_steps=1)), sink, MemoryStore()
    )
    assert result.stopped_by == "steps"
    assert '"what time is it"' in result.text and "steps budget ran out" in result.text
    assert "1 tool call(s) (current_time)" in result.text


async def test_token_budget_stops_the_turn(tmp_path: Path) -> None:
    model = ReplayModel([calls_step(("current_time", {}), step=i) for i in range(1, 3)] + [answer_step("tokens!")])
    req = request("go", agent_=agent(max_turn_tokens=256), token_budget=30)
    result = await runtime(tmp_path, model=model).run_turn(req, MemorySink(), MemoryStore())
    assert result.stopped_by == "tokens" and result.text == "tokens!"
    assert len(model.requests) == 3  # 15 tokens a step: two steps reach 30, then the final call


async def test_output_budget_caps_the_reply_and_the_stream(tmp_path: Path) -> None:
    sink = MemorySink()
    result = await runtime(tmp_path).run_turn(
        request("a b c d e f g h", agent_=agent(max_output_chars=25)), sink, MemoryStore()
    )
    kept, notice = result.text.split("\n\n[", 1)
    assert len(kept) == 25 and notice == "reply cut at 25 characters: the agent's output limit]"
    assert "".join(sink.deltas) == result.text


# ---------------------------------------------------------------- deadline and cancellation


async def test_deadline_stops_a_slow_model_and_still_answers(tmp_path: Path) -> None:
    sink = MemorySink()
    rt = runtime(tmp_path, delay_ms=60_000)
    result = await rt.run_turn(request("are you there?", deadline_s=0.3), sink, MemoryStore())
    assert result.stopped_by == "deadline" and result.steps == 0
    assert "time budget" in result.text and result.text == "".join(sink.deltas)
    assert sink.kinds() == ["usage_metered"]


async def test_deadline_cancels_a_slow_tool(tmp_path: Path) -> None:
    seen: list[str] = []

    async def slow(args: Empty, ctx: ToolContext) -> Any:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    registry = registry_with(make_tool("slow", slow, timeout_s=120))
    model = ReplayModel([calls_step(("slow", {}), step=1), answer_step("Too slow, sorry.")])
    result = await runtime(tmp_path, model=model, registry=registry).run_turn(
        request("run slow", agent_=agent(tools=["slow"]), deadline_s=2.0), MemorySink(), MemoryStore()
    )
    assert seen == ["cancelled"] and result.stopped_by == "deadline" and result.text == "Too slow, sorry."


async def test_cancellation_propagates_into_the_model_stream(tmp_path: Path) -> None:
    closed: list[str] = []
    started = asyncio.Event()

    class Hanging:
        provider = "offline"

        async def stream(self, req: ModelRequest) -> Any:
            try:
                yield TextDelta(text="thinking")
                started.set()
                await asyncio.sleep(60)
            finally:
                closed.append("closed")

        async def aclose(self) -> None:
            pass

    sink = MemorySink()
    task = asyncio.create_task(runtime(tmp_path, model=Hanging()).run_turn(request("hi"), sink, MemoryStore()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed == ["closed"] and sink.deltas == ["thinking"]
    assert "usage_metered" not in sink.kinds()


# ---------------------------------------------------------------- tools in the loop


async def test_validation_errors_go_back_to_the_model(tmp_path: Path) -> None:
    model = ReplayModel(
        [
            calls_step(("current_time", {"timezone": "Mars/Olympus"}), step=1),
            calls_step(("current_time", {"timezone": "Europe/Paris"}), step=2),
            answer_step("Paris time found.", step=3),
        ]
    )
    sink = MemorySink()
    result = await runtime(tmp_path, model=model).run_turn(request("time on Mars?"), sink, MemoryStore())
    error = json.loads(model.requests[1].messages[-1].content)
    assert error["error_class"] == "validation" and "timezone" in error["error"]
    assert "fix the arguments" in error["hint"]
    assert [(t.ok, t.error_class) for t in sink.of("tool_called")] == [(False, "validation"), (True, None)]
    assert json.loads(model.requests[2].messages[-1].content)["timezone"] == "Europe/Paris"
    assert result.text == "Paris time found."


async def test_the_same_failing_call_is_refused_after_two_failures(tmp_path: Path) -> None:
    runs: list[int] = []
    model = ReplayModel(RECORDINGS / "flaky.jsonl")
    sink = MemorySink()
    result = await runtime(tmp_path, model=model, registry=registry_with(flaky_tool(runs))).run_turn(
        request("use the flaky tool", agent_=agent(tools=["flaky"])), sink, MemoryStore()
    )
    assert runs == [1, 1]  # two real failures; the third and fourth identical calls never ran
    refusal = json.loads(model.requests[3].messages[-1].content)
    assert refusal["error_class"] == "repeated" and "failed 2 times" in refusal["error"]
    assert result.stopped_by == "repeat_guard" and result.text == "The flaky tool keeps failing."
    assert model.exhausted


async def test_a_changed_call_is_not_refused(tmp_path: Path) -> None:
    runs: list[int] = []
    steps = [calls_step(("flaky", {"n": i % 3}), step=i) for i in range(1, 4)] + [answer_step("gave up")]
    model = ReplayModel(steps)
    result = await runtime(tmp_path, model=model, registry=registry_with(flaky_tool(runs))).run_turn(
        request("x", agent_=agent(tools=["flaky"])), MemorySink(), MemoryStore()
    )
    assert runs == [1, 2, 0] and result.stopped_by is None


async def test_tool_events_carry_idempotency_keys_stable_across_reruns(tmp_path: Path) -> None:
    keys: list[str] = []

    async def send(args: Payload, ctx: ToolContext) -> Any:
        keys.append(ctx.idempotency_key)
        return "sent"

    registry = registry_with(make_tool("send", send, input=Payload, side_effect="write", cost=5))
    script = [calls_step(("send", {"n": 1}), ("send", {"n": 2}), step=1), answer_step("sent twice")]
    sinks = []
    for _ in range(2):
        sink = MemorySink()
        await runtime(tmp_path, model=ReplayModel(script), registry=registry).run_turn(
            request("send", agent_=agent(tools=["send"])), sink, MemoryStore()
        )
        sinks.append(sink)
    assert keys[0] != keys[1] and keys[:2] == keys[2:]
    events = sinks[0].of("tool_called")
    assert [e.idempotency_key for e in events] == keys[:2] and {e.side_effect for e in events} == {"write"}
    assert all(e.action_sha256 and e.call_id for e in events)


async def test_channel_actions_reach_tools_through_the_sink(tmp_path: Path) -> None:
    seen: list[Any] = []

    async def act(args: Empty, ctx: ToolContext) -> Any:
        seen.append(ctx.act)
        return "ok"

    class ActingSink(MemorySink):
        async def act(self, action: Any) -> None:
            pass

    sink = ActingSink()
    model = ReplayModel([calls_step(("poke", {}), step=1), answer_step("poked")])
    await runtime(tmp_path, model=model, registry=registry_with(make_tool("poke", act))).run_turn(
        request("poke", agent_=agent(tools=["poke"])), sink, MemoryStore()
    )
    assert seen == [sink.act]


async def test_large_results_feed_the_next_program(tmp_path: Path) -> None:
    model = ReplayModel(RECORDINGS / "big_then_program.jsonl")
    sink = MemorySink()
    result = await runtime(tmp_path, model=model, registry=registry_with(big_tool())).run_turn(
        request("how many items are there?", agent_=agent(tools=["big", "current_time"], codeact=True)),
        sink,
        MemoryStore(),
    )
    card = json.loads(model.requests[1].messages[-1].content)
    assert card["variable"] == "result_1" and card["card"]["length"] == 200
    program = json.loads(model.requests[2].messages[-1].content)
    assert program["output"].strip() == "200" and program["value"] == "item 199"
    assert [s.decision for s in sink.of("step")] == ["tool_calls", "program", "answer"]
    assert [t.tool for t in sink.of("tool_called")] == ["big", "run_program"]
    assert sink.of("tool_called")[0].variable == "result_1"
    assert result.text == "There are 200 items."


async def test_programs_call_tools_through_the_gateway(tmp_path: Path) -> None:
    sink = MemorySink()
    code = "t = current_time(timezone='Asia/Tokyo')\nprint(t['timezone'])"
    result = await runtime(tmp_path).run_turn(request("/run " + code, agent_=agent(codeact=True)), sink, MemoryStore())
    assert [t.tool for t in sink.of("tool_called")] == ["current_time", "run_program"]
    assert "The program printed: Asia/Tokyo" in result.text


async def test_program_tool_calls_count_against_the_budget(tmp_path: Path) -> None:
    code = "for i in range(50):\n    current_time()\n"
    model = ReplayModel([calls_step(("run_program", {"code": code}), step=1), answer_step("budget hit")])
    sink = MemorySink()
    result = await runtime(tmp_path, model=model).run_turn(
        request("x", agent_=agent(codeact=True, max_tool_calls=5)), sink, MemoryStore()
    )
    assert result.stopped_by == "tool_calls" and result.text == "budget hit"
    assert [t.tool for t in sink.of("tool_called")].count("current_time") <= 5


# ---------------------------------------------------------------- provider errors


async def test_retryable_provider_errors_are_retried(tmp_path: Path) -> None:
    model = ReplayModel([error_step("rate_limit", retryable=True, retry_after=0.0), answer_step("after retry")])
    result = await runtime(tmp_path, model=model).run_turn(request("x"), MemorySink(), MemoryStore())
    assert result.text == "after retry" and result.steps == 1 and len(model.requests) == 2


async def test_auth_errors_stop_the_run_without_retrying(tmp_path: Path) -> None:
    model = ReplayModel([error_step("auth", retryable=False), answer_step("never")])
    with pytest.raises(ModelError) as info:
        await runtime(tmp_path, model=model).run_turn(request("x"), MemorySink(), MemoryStore())
    assert info.value.code == "auth" and len(model.requests) == 1


async def test_retries_give_up_after_the_attempt_limit(tmp_path: Path) -> None:
    model = ReplayModel([error_step("overloaded", retryable=True)] * 5)
    with pytest.raises(ModelError):
        await runtime(tmp_path, model=model, model_attempts=3).run_turn(request("x"), MemorySink(), MemoryStore())
    assert len(model.requests) == 3


async def test_context_too_long_compacts_and_retries_once(tmp_path: Path) -> None:
    history = [HistoryEntry(role="user" if i % 2 == 0 else "assistant", text=f"entry {i} " * 30) for i in range(60)]
    model = ReplayModel([error_step("context_length", retryable=False), answer_step("fits now")])
    result = await runtime(tmp_path, model=model).run_turn(request("x"), MemorySink(), MemoryStore(history))
    assert result.text == "fits now"
    first, second = model.requests
    assert request_tokens(second.system, second.messages, []) < request_tokens(first.system, first.messages, [])

    twice = ReplayModel([error_step("context_length", retryable=False)] * 2)
    with pytest.raises(ModelError):
        await runtime(tmp_path, model=twice).run_turn(request("x"), MemorySink(), MemoryStore(history))
    assert len(twice.requests) == 2


async def test_a_failing_final_call_still_answers(tmp_path: Path) -> None:
    model = ReplayModel([calls_step(("current_time", {}), step=1), error_step("server_error", retryable=False)])
    result = await runtime(tmp_path, model=model).run_turn(
        request("x", agent_=agent(max_steps=1)), MemorySink(), MemoryStore()
    )
    assert result.stopped_by == "steps" and "step budget" in result.text and "current_time" in result.text


async def test_the_final_request_keeps_the_users_words(tmp_path: Path) -> None:
    model = ReplayModel(RECORDINGS / "runaway.jsonl")
    await runtime(tmp_path, model=model).run_turn(
        request("keep checking the clock", agent_=agent(max_steps=4)), MemorySink(), MemoryStore()
    )
    *_, user, work = model.requests[-1].messages
    assert user.content == "keep checking the clock" and user.trust_class == "user"
    assert work.trust == "data" and work.content.startswith(
        '<data source="work-log" trust="untrusted">\n' + WORK_LOG_MARKER
    )


def test_runtime_uses_the_registry_for_agent_tools(tmp_path: Path) -> None:
    registry = default_registry()
    ag = Agent(name="a", tools=["current_time", "nope"], limits=AgentLimits())
    assert [t.name for t in registry.for_agent(ag)] == ["current_time"]
    assert registry.problems(ag) and "nope" in registry.problems(ag)[0]
