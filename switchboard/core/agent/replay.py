"""Record a run's model decisions and replay them deterministically.

:class:`RecordingModel` wraps any adapter and keeps, per step, a small fingerprint of the request
(last message role, message count, tool names) and every event the model produced. A recording is a
list of :class:`RecordedStep` or a JSONL file (one step per line). :class:`ReplayModel` plays the
steps back in order — same events, no network, no delay — and raises
:class:`~switchboard.errors.ReplayDivergedError` when the run asks for more steps than were recorded,
or (``strict``) when a request no longer matches what was recorded.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from switchboard.core.model import ModelAdapter, ModelEvent, ModelRequest
from switchboard.errors import ModelError, ReplayDivergedError

__all__ = [
    "RecordedStep",
    "RecordingModel",
    "ReplayModel",
    "dump_events",
    "load_recording",
    "request_fingerprint",
    "save_recording",
]

_EVENT: TypeAdapter[ModelEvent] = TypeAdapter(ModelEvent)


def request_fingerprint(request: ModelRequest) -> dict[str, Any]:
    """What a replay checks about a request: its shape, not its wording."""
    last = request.messages[-1] if request.messages else None
    return {
        "last_role": last.role if last else None,
        "last_tool": last.name if last is not None and last.role == "tool" else None,
        "tools": sorted(t.name for t in request.tools),
    }


class RecordedStep(BaseModel):
    """One model step: the request's fingerprint and what the model streamed back (or its error)."""

    model_config = ConfigDict(frozen=True)

    step: int
    request: dict[str, Any] = Field(default_factory=dict)
    events: list[ModelEvent] = Field(default_factory=list)
    error: dict[str, Any] | None = None
    """A provider error ended the step: ``{"message", "retryable", "retry_after", "code"}``."""


def load_recording(path: Path) -> list[RecordedStep]:
    """Read a JSONL recording (blank lines and ``#`` comments are skipped)."""
    steps = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            steps.append(RecordedStep.model_validate_json(line))
    return steps


def save_recording(steps: Iterable[RecordedStep], path: Path) -> None:
    """Write a recording as JSONL."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(s.model_dump_json(exclude_none=True) + "\n" for s in steps), encoding="utf-8")


class RecordingModel:
    """Wraps an adapter and records each step; append-writes JSONL to ``path`` when given."""

    def __init__(self, inner: ModelAdapter, *, path: Path | None = None) -> None:
        self.inner = inner
        self.provider = inner.provider
        self.path = path
        self.steps: list[RecordedStep] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Pass the inner adapter's events through, keeping a copy."""
        events: list[ModelEvent] = []
        error: dict[str, Any] | None = None
        try:
            async for event in self.inner.stream(request):
                events.append(event)
                yield event
        except ModelError as err:
            error = {"message": str(err), "retryable": err.retryable, "retry_after": err.retry_after, "code": err.code}
            raise
        finally:
            step = RecordedStep(
                step=len(self.steps) + 1, request=request_fingerprint(request), events=events, error=error
            )
            self.steps.append(step)
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as out:
                    out.write(step.model_dump_json(exclude_none=True) + "\n")

    async def aclose(self) -> None:
        """Close the inner adapter."""
        await self.inner.aclose()


class ReplayModel:
    """Plays a recording back, step by step."""

    provider = "replay"

    def __init__(self, recording: Sequence[RecordedStep] | Path, *, strict: bool = True) -> None:
        self.steps = load_recording(recording) if isinstance(recording, Path) else list(recording)
        self.strict = strict
        self.position = 0
        self.requests: list[ModelRequest] = []
        """Every request the run sent, in order (for assertions)."""

    @property
    def exhausted(self) -> bool:
        """Every recorded step has been played."""
        return self.position >= len(self.steps)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """The next recorded step's events.

        Raises:
            ReplayDivergedError: no step left, or (``strict``) the request does not match the recorded one.
            ModelError: the recorded step ended in a provider error.
        """
        self.requests.append(request)
        if self.position >= len(self.steps):
            raise ReplayDivergedError(
                f"the run asked for step {self.position + 1} but the recording holds {len(self.steps)}"
            )
        step = self.steps[self.position]
        self.position += 1
        if self.strict and step.request:
            seen = request_fingerprint(request)
            diff = {k: (v, seen.get(k)) for k, v in step.request.items() if seen.get(k) != v}
            if diff:
                details = "; ".join(f"{k}: recorded {a!r}, got {b!r}" for k, (a, b) in sorted(diff.items()))
                raise ReplayDivergedError(f"step {step.step} diverged from the recording ({details})")
        for event in step.events:
            yield event
        if step.error is not None:
            raise ModelError(
                str(step.error.get("message", "recorded provider error")),
                retryable=bool(step.error.get("retryable")),
                retry_after=step.error.get("retry_after"),
                code=step.error.get("code"),
            )

    async def aclose(self) -> None:
        """Nothing to release."""


def dump_events(events: Iterable[ModelEvent]) -> list[dict[str, Any]]:
    """Events as JSON-able dicts (for assertions and hand-written recordings)."""
    return [json.loads(_EVENT.dump_json(e)) for e in events]
