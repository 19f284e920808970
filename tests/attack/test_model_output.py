"""A hostile model (or an endpoint posing as one) sending JSON escapes of lone surrogates.

``"\\ud800"`` is valid JSON but no UTF-8 encoder takes the string it decodes to. Before the runtime made model
output encodable, such a tool argument failed the turn with ``UnicodeEncodeError`` three times (the model re-run,
and paid, each time) before a dead letter; such a reply text was delivered, then failed the ledger's write, leaving
the turn neither completed nor failed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.runtime import Runtime
from switchboard.core.model import Finished, ModelEvent, ModelRequest, TextDelta, ToolCall, ToolCallEvent, Usage
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.providers.transcript import parse_arguments
from switchboard.core.providers.validtext import MAX_ARGUMENT_DEPTH
from switchboard.core.tools.builtin import default_registry
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.settings import QueueSettings
from switchboard.worker.drain import Drainer
from tests.core.turns import MemorySink, MemoryStore, request
from tests.core.turns import runtime as runtime_for
from tests.queue.conftest import RecordingDeliverer, make_message

AGENT = Agent(name="assistant", profile=AgentProfile(name="A"), instructions="Answer.", tools=["read_file"])


class SurrogateModel:
    """Asks for a file whose name holds a lone surrogate (``arguments``), or answers with one (``reply``)."""

    provider = "offline"

    def __init__(self, where: str) -> None:
        self.where = where
        self.calls = 0
        self.seen: list[ModelRequest] = []

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.calls += 1
        self.seen.append(request)
        if self.where == "arguments" and request.messages[-1].role == "user":
            yield ToolCallEvent(call=ToolCall(id="c1", name="read_file", arguments={"path": "notes\udcff.md"}))
            yield Usage(input_tokens=1, output_tokens=1)
            yield Finished(stop_reason="tool_calls")
            return
        yield TextDelta(text="bad \ud800 text" if self.where == "reply" else "fine")
        yield Usage(input_tokens=1, output_tokens=1)
        yield Finished()


async def _drain(
    model: SurrogateModel | None,
    client: aioredis.Redis,
    ingestor: Ingestor,
    settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
    *,
    text: str = "hello",
    agent: Agent = AGENT,
) -> list[Any]:
    """Drain one message through the real runtime (``model``, or the real offline model); the event kinds."""
    factory = ModelFactory(ProviderConfig())
    if model is not None:
        factory.override("offline", model)
    runtime = Runtime(models=factory, tools=default_registry(), workspace_root=tmp_path / "ws")
    drainer = Drainer(
        client, settings, runner=runtime.run_turn, deliverer=deliverer, agent_for=lambda _m: agent, worker_id="w1"
    )
    message = make_message(text)
    await ingestor.ingest(message)
    await drainer.drain(message.session_key)
    entries = await client.xrange(SessionKeys(message.session_key).events)
    return [fields[b"kind"].decode() for _, fields in entries]


async def test_a_lone_surrogate_in_tool_arguments_is_told_to_the_model_once(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    model = SurrogateModel("arguments")
    kinds = await _drain(model, client, ingestor, queue_settings, deliverer, tmp_path)

    assert "run_failed" not in kinds and kinds[-1] == "run_completed"
    assert model.calls == 2  # the call, then the answer: never a re-run of the whole turn
    [result] = [m for m in model.seen[1].messages if m.role == "tool"]
    # read_file ran and failed: its failure is shown as data, like its result (the file name is the session's text)
    assert result.content.startswith('<data source="read_file:') and 'trust="untrusted"' in result.content
    body = result.content.split("\n", 1)[1].rsplit("\n</data>", 1)[0]
    assert json.loads(body)["error_class"] == "validation"  # no such file: the model can correct it
    assert "\ufffd" in result.content  # the name as the gateway saw it: encodable
    assert deliverer.texts() == ["fine"]


async def test_a_lone_surrogate_in_the_reply_is_replaced_and_the_turn_completes(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    kinds = await _drain(SurrogateModel("reply"), client, ingestor, queue_settings, deliverer, tmp_path)

    assert kinds[-1] == "run_completed"
    assert deliverer.texts() == ["bad \ufffd text"]


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"v": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


class DeepModel:
    """Asks for ``read_file`` with arguments nested ``depth`` levels deep (valid JSON all the same)."""

    provider = "offline"

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.seen: list[ModelRequest] = []

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.seen.append(request)
        if request.messages[-1].role == "user":
            arguments = {"path": "a.md", "x": _nested(self.depth)}
            yield ToolCallEvent(call=ToolCall(id="c1", name="read_file", arguments=arguments))
            yield Finished(stop_reason="tool_calls")
            return
        yield TextDelta(text="fine")
        yield Finished()


async def test_tool_arguments_nested_absurdly_deep_are_a_correctable_error(tmp_path: Path) -> None:
    model = DeepModel(980)  # before: RecursionError out of run_turn (hashing the arguments)
    result = await runtime_for(tmp_path, model=model).run_turn(request("hi", agent_=AGENT), MemorySink(), MemoryStore())

    assert result.text == "fine"
    [told] = [m for m in model.seen[1].messages if m.role == "tool"]
    assert json.loads(told.content)["error_class"] == "validation"
    assert f"nested deeper than {MAX_ARGUMENT_DEPTH} levels" in told.content


def test_streamed_arguments_nested_thousands_deep_parse_as_malformed() -> None:
    raw = "[" * 5_000
    assert parse_arguments(raw) == {"_raw": raw}  # before: RecursionError out of the provider adapter


async def test_a_users_nesting_bomb_to_the_offline_model_is_answered_once(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    clock = Agent(name="assistant", profile=AgentProfile(name="A"), instructions="Answer.", tools=["current_time"])
    bomb = "/tool current_time " + "[" * 3_000  # what anyone can type into the web chat of a default install
    kinds = await _drain(None, client, ingestor, queue_settings, deliverer, tmp_path, text=bomb, agent=clock)

    assert "run_failed" not in kinds and kinds[-1] == "run_completed"  # before: 3 failed runs, a dead letter
    assert "current_time failed: arguments of current_time are not a JSON object" in deliverer.texts()[-1]
