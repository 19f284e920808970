"""Rebuild the recorded runs in this folder: ``.venv/bin/python -m tests.recordings.regenerate``.

Each file is a JSONL recording (:mod:`switchboard.core.agent.replay`): one line per model step holding the
request's fingerprint and the events the model streamed. The offline runs are recorded from the
offline model; the others from a scripted model, through the real runtime, so the fingerprints are
what the runtime really sent.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from switchboard.core.agent.replay import RecordedStep, RecordingModel, ReplayModel, save_recording
from switchboard.core.providers.offline import OfflineModel
from tests.core.turns import (
    RECORDINGS,
    MemorySink,
    MemoryStore,
    agent,
    answer_step,
    big_tool,
    calls_step,
    flaky_tool,
    registry_with,
    request,
    runtime,
)


async def _record(name: str, inner: object, text: str, **kw: object) -> None:
    recorder = RecordingModel(inner)  # type: ignore[arg-type]
    registry = kw.pop("registry", None)
    with tempfile.TemporaryDirectory() as tmp:
        rt = runtime(Path(tmp), model=recorder, registry=registry)  # type: ignore[arg-type]
        await rt.run_turn(request(text, **kw), MemorySink(), MemoryStore())  # type: ignore[arg-type]
    save_recording(recorder.steps, RECORDINGS / name)


def _scripted(*steps: RecordedStep) -> ReplayModel:
    return ReplayModel(list(steps), strict=False)


async def main() -> None:
    await _record("echo.jsonl", OfflineModel(), "hello recorded world")
    await _record("what_time.jsonl", OfflineModel(), "What time is it?")
    tick = ("current_time", {})
    await _record(
        "runaway.jsonl",
        _scripted(*(calls_step(tick, step=i) for i in range(1, 5)), answer_step("I ran out of steps.")),
        "keep checking the clock",
        agent_=agent(max_steps=4),
    )
    flaky = ("flaky", {"n": 1})
    await _record(
        "flaky.jsonl",
        _scripted(*(calls_step(flaky, step=i) for i in range(1, 5)), answer_step("The flaky tool keeps failing.")),
        "use the flaky tool",
        agent_=agent(tools=["flaky"]),
        registry=registry_with(flaky_tool([])),
    )
    await _record(
        "big_then_program.jsonl",
        _scripted(
            calls_step(("big", {}), step=1),
            calls_step(("run_program", {"code": "print(len(result_1))\nresult_1[199]['name']"}), step=2),
            answer_step("There are 200 items.", step=3),
        ),
        "how many items are there?",
        agent_=agent(tools=["big", "current_time"], codeact=True),
        registry=registry_with(big_tool()),
    )


if __name__ == "__main__":
    asyncio.run(main())
