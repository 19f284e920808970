"""Idempotency of write effects: keys from (run, logical action), one effect per key, conflicts refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from switchboard.core.actions import Action
from switchboard.core.effects import EffectRecord, TurnEffects, effect_key
from switchboard.core.gateway import CallScope, ToolGateway, workspace_for
from switchboard.core.replay import ReplayModel
from switchboard.core.toolbox import default_registry
from switchboard.core.tools import ToolContext
from switchboard.types import SessionKey
from tests.core.turns import (
    MemorySink,
    MemoryStore,
    Payload,
    agent,
    answer_step,
    calls_step,
    make_tool,
    registry_with,
    request,
    runtime,
)

SESSION = SessionKey("t/a/web/default/c")


class Sent:
    def __init__(self) -> None:
        self.actions: list[Action] = []

    async def __call__(self, action: Action) -> None:
        self.actions.append(action)


def ctx(tmp_path: Path, effects: TurnEffects, act: Any = None, run_id: str = "run-1") -> ToolContext:
    return ToolContext(
        session_key=SESSION,
        tenant="t",
        run_id=run_id,
        actor="u",
        workspace=workspace_for(tmp_path / "ws", SESSION),
        idempotency_key="",
        act=act,
        effects=effects,
    )


def gateway(tmp_path: Path) -> ToolGateway:
    return ToolGateway(default_registry(), workspace_root=tmp_path / "ws", backoff_base_s=0.0)


async def test_an_identical_write_twice_in_one_turn_runs_once(tmp_path: Path) -> None:
    runs: list[int] = []

    async def send(args: Payload, c: ToolContext) -> Any:
        runs.append(args.n)
        return {"sent": args.n, "run": len(runs)}

    registry = registry_with(make_tool("send", send, input=Payload, side_effect="write"))
    model = ReplayModel([calls_step(("send", {"n": 7}), ("send", {"n": 7}), step=1), answer_step("ok", step=2)])
    sink = MemorySink()
    await runtime(tmp_path, model=model, registry=registry).run_turn(
        request("send it", agent_=agent(tools=["send"])), sink, MemoryStore()
    )

    assert runs == [7]  # one effect
    results = [json.loads(m.content) for m in model.requests[1].messages if m.role == "tool"]
    assert results == [{"run": 1, "sent": 7}, {"run": 1, "sent": 7}]  # the second call got the recorded result
    keys = [e.idempotency_key for e in sink.of("tool_called")]
    assert len(keys) == 2 and keys[0] == keys[1]


async def test_write_file_twice_with_the_same_content_writes_once(tmp_path: Path) -> None:
    effects = TurnEffects()
    gw = gateway(tmp_path)
    args = {"path": "notes.md", "content": "first version"}

    first = await gw.call("write_file", args, ctx(tmp_path, effects), scope=CallScope())
    again = await gw.call("write_file", args, ctx(tmp_path, effects), scope=CallScope())

    assert first.ok and again.ok and again.attempts == 0 and again.value == first.value
    assert first.idempotency_key == again.idempotency_key and first.idempotency_key is not None
    other = await gw.call("write_file", {**args, "content": "DIFFERENT CONTENT"}, ctx(tmp_path, effects))
    assert other.ok and other.idempotency_key != first.idempotency_key  # a different logical action


async def test_the_same_key_with_other_arguments_is_refused(tmp_path: Path) -> None:
    effects, sent = TurnEffects(), Sent()
    gw = gateway(tmp_path)
    workspace = workspace_for(tmp_path / "ws", SESSION)
    workspace.mkdir(parents=True)
    (workspace / "report.pdf").write_bytes(b"%PDF-1.4")

    first = await gw.call("send_file", {"path": "report.pdf", "caption": "first"}, ctx(tmp_path, effects, sent))
    rerun = await gw.call("send_file", {"path": "report.pdf", "caption": "other"}, ctx(tmp_path, effects, sent))

    assert first.ok and len(sent.actions) == 1
    assert first.idempotency_key == rerun.idempotency_key == effect_key("run-1", "send_file", {"path": "report.pdf"})
    assert not rerun.ok and rerun.error_class == "idempotency_conflict" and "different arguments" in str(rerun.error)
    elsewhere = await gw.call("send_file", {"path": "report.pdf"}, ctx(tmp_path, effects, sent, run_id="run-2"))
    assert elsewhere.ok and len(sent.actions) == 2  # another run is another action


async def test_a_replayed_turn_gets_the_recorded_result_without_running(tmp_path: Path) -> None:
    effects, sent = TurnEffects(), Sent()
    gw = gateway(tmp_path)
    args = {"question": "Which plan?", "options": ["Basic", "Pro"]}

    first = await gw.call("offer_choice", args, ctx(tmp_path, effects, sent), scope=CallScope())
    replay = await gw.call("offer_choice", args, ctx(tmp_path, effects, sent), scope=CallScope())

    assert len(sent.actions) == 1
    assert replay.ok and replay.value == first.value and replay.attempts == 0


async def test_a_failed_write_releases_its_key_and_an_unfinished_one_is_not_repeated(tmp_path: Path) -> None:
    effects, sent = TurnEffects(), Sent()
    gw = gateway(tmp_path)
    args = {"path": "late.pdf"}

    missing = await gw.call("send_file", args, ctx(tmp_path, effects, sent))
    assert not missing.ok and effects.records == {}  # failed: the claim is released ...
    workspace = workspace_for(tmp_path / "ws", SESSION)
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "late.pdf").write_bytes(b"%PDF-1.4")
    assert (await gw.call("send_file", args, ctx(tmp_path, effects, sent))).ok  # ... so a later try runs

    crashed = effect_key("run-9", "send_file", args)
    fingerprint = next(iter(effects.records.values())).action_sha256
    await effects.effect_begin(crashed, EffectRecord(fingerprint))  # a worker died mid-send
    unknown = await gw.call("send_file", args, ctx(tmp_path, effects, sent, run_id="run-9"))
    assert not unknown.ok and unknown.error_class == "ambiguous" and len(sent.actions) == 1
