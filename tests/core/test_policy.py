"""Policy outside the model: rules, precedence, defaults per built-in tool, versions, modes, grants, deciders."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from switchboard.cli.checks import config_problems
from switchboard.core.agent.config import Agent, AgentPolicy
from switchboard.core.agent.slots import SLOT_TOOLS
from switchboard.core.approvals.grants import may_decide, permissions_for, policy_problems, resolve_policy
from switchboard.core.approvals.policy import Policy, PolicyConfig, Rule, granted
from switchboard.core.approvals.records import ApprovalRecord
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.builtin.channel import TOOLS as CHANNEL_TOOLS
from switchboard.core.tools.builtin.files import TOOLS as FILE_TOOLS
from switchboard.core.tools.builtin.skills import skill_tools
from switchboard.core.tools.definition import Tool
from switchboard.errors import ConfigError
from switchboard.settings import FileConfig, Settings, load_file
from tests.core.turns import make_tool, noop


class Payment(BaseModel):
    amount: float
    to: dict[str, str] = {}
    memo: str = ""


PAY = make_tool("pay_invoice", noop, input=Payment, side_effect="write", risk="medium", reversible=False)
NOTE = make_tool("note", noop, side_effect="write", risk="low")
LOOK = make_tool("look", noop, side_effect="read")


def block(**body: Any) -> PolicyConfig:
    return PolicyConfig.model_validate(body)


def decide(policy: Policy, tool: Tool, args: dict[str, Any], actor: str = "telegram:42", **kw: Any) -> str:
    found = policy.decide(tool, args, actor=actor, **kw)
    return f"{found.decision}:{found.rule}"


# ------------------------------------------------------------------ defaults


def test_defaults_allow_reads_and_low_writes_and_ask_for_risky_irreversible_writes() -> None:
    policy = Policy()
    assert decide(policy, LOOK, {}) == "allow:default:read"
    assert decide(policy, NOTE, {}) == "allow:default:write"
    assert decide(policy, PAY, {"amount": 1}) == "approve:default:risky_write"
    high = make_tool("wipe", noop, side_effect="write", risk="high")  # high risk: asked even if reversible
    assert decide(policy, high, {}) == "approve:default:risky_write"
    reversible = make_tool("edit", noop, side_effect="write", risk="medium")
    assert decide(policy, reversible, {}) == "allow:default:write"
    assert decide(policy, reversible, {}, untrusted=True) == "approve:default:untrusted"  # after a document
    assert decide(policy, NOTE, {}, untrusted=True) == "allow:default:write"  # low risk stays automatic


def test_a_clean_turns_normal_use_of_the_built_in_tools_is_not_gated() -> None:
    tools = [*CHANNEL_TOOLS, *FILE_TOOLS, *SLOT_TOOLS, *skill_tools(), *default_registry()]
    args: dict[str, dict[str, Any]] = {
        "send_file": {"path": "a.txt"},
        "offer_choice": {"question": "Which?", "options": ["a", "b"]},
        "write_file": {"path": "a.txt", "content": "x"},
        "use_skill": {"name": "pdf"},
    }
    for tool in tools:
        given = args.get(tool.name, {})
        assert Policy().decide(tool, given, actor="web:s").decision == "allow", tool.name
    after_document = {t.name: Policy().decide(t, args.get(t.name, {}), actor="web:s", untrusted=True) for t in tools}
    gated = sorted(name for name, found in after_document.items() if found.decision != "allow")
    # what reaches the user (now, or later as a scheduled job), or hands them to another agent, waits for approval
    # after untrusted content
    assert gated == ["generate_image", "handoff", "offer_choice", "schedule_message", "schedule_turn", "send_file"]


def test_untrusted_effects_allow_keeps_allowing_and_refuse_refuses() -> None:
    send = next(t for t in CHANNEL_TOOLS if t.name == "send_file")
    allow = Policy.of(("agent:a", block(untrusted_effects="allow")))
    refuse = Policy.of(("agent:a", block(untrusted_effects="refuse")))
    assert decide(allow, send, {"path": "a"}, untrusted=True) == "allow:default:write"
    assert decide(refuse, send, {"path": "a"}, untrusted=True) == "refuse:default:untrusted"


# ------------------------------------------------------------------ rules


def test_argument_conditions_compare_normalised_fields() -> None:
    rules = [
        {"name": "big", "tool": "pay_*", "when": [{"field": "amount", "gt": 100}], "decide": "approve"},
        {"name": "own", "tool": "pay_*", "when": [{"field": "to.iban", "matches": "^DE"}], "decide": "allow"},
        {"name": "blocked", "tool": "pay_*", "when": [{"field": "memo", "in": ["bribe", "gift"]}], "decide": "refuse"},
    ]
    policy = Policy.of(("agent:a", block(rules=rules)))
    assert decide(policy, PAY, {"amount": 100.5, "to": {"iban": "DE1"}}) == "approve:big"  # first match wins
    assert decide(policy, PAY, {"amount": 100, "to": {"iban": "DE1"}}) == "allow:own"  # gt is strict
    assert decide(policy, PAY, {"amount": 5, "to": {"iban": "FR1"}, "memo": "gift"}) == "refuse:blocked"
    assert decide(policy, PAY, {"amount": 5, "to": {}}) == "approve:default:risky_write"  # a missing field: no match
    assert decide(policy, PAY, {"amount": "250"}) == "approve:big"  # a numeric string compares as a number


def test_rules_match_actor_side_effect_risk_and_reversibility() -> None:
    rules = [
        {"name": "boss", "actor": ["slack:U1", "console:*"], "decide": "allow"},
        {"name": "irreversible", "side_effect": "write", "reversible": False, "decide": "refuse"},
        {"name": "risky", "risk": "low", "side_effect": "write", "decide": "approve"},
    ]
    policy = Policy.of(("agent:a", block(rules=rules)))
    assert decide(policy, PAY, {"amount": 1}, actor="slack:U1") == "allow:boss"
    assert decide(policy, PAY, {"amount": 1}, actor="console:alice") == "allow:boss"
    assert decide(policy, PAY, {"amount": 1}, actor="slack:U2") == "refuse:irreversible"
    assert decide(policy, NOTE, {}, actor="slack:U2") == "approve:risky"
    assert decide(policy, LOOK, {}, actor="slack:U2") == "allow:default:read"


def test_an_allow_rule_does_not_open_the_untrusted_gate_unless_it_says_so() -> None:
    send = next(t for t in CHANNEL_TOOLS if t.name == "send_file")
    plain = Policy.of(("agent:a", block(rules=[{"name": "sends", "tool": "send_file", "decide": "allow"}])))
    explicit = Policy.of(
        ("agent:a", block(rules=[{"name": "s", "tool": "send_file", "untrusted": True, "decide": "allow"}]))
    )
    assert decide(plain, send, {"path": "a"}) == "allow:sends"
    assert decide(plain, send, {"path": "a"}, untrusted=True) == "approve:default:untrusted"
    assert decide(explicit, send, {"path": "a"}, untrusted=True) == "allow:s"
    assert decide(explicit, send, {"path": "a"}) == "allow:default:write"  # `untrusted: true` matches only then


def test_agent_rules_come_before_channel_rules_before_tenant_rules() -> None:
    config = FileConfig.model_validate(
        {
            "agents": {
                "a": {"name": "a", "policy": {"rules": [{"name": "agent", "tool": "pay_*", "decide": "allow"}]}},
                "b": {"name": "b"},
            },
            "channels": {
                "slack": {
                    "policy": {"mode": "observe", "rules": [{"name": "chan", "tool": "pay_*", "decide": "refuse"}]}
                }
            },
            "tenants": {
                "acme": {"policy": {"mode": "review", "rules": [{"name": "ten", "tool": "*", "decide": "approve"}]}}
            },
        }
    )
    a = resolve_policy(config, tenant="acme", agent="a", channel="slack")
    b = resolve_policy(config, tenant="acme", agent="b", channel="slack")
    b_web = resolve_policy(config, tenant="acme", agent="b", channel="web")
    assert decide(a, PAY, {"amount": 1}) == "allow:agent"
    assert decide(b, PAY, {"amount": 1}) == "refuse:chan"
    assert decide(b_web, PAY, {"amount": 1}) == "approve:ten"
    assert (a.mode, b.mode, b_web.mode) == ("observe", "observe", "review")  # the most specific block that sets it


def test_observe_mode_lets_would_be_approvals_run_and_records_them_but_refusals_stand() -> None:
    rules = [{"name": "no-wipe", "tool": "wipe", "decide": "refuse"}]
    policy = Policy.of(("agent:a", block(mode="observe", rules=rules)))
    found = policy.decide(PAY, {"amount": 1}, actor="web:s")
    assert (found.decision, found.observed, found.label) == ("allow", True, "observe:default:risky_write")
    wipe = make_tool("wipe", noop, side_effect="write", risk="high")
    assert policy.decide(wipe, {}, actor="web:s").label == "refuse:no-wipe"
    assert Policy().decide(PAY, {"amount": 1}, actor="web:s").label == "approve:default:risky_write"


def test_the_version_changes_with_the_rules_and_carries_the_label() -> None:
    one = Policy.of(("agent:a", block(rules=[{"tool": "pay_*", "decide": "approve"}])))
    same = Policy.of(("agent:a", block(rules=[{"tool": "pay_*", "decide": "approve"}])))
    changed = Policy.of(("agent:a", block(rules=[{"tool": "pay_*", "decide": "refuse"}])))
    labelled = Policy.of(("agent:a", block(version="v3", rules=[{"tool": "pay_*", "decide": "approve"}])))
    assert one.version == same.version
    assert changed.version != one.version
    assert labelled.version.startswith("v3:") and labelled.version != one.version
    assert Policy.of(("agent:a", block(mode="observe"))).version != Policy().version  # the mode is part of it


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"rules": [{"tool": "x", "decide": "maybe"}]}, "decide"),
        ({"rules": [{"tool": "x", "decide": "allow", "colour": "red"}]}, "colour"),
        ({"rules": [{"tool": "x", "decide": "allow", "when": [{"field": "amount"}]}]}, "tests nothing"),
        ({"rules": [{"tool": "x", "decide": "allow", "when": [{"field": "a", "matches": "("}]}]}, "regular expression"),
        ({"mode": "yolo"}, "mode"),
        ({"approvals": {"approvers": ["bob"]}}, "unknown approver 'bob'"),
        ({"approvals": {"expire_after_s": 0}}, "expire_after_s"),
        ({"grants": {"bob": ["x"]}}, "is not a principal"),
    ],
)
def test_a_bad_policy_is_refused_with_what_to_fix(tmp_path: Path, body: dict[str, Any], words: str) -> None:
    config = tmp_path / "switchboard.yaml"
    import yaml

    config.write_text(yaml.safe_dump({"agents": {"assistant": {"policy": body}}}))
    with pytest.raises(ConfigError, match=r"agents\.assistant\.policy") as raised:
        load_file(config)
    assert words in str(raised.value)


def test_switchboard_check_reports_rules_that_match_no_tool_and_admins_missing(tmp_path: Path) -> None:
    config = FileConfig.model_validate(
        {
            "agents": {
                "a": {
                    "name": "a",
                    "tools": ["send_file"],
                    "policy": {"rules": [{"tool": "pay_*", "decide": "approve"}]},
                }
            },
            "channels": {"slack": {"policy": {"approvals": {"approvers": ["admins"]}}, "admins": ["bob"]}},
        }
    )
    problems = policy_problems(config, default_registry().names())
    assert any("agents.a.policy.rules[0]" in p and "'pay_*' matches none of send_file" in p for p in problems)
    assert any("channels.slack.admins: 'bob' is not a principal" in p for p in problems)
    settings = Settings(file=config)
    assert set(problems) <= set(config_problems(settings))  # `switchboard check` lists them
    fine = FileConfig.model_validate(
        {"channels": {"slack": {"policy": {"approvals": {"approvers": ["admins"]}}, "admins": ["slack:U1"]}}}
    )
    assert policy_problems(fine, default_registry().names()) == []


def test_the_agent_policy_block_is_the_policy_config() -> None:
    agent = Agent.model_validate({"name": "a", "policy": {"untrusted_effects": "allow", "mode": "review"}})
    assert isinstance(agent.policy, PolicyConfig) and AgentPolicy is PolicyConfig
    assert Rule.model_validate({"decide": "allow", "risk": "high"}).risk == ["high"]


# ------------------------------------------------------------------ grants and deciders


def test_grants_give_principals_permissions_from_tenant_agent_and_channel() -> None:
    config = FileConfig.model_validate(
        {
            "agents": {"a": {"name": "a", "policy": {"grants": {"slack:U1": ["payments.*"], "*": ["files.read"]}}}},
            "channels": {"slack": {"policy": {"grants": {"slack:*": ["slack.post"]}}}},
            "tenants": {"acme": {"policy": {"grants": {"telegram:42": ["crm.write"]}}}},
        }
    )
    assert permissions_for(config, "acme", "a", "slack:U1") == {"payments.*", "files.read", "slack.post"}
    assert permissions_for(config, "acme", "a", "telegram:42") == {"files.read", "crm.write"}
    assert permissions_for(config, "other", "a", "telegram:42") == {"files.read"}  # another tenant's grants: none
    assert permissions_for(config, "acme", "nobody", "web:s") == frozenset()
    assert granted("payments.send", {"payments.*"}) and not granted("payments.send", {"payment"})


def record(approvers: tuple[str, ...], requested_by: str = "telegram:42") -> ApprovalRecord:
    now = time.time()
    return ApprovalRecord(
        id="abcdefgh",
        session="t/a/telegram/default/c",
        tenant="t",
        agent="a",
        channel="telegram",
        run_id="run-1",
        requested_by=requested_by,
        requested_at=now,
        expires_at=now + 60,
        state_sha256="0" * 64,
        approvers=approvers,
    )


def test_may_decide_counts_only_the_records_approvers() -> None:
    default = record(Policy().approvers())
    assert Policy().approvers() == ("requester", "operators")
    assert may_decide(default, "telegram:42") and may_decide(default, "console:alice", "deny")
    assert not may_decide(default, "telegram:43")  # another user of the group
    assert not may_decide(default, "switchboard")  # the gateway only expires
    assert may_decide(default, "switchboard", "expire") and not may_decide(default, "telegram:42", "expire")

    admins = Policy.of(
        ("channel:telegram", block(approvals={"approvers": ["admins", "console:bob"]})), admins=["telegram:7"]
    )
    named = record(admins.approvers())
    assert named.approvers == ("telegram:7", "console:bob")
    assert may_decide(named, "telegram:7") and may_decide(named, "console:bob")
    assert not may_decide(named, "telegram:42")  # the requester is not among them here
    assert not may_decide(named, "console:alice")
    assert (
        admins.approvals.expire_after_s == 3600
        and Policy.of(("agent:a", block(approvals={"expire_after_s": 60}))).approvals.expire_after_s == 60
    )


def test_the_policy_of_a_config_file_with_every_block(tmp_path: Path) -> None:
    config = tmp_path / "switchboard.yaml"
    config.write_text(
        """
agents:
  assistant:
    tools: [send_file]
    policy:
      version: "2026-12"
      mode: confirm
      rules:
        - name: big-payments
          tool: "pay_*"
          when: [{field: amount, gt: 100}]
          decide: approve
          reason: payments over 100 need a person
      approvals: {expire_after_s: 600, approvers: [requester, operators, admins]}
      grants: {"telegram:42": ["payments.*"]}
channels:
  telegram:
    admins: ["telegram:7"]
    policy: {mode: observe}
tenants:
  default:
    policy:
      rules: [{tool: "*", side_effect: write, risk: [high], decide: refuse, reason: not here}]
"""
    )
    loaded = load_file(config)
    policy = resolve_policy(loaded, tenant="default", agent="assistant", channel="telegram")
    assert policy.version.startswith("2026-12:") and policy.mode == "confirm"
    assert policy.approvers() == ("requester", "operators", "telegram:7")
    assert decide(policy, PAY, {"amount": 101}) == "approve:big-payments"
    assert permissions_for(loaded, "default", "assistant", "telegram:42") == {"payments.*"}
    with pytest.raises(ValidationError):
        PolicyConfig.model_validate({"rules": [{"decide": "allow", "when": [{"field": "a", "between": [1, 2]}]}]})


def test_rules_on_an_agents_mcp_tools_match_them() -> None:
    config = FileConfig.model_validate(
        {
            "mcp_servers": {
                "email": {"transport": "stdio", "command": ["python"]},
                "calc": {"transport": "stdio", "command": ["python"]},
            },
            "agents": {
                "a": {
                    "name": "a",
                    "tools": [],
                    "mcp": ["email", {"server": "calc", "tools": ["add"]}],
                    "policy": {
                        "rules": [
                            {"tool": "email__*", "decide": "approve"},  # every tool of a server offered whole
                            {"tool": "email__send_mail", "decide": "approve"},
                            {"tool": "calc__add", "decide": "allow"},
                            {"tool": "calc__delete", "decide": "allow"},  # not in the agent's allowlist
                            {"tool": "other__x", "decide": "allow"},
                        ]
                    },
                }
            },
        }
    )
    problems = policy_problems(config, default_registry().names())
    assert [p.split(" ", 1)[0] for p in problems] == ["agents.a.policy.rules[3]", "agents.a.policy.rules[4]"]
