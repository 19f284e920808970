"""Recording a run's model decisions and replaying them deterministically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from switchboard.core.agent.replay import (
    RecordedStep,
    RecordingModel,
    ReplayModel,
    dump_events,
    load_recording,
    request_fingerprint,
    save_recording,
)
from switchboard.core.model import Finished, ModelRequest, TextDelta, ToolSpec
from switchboard.core.providers.offline import OfflineModel
from switchboard.errors import ModelError, ReplayDivergedError
from tests.core.turns import RECORDINGS, MemorySink, MemoryStore, answer_step, request, runtime


async def test_replay_reproduces_a_recorded_run(tmp_path: Path) -> None:
    recorder = RecordingModel(OfflineModel(), path=tmp_path / "run.jsonl")
    live_sink = MemorySink()
    live = await runtime(tmp_path, model=recorder).run_turn(request("What time is it?"), live_sink, MemoryStore())
    assert len(recorder.steps) == 2 and load_recording(tmp_path / "run.jsonl") == recorder.steps

    replay = ReplayModel(tmp_path / "run.jsonl")
    sink = MemorySink()
    again = await runtime(tmp_path, model=replay).run_turn(request("What time is it?"), sink, MemoryStore())
    assert again.model_dump(exclude={"history"}) == live.model_dump(exclude={"history"})
    assert [(e.role, e.meta.get("tool")) for e in again.history] == [(e.role, e.meta.get("tool")) for e in live.history]
    assert sink.deltas == live_sink.deltas and replay.exhausted
    assert [(e.kind, getattr(e, "decision", None)) for e in sink.events] == [
        (e.kind, getattr(e, "decision", None)) for e in live_sink.events
    ]


async def test_checked_in_recording_replays_to_the_recorded_answer(tmp_path: Path) -> None:
    steps = load_recording(RECORDINGS / "what_time.jsonl")
    recorded = "".join(e.text for e in steps[-1].events if isinstance(e, TextDelta))
    sink = MemorySink()
    result = await runtime(tmp_path, model=ReplayModel(steps)).run_turn(
        request("What time is it?"), sink, MemoryStore()
    )
    assert result.text == recorded and recorded.startswith("It is ")
    assert [t.tool for t in sink.of("tool_called")] == ["current_time"]


async def test_the_offline_recording_is_reproduced_exactly(tmp_path: Path) -> None:
    recorder = RecordingModel(OfflineModel())
    await runtime(tmp_path, model=recorder).run_turn(request("hello recorded world"), MemorySink(), MemoryStore())
    assert recorder.steps == load_recording(RECORDINGS / "echo.jsonl")


async def test_replay_raises_when_the_run_asks_for_more_steps(tmp_path: Path) -> None:
    replay = ReplayModel(load_recording(RECORDINGS / "what_time.jsonl")[:1])
    with pytest.raises(ReplayDivergedError, match="step 2 but the recording holds 1"):
        await runtime(tmp_path, model=replay).run_turn(request("What time is it?"), MemorySink(), MemoryStore())


async def test_strict_replay_raises_when_the_request_differs(tmp_path: Path) -> None:
    replay = ReplayModel(RECORDINGS / "what_time.jsonl")
    agent_without_tools = request("What time is it?").agent.model_copy(update={"tools": []})
    with pytest.raises(ReplayDivergedError, match="tools: recorded"):
        await runtime(tmp_path, model=replay).run_turn(
            request("What time is it?", agent_=agent_without_tools), MemorySink(), MemoryStore()
        )
    lenient = ReplayModel(RECORDINGS / "echo.jsonl", strict=False)
    await runtime(tmp_path, model=lenient).run_turn(
        request("anything", agent_=agent_without_tools), MemorySink(), MemoryStore()
    )
    assert lenient.exhausted


async def test_provider_errors_are_recorded_and_replayed(tmp_path: Path) -> None:
    class Failing:
        provider = "x"

        async def stream(self, req: ModelRequest):  # type: ignore[no-untyped-def]
            yield TextDelta(text="partial")
            raise ModelError("overloaded", retryable=True, retry_after=1.5, code="overloaded")

        async def aclose(self) -> None:
            pass

    recorder = RecordingModel(Failing())
    req = ModelRequest(model="m", system="s", messages=[])
    with pytest.raises(ModelError):
        [e async for e in recorder.stream(req)]
    step = recorder.steps[0]
    assert step.error == {"message": "overloaded", "retryable": True, "retry_after": 1.5, "code": "overloaded"}
    save_recording(recorder.steps, tmp_path / "err.jsonl")
    seen = []
    with pytest.raises(ModelError) as info:
        async for event in ReplayModel(tmp_path / "err.jsonl").stream(req):
            seen.append(event)
    assert seen == [TextDelta(text="partial")] and info.value.retry_after == 1.5 and info.value.code == "overloaded"


def test_recordings_round_trip_and_skip_comments(tmp_path: Path) -> None:
    steps = [answer_step("one two", step=1), RecordedStep(step=2, events=[Finished()])]
    path = tmp_path / "r.jsonl"
    save_recording(steps, path)
    path.write_text("# a comment\n\n" + path.read_text())
    assert load_recording(path) == steps
    assert dump_events(steps[0].events)[0] == {"kind": "text_delta", "text": "one"}


def test_fingerprint_is_the_shape_not_the_words() -> None:
    spec = ToolSpec(name="b", description="", parameters={})
    a = ModelRequest(model="m", system="x", messages=[], tools=[spec, spec.model_copy(update={"name": "a"})])
    assert request_fingerprint(a) == {"last_role": None, "last_tool": None, "tools": ["a", "b"]}
    assert json.dumps(request_fingerprint(a))  # JSON-able
