"""Idempotency of write effects: keys from (run, logical action, occurrence), one effect per key, conflicts refused."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.actions import Action
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.effects import EffectRecord, TurnEffects, effect_key
from switchboard.core.tools.gateway import CallScope, ToolGateway, workspace_for
from switchboard.errors import ToolError
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


async def test_an_identical_write_again_later_in_the_turn_runs_again_under_its_own_key(tmp_path: Path) -> None:
    runs: list[int] = []

    async def send(args: Payload, c: ToolContext) -> Any:
        runs.append(args.n)
        return {"sent": args.n, "run": len(runs)}

    registry = registry_with(make_tool("send", send, input=Payload, side_effect="write"))
    model = ReplayModel([calls_step(("send", {"n": 7}), ("send", {"n": 7}), step=1), answer_step("ok", step=2)])
    sink = MemorySink()
    await runtime(tmp_path, model=model, registry=registry).run_turn(
        request("send it twice", agent_=agent(tools=["send"])), sink, MemoryStore()
    )

    assert runs == [7, 7]  # a deliberate second call is a second action
    results = [json.loads(m.content) for m in model.requests[1].messages if m.role == "tool"]
    assert results == [{"run": 1, "sent": 7}, {"run": 2, "sent": 7}]
    keys = [e.idempotency_key for e in sink.of("tool_called")]
    assert keys == [effect_key("run-1", "send", {"n": 7}), effect_key("run-1", "send", {"n": 7}, 2)]
    assert keys[0] != keys[1]


async def test_calls_from_a_program_count_occurrences_in_call_order_with_the_tool_calls(tmp_path: Path) -> None:
    runs: list[tuple[int, str]] = []

    async def send(args: Payload, c: ToolContext) -> Any:
        runs.append((args.n, c.idempotency_key))
        return {"sent": args.n, "run": len(runs)}

    registry = registry_with(make_tool("send", send, input=Payload, side_effect="write"))
    code = "a = send(n=7)\nb = send(n=8)\nc = send(n=7)\nprint(a['run'], b['run'], c['run'])"
    model = ReplayModel(
        [
            calls_step(("send", {"n": 7}), step=1),
            calls_step(("run_program", {"code": code}), step=2),
            answer_step("ok", step=3),
        ]
    )
    await runtime(tmp_path, model=model, registry=registry).run_turn(
        request("send", agent_=agent(tools=["send"], codeact=True)), MemorySink(), MemoryStore()
    )

    seven = [effect_key("run-1", "send", {"n": 7}, n) for n in (1, 2, 3)]
    assert runs == [(7, seven[0]), (7, seven[1]), (8, effect_key("run-1", "send", {"n": 8})), (7, seven[2])]
    program = json.loads(model.requests[2].messages[-1].content)
    assert program["output"].strip() == "2 3 4"  # every call ran


async def test_a_retry_after_a_failure_keeps_its_key_and_a_reattempt_maps_each_call_to_its_record(
    tmp_path: Path,
) -> None:
    effects, runs = TurnEffects(), []

    async def send(args: Payload, c: ToolContext) -> Any:
        runs.append(c.idempotency_key)
        if len(runs) == 1:
            raise ToolError("the upstream refused it", error_class="permanent")
        return {"run": len(runs)}

    gw = ToolGateway(
        registry_with(make_tool("send", send, input=Payload, side_effect="write")),
        workspace_root=tmp_path / "ws",
        backoff_base_s=0.0,
    )
    first, second = effect_key("run-1", "send", {"n": 1}), effect_key("run-1", "send", {"n": 1}, 2)
    attempt = CallScope()
    failed = await gw.call("send", {"n": 1}, ctx(tmp_path, effects), scope=attempt)
    assert not failed.ok and failed.idempotency_key == first and effects.records == {}  # released
    retried = await gw.call("send", {"n": 1}, ctx(tmp_path, effects), scope=attempt)
    again = await gw.call("send", {"n": 1}, ctx(tmp_path, effects), scope=attempt)
    assert (retried.idempotency_key, again.idempotency_key) == (first, second)  # the failure did not count
    assert runs == [first, first, second] and retried.value == {"run": 2} and again.value == {"run": 3}

    rerun = CallScope()  # the run attempted again after a crash: the same calls in the same order
    replayed = [await gw.call("send", {"n": 1}, ctx(tmp_path, effects), scope=rerun) for _ in range(3)]
    assert [o.value for o in replayed] == [{"run": 2}, {"run": 3}, {"run": 4}]
    assert [o.attempts for o in replayed] == [0, 0, 1]  # two recorded outcomes, then a third action
    assert runs == [first, first, second, effect_key("run-1", "send", {"n": 1}, 3)]


async def test_an_unknown_outcome_is_not_repeated_by_calling_again(tmp_path: Path) -> None:
    effects, runs = TurnEffects(), []

    async def hang(args: Payload, c: ToolContext) -> Any:
        runs.append(args.n)
        await asyncio.sleep(10)

    gw = ToolGateway(
        registry_with(make_tool("hang", hang, input=Payload, side_effect="write", timeout_s=0.01)),
        workspace_root=tmp_path / "ws",
    )
    scope = CallScope()
    timed_out = await gw.call("hang", {"n": 1}, ctx(tmp_path, effects), scope=scope)
    again = await gw.call("hang", {"n": 1}, ctx(tmp_path, effects), scope=scope)
    assert timed_out.error_class == "ambiguous_timeout" and again.error_class == "ambiguous"
    assert runs == [1] and again.idempotency_key == timed_out.idempotency_key


async def test_a_channel_action_again_in_the_turn_is_sent_again_but_never_with_other_arguments(
    tmp_path: Path,
) -> None:
    effects, sent, scope = TurnEffects(), Sent(), CallScope()
    gw = gateway(tmp_path)
    workspace = workspace_for(tmp_path / "ws", SESSION)
    workspace.mkdir(parents=True)
    (workspace / "report.pdf").write_bytes(b"%PDF-1.4 v1")

    first = await gw.call("send_file", {"path": "report.pdf"}, ctx(tmp_path, effects, sent), scope=scope)
    other = await gw.call(
        "send_file", {"path": "report.pdf", "caption": "x"}, ctx(tmp_path, effects, sent), scope=scope
    )
    (workspace / "report.pdf").write_bytes(b"%PDF-1.4 v2")  # the model changed the file and sends it again
    again = await gw.call("send_file", {"path": "report.pdf"}, ctx(tmp_path, effects, sent), scope=scope)

    assert first.ok and other.error_class == "idempotency_conflict" and again.ok
    assert len(sent.actions) == 2 and again.idempotency_key == effect_key(
        "run-1", "send_file", {"path": "report.pdf"}, 2
    )


def test_occurrences_count_from_one_and_the_first_keeps_the_unnumbered_key() -> None:
    plain = hashlib.sha256(b'run-1\nsend\n{"n":1}').hexdigest()
    assert effect_key("run-1", "send", {"n": 1}) == effect_key("run-1", "send", {"n": 1}, 1) == plain
    assert effect_key("run-1", "send", {"n": 1}, 2) == hashlib.sha256(b'run-1\nsend\n{"n":1}\n2').hexdigest()
    with pytest.raises(ValueError, match="counts from 1"):
        effect_key("run-1", "send", {"n": 1}, 0)


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
