"""Each agent's ``shell`` follows that agent's own egress configuration: its risk, its description, its network.

A worker runtime is built from a YAML config (the shipped one plus two agents: ``sbshell`` without egress, ``sbnet``
with an allowlist), with the worker's real egress proxy under bubblewrap; the offline model's ``/tool shell {...}``
messages drive whole turns.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import yaml

from switchboard.cli.worker import build_runtime, provider_config
from switchboard.core.agent.config import Agent
from switchboard.core.agent.runtime import Runtime
from switchboard.core.providers import ModelFactory
from switchboard.core.turn import HistoryEntry, TurnRequest
from switchboard.egress.gate import SandboxEgress, start_sandbox_egress
from switchboard.settings import Settings, load_settings
from tests.core.turns import MemorySink, MemoryStore, message
from tests.sandbox.conftest import sandbox_of

SHIPPED = Path(__file__).resolve().parents[2] / "config" / "switchboard.yaml"
AGENTS = {
    "sbshell": {"profile": {"name": "Shell", "description": "t"}, "instructions": "t", "tools": ["shell"]},
    "sbnet": {
        "profile": {"name": "Net", "description": "t"},
        "instructions": "t",
        "tools": ["shell"],
        "egress": {"allow": ["example.com"]},
    },
}


def _settings(tmp_path: Path, agents: dict[str, Any]) -> Settings:
    config = yaml.safe_load(SHIPPED.read_text())
    config["agents"].update(agents)
    path = tmp_path / "switchboard.yaml"
    path.write_text(yaml.safe_dump(config))
    return load_settings(
        {
            "SWITCHBOARD_CONFIG": str(path),
            "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
            "SWITCHBOARD_SANDBOX__KIND": "bwrap",
        }
    )


class Worker:
    """A worker's runtime over ``settings`` and its egress proxy (as :func:`switchboard.cli.worker.run_worker` has
    it)."""

    def __init__(self, settings: Settings, runtime: Runtime, gate: SandboxEgress | None) -> None:
        self.settings, self.runtime, self.gate = settings, runtime, gate
        self.store = MemoryStore()

    def agent(self, name: str) -> Agent:
        return self.settings.file.agents[name]

    async def shell(self, agent: str, *commands: str, id: str) -> tuple[str, MemorySink]:
        """One turn of ``agent`` whose message is ``/tool shell {"commands": [...]}``: its reply and its sink."""
        msg = message("/tool shell " + json.dumps({"commands": list(commands)}), id=id)
        turn = TurnRequest(
            session_key=msg.session_key,
            agent=self.agent(agent),
            messages=[msg],
            run_id=f"run-{id}",
            deadline=time.time() + 60,
        )
        sink = MemorySink()
        result = await self.runtime.run_turn(turn, sink, self.store)
        reply = "".join(sink.deltas)
        # what the session worker records after each turn: the message, the turn's work, the answer
        self.store.history += [
            HistoryEntry(role="user", text=msg.text, message_id=msg.id),
            *result.history,
            HistoryEntry(role="assistant", text=reply),
        ]
        return reply, sink


@pytest.fixture
async def make_worker(tmp_path: Path, async_redis: aioredis.Redis) -> AsyncIterator[Any]:
    gates: list[SandboxEgress] = []
    models: list[ModelFactory] = []

    async def build(agents: dict[str, Any]) -> Worker:
        sandbox_of("bwrap")  # skips, naming why, where bubblewrap does not run
        settings = _settings(tmp_path, agents)
        from switchboard.cli.sandbox import startup_choice

        gate = await start_sandbox_egress(settings, async_redis, startup_choice(settings).sandbox)
        if gate is not None:
            gates.append(gate)
        factory = ModelFactory(provider_config(settings))
        models.append(factory)
        return Worker(settings, build_runtime(settings, factory, None, gate), gate)

    yield build
    for gate in gates:
        await gate.close()
    for factory in models:
        await factory.aclose()


def _ran(reply: str, sink: MemorySink) -> bool:
    return "approval" not in reply.lower() and not sink.of("approval_requested")


async def test_an_agent_without_egress_runs_command_after_command_beside_one_with_egress(make_worker: Any) -> None:
    worker = await make_worker(AGENTS)
    assert worker.gate is not None and worker.gate.proxy is not None  # sbnet's allowlist starts the proxy
    first, sink = await worker.shell("sbshell", "echo one > one.txt; cat one.txt", id="m1")
    assert _ran(first, sink), first
    second, sink = await worker.shell("sbshell", "cat one.txt; echo two", id="m2")
    assert _ran(second, sink), second
    assert "two" in second
    shell = {name: worker.runtime.registry.get("shell", agent=name) for name in ("sbshell", "sbnet")}
    assert shell["sbshell"] is not None and shell["sbnet"] is not None
    assert (shell["sbshell"].risk, shell["sbnet"].risk) == ("low", "medium")
    assert "There is no network." in shell["sbshell"].description
    assert "allowlisted" in shell["sbnet"].description and "no network" not in shell["sbnet"].description


async def test_the_same_agent_runs_alike_without_the_other_agent_in_the_config(make_worker: Any) -> None:
    worker = await make_worker({"sbshell": AGENTS["sbshell"]})
    assert worker.gate is None
    first, sink = await worker.shell("sbshell", "echo one", id="m1")
    assert _ran(first, sink), first
    second, sink = await worker.shell("sbshell", "echo two", id="m2")
    assert _ran(second, sink), second


async def test_the_agent_with_egress_still_has_its_commands_gated_after_untrusted_output(make_worker: Any) -> None:
    worker = await make_worker(AGENTS)
    first, sink = await worker.shell("sbnet", "echo one", id="m1")
    assert _ran(first, sink), first
    second, sink = await worker.shell("sbnet", "echo two", id="m2")
    assert not _ran(second, sink), second  # network with secrets behind it: gated like a send
