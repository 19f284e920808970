"""The deterministic offline model and the provider factory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.agent.prompt import RUN_PROGRAM, build_prompt, final_request
from switchboard.core.agent.slots import Slots
from switchboard.core.model import (
    ChatMessage,
    Finished,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCallEvent,
    ToolSpec,
    Usage,
)
from switchboard.core.providers import ModelFactory, ProviderConfig, model_name, parse_model_spec
from switchboard.core.providers import offline as offline_module
from switchboard.core.providers.offline import OfflineModel
from switchboard.core.tools.builtin import default_registry
from switchboard.errors import ConfigError
from tests.core.turns import MemorySink, MemoryStore, agent, message, request, runtime

CLOCK = ToolSpec(name="current_time", description="clock", parameters={"type": "object", "properties": {}})
PROGRAM = ToolSpec(name=RUN_PROGRAM, description="program", parameters={"type": "object", "properties": {}})


async def _events(model: OfflineModel, req: ModelRequest) -> list[ModelEvent]:
    return [event async for event in model.stream(req)]


def _req(text: str, *, tools: list[ToolSpec] | None = None, messages: list[ChatMessage] | None = None) -> ModelRequest:
    return ModelRequest(
        model="offline",
        system="Be brief.",
        messages=messages or [ChatMessage(role="user", content=text)],
        tools=tools or [],
    )


async def test_reply_contains_the_text_verbatim_in_several_deltas() -> None:
    text = 'Ünïcode, "quotes" and  double  spaces — stay exactly as sent'
    events = await _events(OfflineModel(), _req(text))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) > 1
    assert text in "".join(deltas)
    assert isinstance(events[-1], Finished)


async def test_reply_is_deterministic_and_reports_usage_in_words() -> None:
    first = await _events(OfflineModel(), _req("one two three"))
    second = await _events(OfflineModel(), _req("one two three"))
    assert first == second
    usage = next(e for e in first if isinstance(e, Usage))
    answer = "".join(e.text for e in first if isinstance(e, TextDelta))
    assert usage.input_tokens == 2 + 3  # "Be brief." + the message
    assert usage.output_tokens == len(answer.split())


@pytest.mark.parametrize("text", ["what time is it?", "WHAT TIME IS IT", "tell me the current time", "so, time is it?"])
async def test_time_questions_call_current_time(text: str) -> None:
    events = await _events(OfflineModel(), _req(text, tools=[CLOCK]))
    calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
    assert [c.name for c in calls] == ["current_time"]
    assert not [e for e in events if isinstance(e, TextDelta)]
    assert events[-1] == Finished(stop_reason="tool_calls")


async def test_time_question_names_the_zone() -> None:
    events = await _events(OfflineModel(), _req("what time is it in Asia/Tokyo", tools=[CLOCK]))
    call = next(e.call for e in events if isinstance(e, ToolCallEvent))
    assert call.arguments == {"timezone": "Asia/Tokyo"}


async def test_time_question_without_the_tool_is_answered_in_words() -> None:
    events = await _events(OfflineModel(), _req("what time is it?"))
    assert not [e for e in events if isinstance(e, ToolCallEvent)]
    assert "what time is it?" in "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_answers_from_a_current_time_result() -> None:
    call_events = await _events(OfflineModel(), _req("what time is it?", tools=[CLOCK]))
    call = next(e.call for e in call_events if isinstance(e, ToolCallEvent))
    result = '{"time": "10:11:12", "date": "2026-01-02", "weekday": "Friday", "timezone": "UTC"}'
    messages = [
        ChatMessage(role="user", content="what time is it?"),
        ChatMessage(role="assistant", tool_calls=[call]),
        ChatMessage(role="tool", content=result, tool_call_id=call.id, name="current_time"),
    ]
    events = await _events(OfflineModel(), _req("", tools=[CLOCK], messages=messages))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "It is 10:11:12 on Friday 2026-01-02 (UTC)."


async def test_run_command_becomes_a_program_only_when_offered() -> None:
    events = await _events(OfflineModel(), _req("/run print(1 + 1)", tools=[CLOCK, PROGRAM]))
    call = next(e.call for e in events if isinstance(e, ToolCallEvent))
    assert (call.name, call.arguments) == (RUN_PROGRAM, {"code": "print(1 + 1)"})
    plain = await _events(OfflineModel(), _req("/run print(1 + 1)", tools=[CLOCK]))
    assert not [e for e in plain if isinstance(e, ToolCallEvent)]


async def test_tool_command_calls_any_tool_with_json_arguments() -> None:
    events = await _events(OfflineModel(), _req('/tool update_plan {"goal": "ship it"}', tools=[CLOCK]))
    call = next(e.call for e in events if isinstance(e, ToolCallEvent))
    assert (call.name, call.arguments) == ("update_plan", {"goal": "ship it"})


async def test_final_no_tools_request_says_what_ran_out_and_what_was_done() -> None:
    ag = agent()
    prompt = build_prompt(ag, Slots(), [], [message("check the clock twice")], [], [], show_slots=False)
    call_events = await _events(OfflineModel(), _req("what time is it", tools=[CLOCK]))
    call = next(e.call for e in call_events if isinstance(e, ToolCallEvent))
    turn = [
        *prompt.messages,
        ChatMessage(role="assistant", tool_calls=[call]),
        ChatMessage(role="tool", content="{}", tool_call_id=call.id, name="current_time"),
    ]
    final = final_request(
        prompt,
        "offline",
        turn,
        len(prompt.messages),
        reason="steps",
        summary={"steps": 8},
        max_output_tokens=100,
        budget_tokens=4000,
    )
    assert final.tools == []
    text = "".join(e.text for e in await _events(OfflineModel(), final) if isinstance(e, TextDelta))
    assert '"check the clock twice"' in text
    assert "steps budget ran out" in text
    assert "1 tool call(s) (current_time)" in text


async def test_delay_is_spent_once_per_answer_and_paces_the_deltas(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(offline_module.asyncio, "sleep", fake_sleep)
    events = await _events(OfflineModel(delay_ms=250), _req("a fairly long message with many words to stream"))
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert slept[0] == 0.125  # half before the first token
    assert len(slept) == len(deltas)  # then one pause between consecutive deltas
    assert sum(slept) == pytest.approx(0.25)


async def test_what_time_is_it_end_to_end_through_the_runtime(tmp_path: Path) -> None:
    sink, store = MemorySink(), MemoryStore()
    result = await runtime(tmp_path).run_turn(request("What time is it?"), sink, store)
    tools = sink.of("tool_called")
    assert [(t.tool, t.ok) for t in tools] == [("current_time", True)]
    assert [s.decision for s in sink.of("step")] == ["tool_calls", "answer"]
    assert result.text.startswith("It is ") and "(UTC)" in result.text
    assert result.text == "".join(sink.deltas)
    assert result.stopped_by is None


# ---------------------------------------------------------------- the factory


def test_factory_caches_one_adapter_per_provider() -> None:
    factory = ModelFactory(ProviderConfig(offline_delay_ms=7))
    first = factory.get("offline")
    assert factory.get("offline") is first
    assert factory.get("offline:fast") is first
    assert isinstance(first, OfflineModel) and first.delay_ms == 7


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [("gemini:pro", "unknown model provider 'gemini'"), ("openai", "names no model"), ("anthropic:", "names no model")],
)
def test_factory_rejects_bad_specs_with_a_fix(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        ModelFactory(ProviderConfig()).get(spec)
    assert fragment in str(info.value)
    assert info.value.field == "model"


def test_model_spec_parsing() -> None:
    assert parse_model_spec("openai:gpt-4.1-mini") == ("openai", "gpt-4.1-mini")
    assert parse_model_spec("anthropic:claude:odd") == ("anthropic", "claude:odd")
    assert model_name("offline") == "offline"


def test_provider_config_repr_hides_keys() -> None:
    text = repr(ProviderConfig(openai_api_key="sk-secret-1", anthropic_api_key="sk-ant-secret-2"))
    assert "secret" not in text and "***" in text


def test_offline_needs_no_provider_sdk() -> None:
    code = (
        "import sys\n"
        "from switchboard.core.providers import ModelFactory, ProviderConfig\n"
        "from switchboard.core.agent.runtime import Runtime\n"
        "ModelFactory(ProviderConfig()).get('offline')\n"
        "print(sorted(m for m in ('openai', 'anthropic') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_factory_closes_adapters() -> None:
    closed: list[str] = []

    class Closing(OfflineModel):
        async def aclose(self) -> None:
            closed.append("x")

    factory = ModelFactory(ProviderConfig())
    factory.override("offline", Closing())
    factory.get("offline")
    await factory.aclose()
    assert closed == ["x"]


def test_default_registry_has_clock_and_slot_tools() -> None:
    names: Any = default_registry().names()
    assert {"current_time", "update_plan", "update_context", "update_state"} <= set(names)
