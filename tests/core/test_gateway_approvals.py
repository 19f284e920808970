"""The gateway's policy step: needs_approval (nothing runs), approved= (runs once under its key), refusals,
write retries only where safe, effects in doubt routed to reconciliation, and the spans it writes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from switchboard import tracing
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.approvals.policy import Policy, PolicyConfig
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.effects import EffectRecord, TurnEffects, effect_key
from switchboard.core.tools.gateway import CallScope, ToolGateway, action_sha256, workspace_for
from switchboard.errors import ToolError
from switchboard.types import SessionKey
from tests.core.turns import (
    MemorySink,
    MemoryStore,
    answer_step,
    calls_step,
    make_tool,
    registry_with,
    request,
    runtime,
)
from tests.core.turns import agent as turns_agent

SESSION = SessionKey("t/a/telegram/default/c")


class Payment(BaseModel):
    amount: float
    to: str = "acme"


def payer(runs: list[dict[str, Any]], **kw: Any) -> Tool:
    async def pay(args: Payment, c: ToolContext) -> Any:
        runs.append({"amount": args.amount, "key": c.idempotency_key})
        return {"paid": args.amount}

    kw.setdefault("risk", "medium")
    kw.setdefault("reversible", False)
    return make_tool(
        "pay", pay, input=Payment, side_effect="write", resources=lambda a: (f"{a.amount} to {a.to}",), **kw
    )


def policy(**body: Any) -> Policy:
    return Policy.of(("agent:a", PolicyConfig.model_validate(body)))


def ctx(tmp_path: Path, effects: TurnEffects | None = None, **kw: Any) -> ToolContext:
    values: dict[str, Any] = {
        "session_key": SESSION,
        "tenant": "t",
        "run_id": "run-1",
        "actor": "telegram:42",
        "workspace": workspace_for(tmp_path / "ws", SESSION),
        "idempotency_key": "",
        "effects": effects if effects is not None else TurnEffects(),
        "agent": "a",
    }
    values.update(kw)
    return ToolContext(**values)


def gateway(tmp_path: Path, *tools: Tool, **kw: Any) -> ToolGateway:
    kw.setdefault("backoff_base_s", 0.0)
    return ToolGateway(ToolRegistry(tools), workspace_root=tmp_path / "ws", **kw)


async def test_a_gated_call_returns_an_approval_request_and_nothing_runs_or_is_claimed(tmp_path: Path) -> None:
    runs: list[dict[str, Any]] = []
    effects, scope = TurnEffects(), CallScope()
    gw = gateway(tmp_path, payer(runs))
    outcome = await gw.call("pay", {"amount": 250}, ctx(tmp_path, effects), scope=scope)

    assert (outcome.ok, outcome.error_class, outcome.policy) == (False, "needs_approval", "approve:default:risky_write")
    assert runs == [] and effects.records == {} and scope.ordinals == {}  # nothing ran, claimed or counted
    request = outcome.approval
    assert request is not None
    normalised = {"amount": 250.0, "to": "acme"}
    assert request.arguments == normalised
    assert request.action_sha256 == action_sha256("pay", normalised) == outcome.action_sha256
    assert request.idempotency_key == effect_key("run-1", "pay", normalised) == outcome.idempotency_key
    assert request.resources == ("250.0 to acme",)
    assert (request.rule, request.risk, request.reversible) == ("default:risky_write", "medium", False)
    assert request.policy_version == Policy().version

    again = await gw.call("pay", {"amount": 250}, ctx(tmp_path, effects), scope=scope)
    assert again.approval == request  # the same call asks for the same action under the same key


async def test_the_approved_call_runs_exactly_once_under_the_approved_key(tmp_path: Path) -> None:
    runs: list[dict[str, Any]] = []
    effects = TurnEffects()
    gw = gateway(tmp_path, payer(runs))
    asked = await gw.call("pay", {"amount": 250}, ctx(tmp_path, effects))
    assert asked.approval is not None

    # a later run (the resumed turn) with another run id and a fresh scope still runs under the approved key
    resumed = ctx(tmp_path, effects, run_id="run-2")
    done = await gw.call("pay", {"amount": 250}, resumed, scope=CallScope(), approved=asked.approval)
    assert (done.ok, done.value, done.idempotency_key) == (True, {"paid": 250.0}, asked.approval.idempotency_key)
    assert runs == [{"amount": 250.0, "key": asked.approval.idempotency_key}]
    assert done.policy == "approve:default:risky_write"  # recorded: it ran because a person approved it

    # a crash after the effect, before the approval was settled: the re-run finds the recorded outcome
    rerun = await gw.call("pay", {"amount": 250}, resumed, scope=CallScope(), approved=asked.approval)
    assert (rerun.ok, rerun.value, rerun.attempts) == (True, {"paid": 250.0}, 0)
    assert len(runs) == 1  # executed once


async def test_a_changed_payload_is_refused_against_the_approval(tmp_path: Path) -> None:
    runs: list[dict[str, Any]] = []
    gw = gateway(tmp_path, payer(runs), dataclasses.replace(payer(runs), name="pay2"))
    asked = await gw.call("pay", {"amount": 250}, ctx(tmp_path))
    assert asked.approval is not None

    changed = await gw.call("pay", {"amount": 2500}, ctx(tmp_path), approved=asked.approval)
    other_tool = await gw.call("pay2", {"amount": 250}, ctx(tmp_path), approved=asked.approval)
    assert (changed.ok, changed.error_class) == (False, "approval_mismatch")
    assert (other_tool.ok, other_tool.error_class) == (False, "approval_mismatch")
    assert runs == []


async def test_approval_does_not_override_a_refusal_or_a_missing_permission(tmp_path: Path) -> None:
    runs: list[dict[str, Any]] = []
    guarded = payer(runs, permission="payments.send")
    gw = gateway(tmp_path, guarded)
    permitted = ctx(tmp_path, permissions=frozenset({"payments.*"}))
    asked = await gw.call("pay", {"amount": 250}, permitted)
    assert asked.approval is not None  # a granted glob covers the permission

    revoked = await gw.call("pay", {"amount": 250}, ctx(tmp_path), approved=asked.approval)
    assert (revoked.ok, revoked.error_class) == (False, "auth")  # authorisation is re-checked after approval

    refusing = policy(rules=[{"name": "frozen", "tool": "pay", "decide": "refuse", "reason": "payments are frozen"}])
    refused = await gw.call(
        "pay",
        {"amount": 250},
        ctx(tmp_path, permissions=frozenset({"payments.*"}), policy=refusing),
        approved=asked.approval,
    )
    assert (refused.ok, refused.error_class, refused.policy) == (False, "refused_by_policy", "refuse:frozen")
    assert refused.error is not None and "payments are frozen" in refused.error
    assert runs == []


async def test_observe_mode_runs_a_would_be_approval_and_records_it(tmp_path: Path) -> None:
    runs: list[dict[str, Any]] = []
    gw = gateway(tmp_path, payer(runs))
    outcome = await gw.call("pay", {"amount": 250}, ctx(tmp_path, policy=policy(mode="observe")))
    assert (outcome.ok, outcome.policy, outcome.approval) == (True, "observe:default:risky_write", None)
    assert len(runs) == 1


async def test_rules_with_conditions_decide_at_the_gateway(tmp_path: Path) -> None:
    runs: list[dict[str, Any]] = []
    rules = [
        {"name": "small", "tool": "pay", "when": [{"field": "amount", "le": 100}], "decide": "allow"},
        {"name": "big", "tool": "pay", "when": [{"field": "amount", "gt": 100}], "decide": "approve"},
    ]
    gw = gateway(tmp_path, payer(runs))
    c = ctx(tmp_path, policy=policy(rules=rules))
    small = await gw.call("pay", {"amount": 40}, c)
    big = await gw.call("pay", {"amount": 140}, c)
    assert (small.ok, small.policy) == (True, "allow:small")
    assert (big.error_class, big.policy) == ("needs_approval", "approve:big")
    assert big.approval is not None and big.approval.rule == "big"
    assert [r["amount"] for r in runs] == [40.0]


# ------------------------------------------------------------------ retries and doubt


def flaky_write(runs: list[int], error: BaseException, **kw: Any) -> Tool:
    async def fn(args: Payment, c: ToolContext) -> Any:
        runs.append(1)
        if len(runs) == 1:
            raise error
        return {"ok": len(runs)}

    kw.setdefault("retry_on", frozenset({"rate_limit", "transient", "ambiguous_timeout"}))
    return make_tool("w", fn, input=Payment, side_effect="write", risk="low", **kw)


@pytest.mark.parametrize(
    ("error", "idempotent", "runs_expected", "error_class"),
    [
        (ConnectionError("reset"), False, 1, "transient"),  # may have half-happened: not retried
        (ConnectionError("reset"), True, 2, None),  # the downstream honours the key: retried
        (ToolError("slow", error_class="rate_limit", retry_after=0.0), False, 2, None),  # not performed: retried
        (TimeoutError(), True, 2, None),
    ],
)
async def test_writes_are_retried_only_where_it_is_safe(
    tmp_path: Path, error: BaseException, idempotent: bool, runs_expected: int, error_class: str | None
) -> None:
    runs: list[int] = []
    gw = gateway(tmp_path, flaky_write(runs, error, idempotent=idempotent))
    outcome = await gw.call("w", {"amount": 1}, ctx(tmp_path))
    assert len(runs) == runs_expected
    assert outcome.error_class == error_class


async def test_a_write_timing_out_is_routed_to_reconciliation_and_never_rerun(tmp_path: Path) -> None:
    runs: list[int] = []
    effects = TurnEffects()
    gw = gateway(tmp_path, flaky_write(runs, TimeoutError(), retry_on=frozenset()))
    first = await gw.call("w", {"amount": 1}, ctx(tmp_path, effects))
    assert first.error_class == "ambiguous_timeout"
    key = first.idempotency_key
    assert key is not None and effects.records[key].status == "started"
    record, info = effects.doubts[key]
    assert (record.tool, info["reason"], info["run_id"], info["session"]) == (
        "w",
        "ambiguous_timeout",
        "run-1",
        SESSION,
    )
    assert "amount" not in str(info)  # ids and classes, never arguments

    again = await gw.call("w", {"amount": 1}, ctx(tmp_path, effects))  # a re-run of the turn
    assert again.error_class == "ambiguous" and len(runs) == 1
    assert effects.doubts[key][1]["reason"] == "found_started"
    assert effects.doubts[key][0] == effects.records[key]  # the stored claim, with its tool, run and start time


async def test_a_claim_found_started_by_a_dead_worker_goes_to_reconciliation(tmp_path: Path) -> None:
    runs: list[dict[str, Any]] = []
    effects = TurnEffects()
    normalised = {"amount": 5.0, "to": "acme"}
    key = effect_key("run-1", "pay", normalised)
    effects.records[key] = EffectRecord(action_sha256("pay", normalised), tool="pay", run_id="run-1", started_at=1.0)
    gw = gateway(tmp_path, payer(runs))
    outcome = await gw.call(
        "pay",
        {"amount": 5},
        ctx(tmp_path, effects, policy=policy(untrusted_effects="allow", rules=[{"tool": "pay", "decide": "allow"}])),
    )
    assert outcome.error_class == "ambiguous" and runs == []
    assert effects.doubts[key][0].started_at == 1.0


async def test_a_claim_found_started_runs_again_under_its_key_when_the_downstream_honours_it(tmp_path: Path) -> None:
    runs: list[dict[str, Any]] = []
    effects = TurnEffects()
    normalised = {"amount": 5.0, "to": "acme"}
    key = effect_key("run-1", "pay", normalised)
    effects.records[key] = EffectRecord(action_sha256("pay", normalised), tool="pay", run_id="run-1", started_at=1.0)
    gw = gateway(tmp_path, payer(runs, idempotent=True))
    outcome = await gw.call(
        "pay",
        {"amount": 5},
        ctx(tmp_path, effects, policy=policy(untrusted_effects="allow", rules=[{"tool": "pay", "decide": "allow"}])),
    )
    assert (outcome.ok, outcome.idempotency_key) == (True, key)
    assert runs == [{"amount": 5.0, "key": key}]  # the same key: the downstream answers it if it saw it
    assert effects.records[key].status == "done" and key not in effects.doubts


def test_effect_records_keep_tool_run_and_start_and_read_old_records() -> None:
    record = EffectRecord("h", "started", None, tool="pay", run_id="run-1", started_at=12.5)
    assert EffectRecord.from_json(record.to_json()) == record
    old = EffectRecord.from_json('{"action_sha256":"h","status":"done","outcome":{"ok":true}}')
    assert (old.status, old.outcome, old.tool, old.run_id, old.started_at) == ("done", {"ok": True}, "", "", 0.0)


# ------------------------------------------------------------------ spans


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.install(None)
        provider.shutdown()


async def test_policy_check_and_tool_call_spans_carry_classes_never_argument_values(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    gw = gateway(tmp_path, payer([]))
    await gw.call("pay", {"amount": 987654, "to": "Mallory"}, ctx(tmp_path))
    found = {s.name: dict(s.attributes or {}) for s in spans.get_finished_spans()}
    assert found["policy.check"] == {
        "tool.name": "pay",
        "policy.version": Policy().version,
        "policy.decision": "approve",
        "policy.rule": "default:risky_write",
    }
    assert found["tool.call"]["tool.error_class"] == "needs_approval" and found["tool.call"]["tool.name"] == "pay"
    assert found["tool.call"]["policy.decision"] == "approve:default:risky_write"
    assert all("987654" not in str(v) and "Mallory" not in str(v) for attrs in found.values() for v in attrs.values())


async def test_a_turn_runs_under_the_policy_its_request_carries(tmp_path: Path) -> None:
    """The drain resolves the channel's and tenant's blocks into ``TurnRequest.policy``; the gateway obeys it."""
    runs: list[dict[str, Any]] = []
    registry = registry_with(payer(runs, risk="low", reversible=True))  # ungated by default
    steps = [calls_step(("pay", {"amount": 5}), step=1), answer_step("done", step=2)]
    frozen = policy(version="v9", rules=[{"name": "frozen", "tool": "pay", "decide": "refuse", "reason": "frozen"}])

    sink = MemorySink()
    turn = request("pay", agent_=turns_agent(tools=["pay"])).model_copy(update={"policy": frozen})
    await runtime(tmp_path, model=ReplayModel(steps, strict=False), registry=registry).run_turn(
        turn, sink, MemoryStore()
    )
    [called] = sink.of("tool_called")
    assert (called.ok, called.error_class, called.policy) == (False, "refused_by_policy", "refuse:frozen")

    sink = MemorySink()
    plain = request("pay", agent_=turns_agent(tools=["pay"]), run_id="run-2")  # no request policy: the agent's own
    await runtime(tmp_path, model=ReplayModel(steps, strict=False), registry=registry).run_turn(
        plain, sink, MemoryStore()
    )
    [called] = sink.of("tool_called")
    assert (called.ok, called.policy) == (True, "allow:default:write")
    assert [r["amount"] for r in runs] == [5.0]
