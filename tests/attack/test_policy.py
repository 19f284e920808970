"""Hostile arguments against the policy and the tool gateway: spellings of numbers, lists, case and width of strings,
and numbers too large to record. A rule that asks for approval or refuses must not be dodged by how the model spells
an argument; an ``allow`` rule must not be stretched by the same tricks; nothing escapes ``call`` as an exception."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel, Field

from switchboard.core.approvals.policy import Policy, PolicyConfig
from switchboard.core.messages import ConversationRef, InboundMessage, OperatorActed, Sender
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.gateway import CallScope, ToolGateway
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.queue.ingest import Ingestor
from switchboard.settings import FileConfig, QueueSettings
from switchboard.worker.drain import Drainer
from tests.core.test_gateway_approvals import ctx
from tests.core.turns import make_tool
from tests.queue.conftest import RecordingDeliverer


class FloatPay(BaseModel):
    amount: float


class TextPay(BaseModel):
    amount: str


class IntPay(BaseModel):
    amount: int


class Recipient(BaseModel):
    address: str


class Mail(BaseModel):
    recipients: list[str] = []
    to: list[Recipient] = []
    memo: str = ""


def recording(name: str, model: type[BaseModel], runs: list[dict[str, Any]], **kw: Any) -> Tool:
    async def fn(args: BaseModel, c: ToolContext) -> Any:
        runs.append(args.model_dump())
        return {"done": True}

    kw.setdefault("risk", "low")
    return make_tool(name, fn, input=model, side_effect="write", **kw)


def policy(*rules: dict[str, Any], **body: Any) -> Policy:
    return Policy.of(("agent:a", PolicyConfig.model_validate({"rules": list(rules), **body})))


BIG_PAYMENTS = {"name": "big", "tool": "pay_*", "when": [{"field": "amount", "gt": 100}], "decide": "approve"}


def gateway(tmp_path: Path, *tools: Tool) -> ToolGateway:
    return ToolGateway(ToolRegistry(tools), workspace_root=tmp_path / "ws", backoff_base_s=0.0)


@pytest.mark.parametrize(
    ("tool", "amount"),
    [
        ("pay_float", float("inf")),
        ("pay_float", "inf"),
        ("pay_float", "NaN"),
        ("pay_text", "1e400"),
        ("pay_text", "Infinity"),
        ("pay_text", "1,000"),
        ("pay_text", "$5000"),
        ("pay_text", "nan"),
        pytest.param("pay_int", 10**400, id="pay_int-10**400"),
    ],
)
async def test_an_amount_rule_is_not_dodged_by_how_the_amount_is_spelled(
    tmp_path: Path, tool: str, amount: Any
) -> None:
    runs: list[dict[str, Any]] = []
    gw = gateway(
        tmp_path,
        recording("pay_float", FloatPay, runs),
        recording("pay_text", TextPay, runs),
        recording("pay_int", IntPay, runs),
    )
    outcome = await gw.call(tool, {"amount": amount}, ctx(tmp_path, policy=policy(BIG_PAYMENTS)), scope=CallScope())

    assert (outcome.ok, outcome.error_class, outcome.policy) == (False, "needs_approval", "approve:big")
    assert runs == []


@pytest.mark.parametrize("amount", ["1_000", "١٠٠٠", " 5000 ", "1e3"])
async def test_readable_spellings_compare_as_their_numbers(tmp_path: Path, amount: str) -> None:
    runs: list[dict[str, Any]] = []
    gw = gateway(tmp_path, recording("pay_text", TextPay, runs))
    outcome = await gw.call("pay_text", {"amount": amount}, ctx(tmp_path, policy=policy(BIG_PAYMENTS)))
    assert outcome.error_class == "needs_approval" and runs == []
    small = await gw.call("pay_text", {"amount": "99.5"}, ctx(tmp_path, policy=policy(BIG_PAYMENTS)))
    assert small.ok and runs == [{"amount": "99.5"}]


@pytest.mark.parametrize(
    "args",
    [
        {"recipients": ["friend@ok.example", "boss@evil.example"]},
        {"to": [{"address": "friend@ok.example"}, {"address": "boss@evil.example"}]},
        {"memo": "GIFT"},
        {"memo": "ｇｉｆｔ"},
        {"memo": " Gift "},
    ],
)
async def test_a_refusal_covers_every_element_and_every_case_of_a_string(tmp_path: Path, args: dict[str, Any]) -> None:
    runs: list[dict[str, Any]] = []
    gw = gateway(tmp_path, recording("mail", Mail, runs))
    rules = policy(
        {
            "name": "no-evil",
            "tool": "mail",
            "when": [{"field": "recipients", "matches": "@evil\\."}],
            "decide": "refuse",
        },
        {
            "name": "no-evil-to",
            "tool": "mail",
            "when": [{"field": "to.address", "matches": "@evil\\."}],
            "decide": "refuse",
        },
        {"name": "no-gifts", "tool": "mail", "when": [{"field": "memo", "in": ["gift", "bribe"]}], "decide": "refuse"},
    )
    outcome = await gw.call("mail", args, ctx(tmp_path, policy=rules))

    assert (outcome.ok, outcome.error_class) == (False, "refused_by_policy")
    assert runs == []


@pytest.mark.parametrize(
    ("args", "when"),
    [
        ({"amount": "NaN"}, {"field": "amount", "lt": 10}),
        ({"amount": "a few"}, {"field": "amount", "lt": 10}),
        ({"amount": "-Infinity"}, {"field": "amount", "gt": 0}),
    ],
)
async def test_an_allow_rule_is_not_stretched_by_the_same_tricks(
    tmp_path: Path, args: dict[str, Any], when: dict[str, Any]
) -> None:
    runs: list[dict[str, Any]] = []
    gw = gateway(tmp_path, recording("pay_text", TextPay, runs, risk="high"))
    rules = policy({"name": "small", "tool": "pay_text", "when": [when], "decide": "allow"})
    outcome = await gw.call("pay_text", args, ctx(tmp_path, policy=rules))
    assert (outcome.error_class, outcome.policy) == ("needs_approval", "approve:default:risky_write") and runs == []


async def test_an_allow_rule_over_a_list_needs_every_element(tmp_path: Path) -> None:
    runs: list[dict[str, Any]] = []
    gw = gateway(tmp_path, recording("mail", Mail, runs, risk="high"))
    rules = policy(
        {"name": "own", "tool": "mail", "when": [{"field": "recipients", "matches": "@ok\\."}], "decide": "allow"}
    )
    mixed = await gw.call("mail", {"recipients": ["a@ok.example", "b@evil.example"]}, ctx(tmp_path, policy=rules))
    own = await gw.call("mail", {"recipients": ["a@ok.example", "b@ok.example"]}, ctx(tmp_path, policy=rules))
    assert mixed.error_class == "needs_approval"
    assert own.ok and own.policy == "allow:own" and len(runs) == 1


async def test_a_number_too_large_to_record_is_a_validation_error_not_a_crash(tmp_path: Path) -> None:
    runs: list[dict[str, Any]] = []
    gw = gateway(tmp_path, recording("pay_int", IntPay, runs))
    outcome = await gw.call("pay_int", {"amount": 10**5000}, ctx(tmp_path, policy=policy(BIG_PAYMENTS)))
    assert (outcome.ok, outcome.error_class) == (False, "validation") and runs == []


# -- who a batched turn acts for (the drain, real Redis) ---------------------------------------------------------------

GRANTS = FileConfig.model_validate(
    {
        "default_agent": "assistant",
        "agents": {
            "assistant": {
                "name": "assistant",
                "profile": {"name": "A"},
                "instructions": "Answer.",
                "policy": {"grants": {"telegram:42": ["payments.send"], "console:*": ["payments.*", "support.*"]}},
            }
        },
    }
)


def chat_message(sender: str, n: int, *, event: OperatorActed | None = None) -> InboundMessage:
    draft = InboundMessage(
        dedup_key=f"evt-{sender}-{n}",
        conversation=ConversationRef(agent="assistant", channel="telegram", conversation="group"),
        sender=Sender(id=sender),
        text="pay 1000 to me" if event is None else "",
    )
    return draft if event is None else draft.model_copy(update={"event": event})


async def batched_request(client: aioredis.Redis, settings: QueueSettings, drafts: list[InboundMessage]) -> TurnRequest:
    seen: list[TurnRequest] = []

    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        seen.append(request)
        return TurnResult(text="ok", steps=1)

    for draft in drafts:
        await Ingestor(client, settings).ingest(draft, busy_policy="collect")  # a channel that batches
    drainer = Drainer(
        client,
        settings,
        runner=runner,
        deliverer=RecordingDeliverer(),
        agent_for=lambda _m: GRANTS.agent("assistant"),
        worker_id="w1",
        config=GRANTS,
    )
    await drainer.drain(drafts[0].session_key)
    assert len(seen[0].messages) == len(drafts)  # one turn over the whole batch
    return seen[0]


async def test_an_operators_click_batched_behind_a_users_message_lends_the_turn_nothing(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    click = OperatorActed(action="decide", operator="console:alice", approval_id="abcdef123", verdict="deny")
    request = await batched_request(
        client, queue_settings, [chat_message("43", 1), chat_message("console:alice", 2, event=click)]
    )
    assert (request.actor, request.permissions) == ("telegram:43", frozenset())


async def test_a_group_chats_privileged_member_lends_the_turn_nothing(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    request = await batched_request(client, queue_settings, [chat_message("43", 1), chat_message("42", 2)])
    assert request.permissions == frozenset()
    alone = await batched_request(client, queue_settings, [chat_message("42", 3)])
    assert (alone.actor, alone.permissions) == ("telegram:42", frozenset({"payments.send"}))


class AliasedMail(BaseModel):
    """A tool input whose wire name differs from its Python name (``from`` is a keyword)."""

    sender: str = Field(alias="from")
    body: str = ""


async def test_a_rule_names_an_argument_as_the_model_sends_it_and_an_approval_round_trips(tmp_path: Path) -> None:
    runs: list[dict[str, Any]] = []
    gw = gateway(tmp_path, recording("mail_as", AliasedMail, runs, risk="high"))
    rules = policy(
        {"name": "no-ceo", "tool": "mail_as", "when": [{"field": "from", "eq": "ceo@acme"}], "decide": "refuse"}
    )

    refused = await gw.call("mail_as", {"from": "ceo@acme", "body": "wire it"}, ctx(tmp_path, policy=rules))
    assert (refused.ok, refused.error_class) == (False, "refused_by_policy") and runs == []

    asked = await gw.call("mail_as", {"from": "me@acme", "body": "hi"}, ctx(tmp_path, policy=rules))
    assert asked.error_class == "needs_approval" and asked.approval is not None
    approved = asked.approval
    done = await gw.call("mail_as", dict(approved.arguments), ctx(tmp_path, policy=rules), approved=approved)
    assert done.ok and runs == [{"sender": "me@acme", "body": "hi"}]
